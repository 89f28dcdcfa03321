//go:build !linux

package sockowner

import (
	"errors"
	"fmt"
	"net"
)

var errUnsupported = fmt.Errorf("sockowner: %w: who holds a socket is read from Linux's /proc", errors.ErrUnsupported)

// CheckListener would check who holds the sockets listening at addr; it
// is supported on Linux only.
func (o Owner) CheckListener(network, addr string) error { return errUnsupported }

// CheckConn would check who holds the server end of c; it is supported on
// Linux only.
func (o Owner) CheckConn(c net.Conn) error { return errUnsupported }

// Peer knows no peer credentials on this system.
func Peer(net.Conn) (Cred, bool) { return Cred{}, false }
