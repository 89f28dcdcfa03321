package httpapi

import (
	"net"

	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sockowner"
)

// peerOf reads a Unix socket peer's credentials (SO_PEERCRED): the
// process that connected, as the kernel saw it at connect time. Elsewhere
// it knows none, and sigils' uids and gids are not checked.
func peerOf(c net.Conn) (sigils.Peer, bool) {
	cred, ok := sockowner.Peer(c)
	return sigils.Peer{PID: cred.PID, UID: cred.UID, GID: cred.GID}, ok
}
