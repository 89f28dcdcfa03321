package httpapi

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
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
	spare chan struct{} // places past the cap, for health checks only (serveCapped)
	wait  chan struct{} // requests past the cap waiting for a place, off the spare places
	done  chan struct{}
	once  sync.Once
	evict bool // connection states are reported (serveCapped): idle ones may be closed at the cap

	mu    sync.Mutex            // guards conns and each capConn's state, since and authed
	conns map[*capConn]struct{} // the open connections

	maxUnauth int // connections not yet authenticated held at most (0: no bound)
}

// newConnGrace is how long a new connection may stay silent before it
// may be closed to make room: its request is usually on its way.
// idleGrace is how long a kept-alive connection must have been idle: a
// client that just got its answer often sends its next request at once.
// unauthGrace is how long a new connection has to send a request that
// passes authentication before, past maxUnauth such connections, it may
// be closed.
const (
	newConnGrace = time.Second
	idleGrace    = 250 * time.Millisecond
	unauthGrace  = 50 * time.Millisecond
	retryEvery   = 20 * time.Millisecond // at the cap, how often to look again for a place to free
)

func capConnections(l net.Listener, n int) *capListener {
	return &capListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{}), conns: map[*capConn]struct{}{}}
}

// spareConns is how many connections past the cap a served listener
// takes while every place is held by a request in progress: each may ask
// for health (GET /v1/health) and nothing else, and is closed after it.
// So health is answered whatever holds the places.
const spareConns = 8

// spareWait is how long a request other than health, on a spare place,
// waits for a place of its own before it is refused.
const spareWait = 30 * time.Second

// waiters is how many requests past the cap may wait for a place at
// once; more are refused at once.
const waiters = 64

// promote moves cc from a spare place to a place of its own once one is
// free, waiting at most wait (or until ctx ends) without holding the
// spare place; false if none freed (cc then holds no place at all).
func (l *capListener) promote(ctx context.Context, cc *capConn, wait time.Duration) bool {
	select {
	case l.wait <- struct{}{}:
		defer func() { <-l.wait }()
	default:
		return false
	}
	l.mu.Lock()
	cc.spare, cc.waiting = false, true
	l.mu.Unlock()
	<-l.spare // the spare place goes to the next health check
	t := time.NewTimer(wait)
	defer t.Stop()
	retry := time.NewTicker(retryEvery)
	defer retry.Stop()
	for {
		select {
		case l.sem <- struct{}{}:
			l.mu.Lock()
			cc.waiting = false
			l.mu.Unlock()
			return true
		default:
		}
		if v := l.idlest(time.Now()); v != nil {
			v.Close()
			continue
		}
		select {
		case <-retry.C:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		case <-l.done:
			return false
		}
	}
}

// isSpare reports whether cc holds a spare place.
func (c *capConn) isSpare() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.spare
}

// serveCapped serves srv on l, holding at most n connections, and closes
// idle connections first when a new one arrives at the cap (srv's
// ConnState reports each connection's state to the listener).
func serveCapped(srv *http.Server, l net.Listener, n, maxUnauth int) error {
	cl := capConnections(l, n)
	cl.evict, cl.maxUnauth, cl.spare, cl.wait = true, maxUnauth, make(chan struct{}, spareConns), make(chan struct{}, waiters)
	next0 := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cc, ok := r.Context().Value(capConnKey{}).(*capConn); ok && cc.isSpare() && r.URL.Path != "/v1/health" {
			// Anything but health waits for a place of its own, for a
			// while, and is refused with why if none frees.
			if !cl.promote(r.Context(), cc, spareWait) {
				w.Header().Set("Connection", "close")
				writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnavailable, "every one of this listener's %d places (daemon.max_connections) was held by a request in progress for %v; only health is answered past them: try again", n, spareWait))
				return
			}
		}
		if cc, ok := r.Context().Value(capConnKey{}).(*capConn); ok && cc.isSpare() {
			w.Header().Set("Connection", "close")
		}
		next0.ServeHTTP(w, r)
	})
	ctxOf := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if ctxOf != nil {
			ctx = ctxOf(ctx, c)
		}
		if cc, ok := c.(*capConn); ok {
			ctx = context.WithValue(ctx, capConnKey{}, cc)
		}
		return ctx
	}
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
	spare, ok := l.place()
	if !ok {
		c.Close()
		return nil, net.ErrClosed
	}
	now := time.Now()
	cc := &capConn{Conn: c, l: l, state: http.StateNew, since: now, born: now, spare: spare}
	l.mu.Lock()
	l.conns[cc] = struct{}{}
	var excess *capConn
	if l.maxUnauth > 0 {
		n := 0
		for c := range l.conns {
			if !c.authed {
				n++
				if now.Sub(c.born) >= unauthGrace && (excess == nil || c.born.Before(excess.born)) {
					excess = c
				}
			}
		}
		if n <= l.maxUnauth {
			excess = nil
		}
	}
	l.mu.Unlock()
	if excess != nil {
		excess.Close()
	}
	return cc, nil
}

// capConnKey is the context key of a request's capConn.
type capConnKey struct{}

// connAuthenticated marks the connection of r as one whose request passed
// authentication: it holds its place as any other from now on.
func connAuthenticated(r *http.Request) {
	cc, ok := r.Context().Value(capConnKey{}).(*capConn)
	if !ok {
		return
	}
	cc.l.mu.Lock()
	cc.authed = true
	cc.l.mu.Unlock()
}

// place takes a place for a new connection, making one if it can, or a
// spare place past the cap (spare) where there are such; false if the
// listener closed first.
func (l *capListener) place() (spare, ok bool) {
	var retry <-chan time.Time // states reported: look again for one gone idle
	for {
		select {
		case l.sem <- struct{}{}:
			return false, true
		default:
		}
		if v := l.idlest(time.Now()); v != nil {
			v.Close() // gives its place back
			continue
		}
		if l.spare != nil && l.allBusy() {
			select {
			case l.spare <- struct{}{}:
				return true, true
			default:
			}
			// Spare places held by connections that have not asked for
			// health in unauthGrace (headers that never end) are given
			// to a new one.
			if v := l.staleSpare(time.Now()); v != nil {
				v.Close()
				continue
			}
		}
		if l.evict {
			retry = time.After(retryEvery)
		}
		select {
		case l.sem <- struct{}{}:
			return false, true
		case <-l.done:
			return false, false
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
		if c.spare || c.waiting {
			continue // closing it frees no place
		}
		switch {
		case c.state == http.StateIdle && now.Sub(c.since) >= idleGrace:
		case c.state == http.StateNew && now.Sub(c.since) >= newConnGrace:
		case !c.authed && l.maxUnauth > 0 && c.state != http.StateHijacked && now.Sub(c.born) >= unauthGrace:
		default:
			continue
		}
		if best == nil || c.since.Before(best.since) {
			best = c
		}
	}
	return best
}

// staleSpare is the oldest connection on a spare place that has been
// there for unauthGrace (a health check takes far less), or nil.
func (l *capListener) staleSpare(now time.Time) *capConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *capConn
	for c := range l.conns {
		if c.spare && now.Sub(c.born) >= unauthGrace && (best == nil || c.born.Before(best.born)) {
			best = c
		}
	}
	return best
}

// allBusy reports whether every place is held by a request in progress
// that will not be closed to make room (so none will free up soon).
func (l *capListener) allBusy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.conns {
		if c.spare || c.waiting {
			continue
		}
		if c.state != http.StateActive && c.state != http.StateHijacked || !c.authed && l.maxUnauth > 0 {
			return false
		}
	}
	return true
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
	l      *capListener
	once   sync.Once
	state  http.ConnState // as the server last reported it; guarded by l.mu
	since  time.Time      // when it entered state; guarded by l.mu
	born   time.Time      // when it was accepted
	authed bool           // a request on it passed authentication; guarded by l.mu
	spare  bool           // it holds a spare place past the cap: health only
	// waiting: it holds no place, its request waiting for one (promote),
	// or refused after waiting.
	waiting bool
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		spare, waiting := c.spare, c.waiting
		c.l.mu.Unlock()
		switch {
		case waiting:
		case spare:
			<-c.l.spare
		default:
			<-c.l.sem
		}
	})
	return err
}

// Unwrap is the accepted connection.
func (c *capConn) Unwrap() net.Conn { return c.Conn }
