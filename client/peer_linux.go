package client

import (
	"net"
	"syscall"
)

// peerUID is the uid and pid of the process serving a Unix socket
// connection (SO_PEERCRED), as the kernel recorded them at listen time.
func peerUID(c net.Conn) (uid, pid int, ok bool) {
	uc, isUnix := c.(*net.UnixConn)
	if !isUnix {
		return 0, 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return 0, 0, false
	}
	return int(cred.Uid), int(cred.Pid), true
}
