package httpapi

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// capListener holds at most n connections at once, so a flood of
// connections cannot exhaust the daemon's descriptors. At the cap, a new
// connection waits until one closes; if the listener is served by
// serveCapped, which tells it each connection's state, it makes room at
// once by closing the connection that has waited longest without a
// request in progress: kept alive between requests (idle), or connected
// and not yet sending one for newConnGrace. So a thousand clients that
// connect and sit cannot keep out one that asks; only connections with a
// request in progress (a body being read, an answer streaming, a
// WebSocket) hold their places, and daemon.body_timeout bounds how long
// a body may take. Its connections unwrap to the listener's own (peerOf
// reads the socket's credentials).
type capListener struct {
	net.Listener
	sem   chan struct{} // one token per connection held
	done  chan struct{}
	once  sync.Once
	evict bool // connection states are reported (serveCapped): idle ones may be closed at the cap

	mu    sync.Mutex            // guards conns and each capConn's state and since
	conns map[*capConn]struct{} // the open connections
}

// newConnGrace is how long a new connection may stay silent before it
// may be closed to make room: its request is usually on its way.
// idleGrace is how long a kept-alive connection must have been idle: a
// client that just got its answer often sends its next request at once.
const (
	newConnGrace = time.Second
	idleGrace    = 250 * time.Millisecond
)

func capConnections(l net.Listener, n int) *capListener {
	return &capListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}), conns: map[*capConn]struct{}{}}
}

// serveCapped serves srv on l, holding at most n connections, and closes
// idle connections first when a new one arrives at the cap (srv's
// ConnState reports each connection's state to the listener).
func serveCapped(srv *http.Server, l net.Listener, n int) error {
	cl := capConnections(l, n)
	cl.evict = true
	next := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		cl.connState(c, s)
		if next != nil {
			next(c, s)
		}
	}
	return srv.Serve(cl)
}

// Accept takes the next connection, then a place for it: at the cap it
// closes the idlest connection, if there is one, or waits for one to
// close (or, states reported, to become idle).
func (l *capListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if !l.place() {
		c.Close()
		return nil, net.ErrClosed
	}
	cc := &capConn{Conn: c, l: l, state: http.StateNew, since: time.Now()}
	l.mu.Lock()
	l.conns[cc] = struct{}{}
	l.mu.Unlock()
	return cc, nil
}

// place takes a place for a new connection, making one if it can; false
// if the listener closed first.
func (l *capListener) place() bool {
	var retry <-chan time.Time // states reported: look again for one gone idle
	for {
		select {
		case l.sem <- struct{}{}:
			return true
		default:
		}
		if v := l.idlest(time.Now()); v != nil {
			v.Close() // gives its place back
			continue
		}
		if l.evict {
			retry = time.After(idleGrace / 2)
		}
		select {
		case l.sem <- struct{}{}:
			return true
		case <-l.done:
			return false
		case <-retry:
		}
	}
}

// idlest is the open connection that has gone longest without a request
// in progress: kept alive between requests (idle) for at least idleGrace,
// or connected and not yet sending one (new) for at least newConnGrace.
// Age decides, not state: an agent's pooled connection that went idle a
// moment ago is not closed before a flood's connection that has sat for
// a minute. nil if there is none or states are not reported.
func (l *capListener) idlest(now time.Time) *capConn {
	if !l.evict {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *capConn
	for c := range l.conns {
		switch {
		case c.state == http.StateIdle && now.Sub(c.since) >= idleGrace:
		case c.state == http.StateNew && now.Sub(c.since) >= newConnGrace:
		default:
			continue
		}
		if best == nil || c.since.Before(best.since) {
			best = c
		}
	}
	return best
}

// connState records a connection's state as the server reports it.
func (l *capListener) connState(c net.Conn, s http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	cc.state, cc.since = s, time.Now()
	l.mu.Unlock()
}

func (l *capListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// capConn frees its place when closed.
type capConn struct {
	net.Conn
	l     *capListener
	once  sync.Once
	state http.ConnState // as the server last reported it; guarded by l.mu
	since time.Time      // when it entered state; guarded by l.mu
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.sem
	})
	return err
}

// Unwrap is the accepted connection.
func (c *capConn) Unwrap() net.Conn { return c.Conn }
