package sockowner

import (
	"errors"
	"fmt"
)

// Errors callers branch on.
var (
	// ErrNotOwned: the socket is held by a process outside the owner.
	ErrNotOwned = errors.New("held by another process")
	// ErrNotListening: nothing listens at the address.
	ErrNotListening = errors.New("nothing listens")
)

// Owner is who must hold a server's socket: a process of process group
// PGID (the server started with its own group, and its children) running
// as UID.
type Owner struct {
	PGID int
	UID  int
}

func (o Owner) String() string {
	return fmt.Sprintf("process group %d of uid %d", o.PGID, o.UID)
}

// holder describes who holds a socket, for messages: the socket's user
// (-1: unknown) and the processes holding it that /proc shows.
func holder(uid int, pids []int) string {
	var s string
	switch len(pids) {
	case 0:
		s = "a process"
	case 1:
		s = fmt.Sprintf("pid %d", pids[0])
	default:
		s = fmt.Sprintf("pids %v", pids)
	}
	if uid >= 0 {
		s += fmt.Sprintf(" of uid %d", uid)
	}
	if len(pids) == 0 {
		s += " (its pid is not visible here)"
	}
	return s
}

// Cred is a process's credentials as a Unix socket reports them.
type Cred struct {
	PID, UID, GID int
}
