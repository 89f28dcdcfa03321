package daemon

import (
	"net"
	"syscall"

	"github.com/ctxd/ctxd/sigils"
)

// peerOf reads a Unix socket peer's credentials (SO_PEERCRED): the
// process that connected, as the kernel saw it at connect time.
func peerOf(c net.Conn) (sigils.Peer, bool) {
	for {
		w, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		c = w.Unwrap()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return sigils.Peer{}, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return sigils.Peer{}, false
	}
	var cred *syscall.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return sigils.Peer{}, false
	}
	return sigils.Peer{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid)}, true
}
