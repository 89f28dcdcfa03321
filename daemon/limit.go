package daemon

import (
	"net"
	"sync"
)

// capListener holds at most n connections at once: past that, Accept
// waits until one closes, so a flood of connections waits in the kernel's
// backlog instead of exhausting the daemon's descriptors. Its connections
// unwrap to the listener's own (peerOf reads the socket's credentials).
type capListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func capConnections(l net.Listener, n int) net.Listener {
	return &capListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *capListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &capConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *capListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// capConn frees its place when closed.
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Unwrap is the accepted connection.
func (c *capConn) Unwrap() net.Conn { return c.Conn }
