package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
)

// wsWriteTimeout bounds one message's write: a daemon that takes none for
// that long is not reading, and the connection ends.
const wsWriteTimeout = 30 * time.Second

// wsCancelWait bounds the wait for the daemon's last message of an ask
// after a cancel (it comes at once): a caller whose context ended is not
// held longer than that.
const wsCancelWait = 5 * time.Second

// wsReadLimit is the largest message the client reads (a summary is a few
// KiB; a token is a few bytes).
const wsReadLimit = 16 << 20

// Conn is a WebSocket session with the daemon (GET /v1/ws): one
// connection on which several asks run at once, each under its own id,
// and on which the daemon pushes notices. Its methods are safe for
// concurrent use.
//
// Messages are read by one goroutine and handed to the ask they belong
// to. An ask whose caller is slow to take its tokens holds up the others
// on the connection (and, past the daemon's write timeout, ends them):
// the connection is one ordered stream, and nothing is buffered without
// bound.
type Conn struct {
	ws      *websocket.Conn
	notices chan ctxd.WSMessage
	done    chan struct{} // closed when the reader has returned
	ids     atomic.Uint64

	mu   sync.Mutex          // guards asks, err
	asks map[string]*pending // running asks by id
	err  error               // why the connection ended; set before done closes
}

// pending is a running ask's queue of messages.
type pending struct {
	ch   chan ctxd.WSMessage
	gone chan struct{} // closed when Ask returned: nothing more is taken
}

// Connect opens a WebSocket session over the client's transport (the Unix
// socket, or the TCP listener with the client's token, which then
// authenticates every ask on the connection). ctx bounds the handshake
// only; Close ends the session.
func (c *Client) Connect(ctx context.Context) (*Conn, error) {
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	ws, resp, err := websocket.Dial(ctx, c.base+"/v1/ws", &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			var e struct {
				Error string    `json:"error"`
				Kind  ctxd.Kind `json:"kind"`
			}
			if resp.Body != nil {
				_ = json.NewDecoder(resp.Body).Decode(&e)
			}
			if e.Error == "" {
				e.Error = http.StatusText(resp.StatusCode)
			}
			return nil, &APIError{Status: resp.StatusCode, Kind: e.Kind, Message: e.Error}
		}
		return nil, fmt.Errorf("ctxd: cannot open a WebSocket session at %s (is `ctxd serve` running?): %w", c.socket, err)
	}
	ws.SetReadLimit(wsReadLimit)
	conn := &Conn{
		ws:      ws,
		notices: make(chan ctxd.WSMessage, 64),
		done:    make(chan struct{}),
		asks:    map[string]*pending{},
	}
	go conn.read()
	return conn, nil
}

// Notices yields the daemon's notices (codex reloaded, environment
// changed, a session's new epoch) and the errors that belong to no ask
// (a refused message). It is closed when the connection ends. Notices
// that arrive while 64 are waiting to be taken are dropped.
func (c *Conn) Notices() <-chan ctxd.WSMessage { return c.notices }

// Done is closed when the connection has ended; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended, or nil while it is open.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the session (a normal closure) and waits for its reader.
// Asks still running end with an error. Closing a session that already
// ended (Done is closed) is not an error.
func (c *Conn) Close() error {
	select {
	case <-c.done:
		_ = c.ws.CloseNow()
		return nil
	default:
	}
	err := c.ws.Close(websocket.StatusNormalClosure, "")
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Ask sends a query on the connection and calls onToken with each piece of
// the answer; it returns the summary that ends it. When ctx ends first, it
// asks the daemon to cancel and returns the daemon's answer to that (an
// *APIError of kind canceled, unless the ask ended another way first),
// wrapped with ctx's cause.
func (c *Conn) Ask(ctx context.Context, req ctxd.AskRequest, onToken func(string)) (*ctxd.Summary, error) {
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	id := strconv.FormatUint(c.ids.Add(1), 10)
	p := &pending{ch: make(chan ctxd.WSMessage, 16), gone: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.asks[id] = p
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.asks, id)
		c.mu.Unlock()
		close(p.gone)
	}()
	if err := c.send(ctxd.WSAskMessage(id, req)); err != nil {
		return nil, err
	}
	canceled, done := false, ctx.Done()
	var giveUp <-chan time.Time
	for {
		var m ctxd.WSMessage
		select {
		case m = <-p.ch:
		case <-done:
			// Nothing more for the caller; the daemon's last message
			// for the ask follows the cancel at once.
			canceled, done = true, nil
			_ = c.send(ctxd.WSMessage{Type: ctxd.WSCancel, ID: id}) // a failed write ends the connection
			t := time.NewTimer(wsCancelWait)
			defer t.Stop()
			giveUp = t.C
			continue
		case <-giveUp:
			return nil, fmt.Errorf("ctxd: ask %s: %w (the daemon did not confirm the cancel within %s)", id, context.Cause(ctx), wsCancelWait)
		case <-c.done:
			select { // the last message may have come just before the end
			case m = <-p.ch:
			default:
				return nil, c.Err()
			}
		}
		switch m.Type {
		case ctxd.WSToken:
			if onToken != nil && !canceled {
				onToken(m.Text)
			}
		case ctxd.WSSummary:
			return m.Summary, nil
		case ctxd.WSError:
			err := &APIError{Status: m.Status, Kind: m.Kind, Message: m.Error}
			if canceled {
				return nil, fmt.Errorf("%w: %w", context.Cause(ctx), err)
			}
			return nil, err
		}
	}
}

// send writes one message. The write is not bound to a caller's context:
// a write cut short by one would end the connection for every ask.
func (c *Conn) send(m ctxd.WSMessage) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("ctxd: encode %s message: %w", m.Type, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wsWriteTimeout)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, b); err != nil {
		if cerr := c.Err(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("ctxd: WebSocket write: %w", err)
	}
	return nil
}

// read hands each message to its ask, or to Notices, until the
// connection ends.
func (c *Conn) read() {
	defer close(c.done)
	defer close(c.notices)
	for {
		_, b, err := c.ws.Read(context.Background())
		if err != nil {
			c.fail(err)
			return
		}
		var m ctxd.WSMessage
		if err := json.Unmarshal(b, &m); err != nil {
			c.fail(fmt.Errorf("malformed message %.200q: %w", b, err))
			_ = c.ws.CloseNow()
			return
		}
		c.route(m)
	}
}

// route hands m to the ask it belongs to, waiting while that ask's queue
// is full (until the ask returns), or offers it to Notices.
func (c *Conn) route(m ctxd.WSMessage) {
	if m.ID != "" && m.Type != ctxd.WSNotice {
		c.mu.Lock()
		p, ok := c.asks[m.ID]
		c.mu.Unlock()
		if ok {
			select {
			case p.ch <- m:
			case <-p.gone:
			}
			return
		}
		if m.Type != ctxd.WSError {
			return // an ask the caller gave up on
		}
	}
	select {
	case c.notices <- m:
	default:
	}
}

// fail records why the connection ended.
func (c *Conn) fail(err error) {
	var out error
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure:
		out = fmt.Errorf("ctxd: the WebSocket session was closed: %w", err)
	case websocket.StatusGoingAway:
		out = &APIError{Status: http.StatusServiceUnavailable, Kind: ctxd.KindUnavailable, Message: "ctxd closed the WebSocket session: it is shutting down"}
	default:
		out = fmt.Errorf("ctxd: the WebSocket session ended: %w", err)
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = out
	}
	c.mu.Unlock()
}
