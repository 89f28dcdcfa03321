package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
)

// WebSocket sessions (GET /v1/ws): one long-lived connection per agent,
// on which it runs several asks at once, cancels them, and hears the
// daemon's notices. docs/websocket.md is the protocol.
//
// Each connection is served by its handler goroutine, which reads; one
// writer goroutine, the only one that writes data messages, fed by a
// small bounded queue; a pinger; a goroutine that waits for the daemon's
// stop; and one goroutine per running ask. All of them end, and are
// waited for, before the handler returns.

const (
	wsMaxAsks     = 8  // running asks per connection
	wsQueue       = 16 // messages waiting for the writer; a producer that finds it full waits
	wsRefusals    = 16 // errors for messages that started nothing, waiting for the writer; past that the connection ends
	wsNoticeQueue = 8  // notices waiting for one connection; more are dropped, and counted
	// wsCloseWait bounds the close handshake when the daemon stops: a peer
	// that does not answer the close frame in time is cut off.
	wsCloseWait = time.Second
	// defaultWSPing and defaultWSPingTimeout: how often a connection is
	// pinged, and how long the peer has to answer before it is dropped.
	defaultWSPing        = 15 * time.Second
	defaultWSPingTimeout = 10 * time.Second
	envPollInterval      = time.Second // how often the hub reads the environment bands
)

// hub fans the daemon's notices out to its WebSocket connections. Each
// connection has a bounded queue: one that does not keep up misses
// notices (the next one it gets says how many) rather than holding up the
// hub or the codex service that publishes.
type hub struct {
	sensor   ctxd.Sensor
	log      *slog.Logger
	stopping <-chan struct{} // closed when the daemon begins to shut down

	pingEvery   atomic.Int64 // time.Duration between pings; tests shorten it
	pingTimeout atomic.Int64 // time.Duration a peer has to answer one
	conns       atomic.Uint64

	mu       sync.Mutex // guards subs, pollStop, pollDone
	subs     map[*subscriber]struct{}
	pollStop context.CancelFunc // stops the environment poller; nil while none runs
	pollDone chan struct{}      // closed when that poller has returned
}

// subscriber is one connection's queue of notices.
type subscriber struct {
	ch      chan ctxd.WSMessage
	dropped int // notices missed since the last one delivered; guarded by hub.mu
}

// newHub returns a hub whose connections start closing when stopping is
// closed.
func newHub(stopping <-chan struct{}, sensor ctxd.Sensor, log *slog.Logger) *hub {
	h := &hub{sensor: sensor, log: log, stopping: stopping, subs: map[*subscriber]struct{}{}}
	h.setPing(defaultWSPing, defaultWSPingTimeout)
	return h
}

// setPing sets how often connections accepted from now on ping their peer
// and how long the peer has to answer.
func (h *hub) setPing(every, timeout time.Duration) {
	h.pingEvery.Store(int64(every))
	h.pingTimeout.Store(int64(timeout))
}

// subscribe adds a connection's queue. While any connection is
// subscribed, the hub polls the environment and publishes band changes.
func (h *hub) subscribe() *subscriber {
	s := &subscriber{ch: make(chan ctxd.WSMessage, wsNoticeQueue)}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs[s] = struct{}{}
	if h.pollStop == nil {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		h.pollStop, h.pollDone = cancel, done
		last := h.sensor.Environment() // now: a change after subscribe returns is published
		go func() {
			defer close(done)
			h.pollEnvironment(ctx, last)
		}()
	}
	return s
}

// unsubscribe removes a connection's queue; the last one out stops the
// poller and waits for it.
func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	var stop context.CancelFunc
	var done chan struct{}
	if len(h.subs) == 0 && h.pollStop != nil {
		stop, done = h.pollStop, h.pollDone
		h.pollStop, h.pollDone = nil, nil
	}
	h.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// publish offers n to every connection without waiting: a full queue
// drops it and counts the drop, which the next notice delivered reports.
func (h *hub) publish(n ctxd.WSMessage) {
	n.Type = ctxd.WSNotice
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		m := n
		m.Dropped = s.dropped
		select {
		case s.ch <- m:
			s.dropped = 0
		default:
			s.dropped++
		}
	}
}

// pollEnvironment publishes each change of the environment bands until
// ctx ends. The sensor answers from a recent reading, so a poll is cheap.
func (h *hub) pollEnvironment(ctx context.Context, last ctxd.Environment) {
	t := time.NewTicker(envPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if env := h.sensor.Environment(); env != last {
			h.log.Info("environment changed", "from", last, "to", env)
			last = env
			h.publish(ctxd.WSMessage{Notice: ctxd.NoticeEnvironment, Environment: &env})
		}
	}
}

// PublishCodex tells every WebSocket session of a new codex.
func (srv *Server) PublishCodex(plan ctxd.CodexPlan) {
	srv.hub.publish(ctxd.WSMessage{Notice: ctxd.NoticeCodexReloaded, Codex: &plan})
}

// handleWS upgrades GET /v1/ws to a WebSocket session. A sigil token sent
// with the upgrade request authenticates every ask on the connection.
func (srv wsRoutes) handleWS(w http.ResponseWriter, r *http.Request) {
	e, err := srv.core.Engine()
	if err != nil {
		writeError(w, err)
		return
	}
	// A sigil holds at most daemon.max_websockets_per_sigil open: one
	// token holder's idle connections held every other client out
	// (issue 27, finding 5).
	who, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	release, err := srv.websockets.take(who.Name)
	if err != nil {
		srv.log.InfoContext(r.Context(), "websocket refused", "err", err)
		writeError(w, err)
		return
	}
	defer release()
	// Subscribed before the upgrade is answered: a client sees every
	// notice published after its handshake.
	sub := srv.hub.subscribe()
	defer srv.hub.unsubscribe(sub)
	ws, err := websocket.Accept(w, r, nil) // same-origin only, for browsers
	if err != nil {
		srv.log.InfoContext(r.Context(), "websocket upgrade refused", "err", err)
		return // Accept answered
	}
	ws.SetReadLimit(srv.cfg.Daemon.MaxBodyBytes)
	ctx, end := context.WithCancelCause(context.WithoutCancel(r.Context()))
	c := &wsConn{
		srv: srv.Server, e: e, ws: ws, r: r, sub: sub, ctx: ctx, end: end,
		log:      srv.log.With("ws", srv.hub.conns.Add(1)),
		out:      make(chan wsOut, wsQueue),
		refusals: make(chan wsOut, wsRefusals),
		asks:     map[string]context.CancelCauseFunc{},
	}
	c.serve()
}

// wsConn is one WebSocket connection.
type wsConn struct {
	srv *Server
	e   *engine.Engine
	ws  *websocket.Conn
	r   *http.Request // the upgrade request: its token's sigil, and the daemon's stop of requests
	sub *subscriber
	log *slog.Logger
	ctx context.Context         // ends with the connection
	end context.CancelCauseFunc // ends the connection, saying why (an error of kind KindCanceled or KindUnavailable)
	out chan wsOut              // the writer's queue
	// refusals is the writer's queue of errors for messages that started
	// nothing. The reader queues them without waiting, so that it never
	// stops reading (pongs, cancels) behind a full queue.
	refusals chan wsOut

	mu       sync.Mutex                         // guards asks, active, draining, closing
	asks     map[string]context.CancelCauseFunc // running asks by id
	active   int                                // asks that have not yet queued their last message
	draining bool                               // the daemon is stopping: no new asks; close once idle
	closing  bool                               // the close is queued
	running  sync.WaitGroup                     // ask goroutines
}

// wsOut is one item of the writer's queue.
type wsOut struct {
	msg     ctxd.WSMessage
	goAway  bool // close the connection (the daemon is stopping) after the messages before it
	refused bool // not an ask's message: for the log only
}

// serve runs the connection until the peer closes it, it fails, or the
// daemon stops; then it stops the asks still running and waits for
// every goroutine it started.
func (c *wsConn) serve() {
	c.log.Debug("websocket session opened")
	var wg sync.WaitGroup
	wg.Go(c.write)
	wg.Go(c.ping)
	wg.Go(c.watchStop)
	cause := c.read()
	c.end(cause)
	cause = context.Cause(c.ctx)
	c.mu.Lock()
	for _, cancel := range c.asks {
		cancel(ctxd.Errorf(ctxd.KindCanceled, "the WebSocket connection ended: %v", cause))
	}
	c.mu.Unlock()
	c.running.Wait()
	wg.Wait()
	_ = c.ws.CloseNow()
	c.log.Debug("websocket session closed", "cause", cause)
}

// read handles the peer's messages until the connection ends, and
// returns why it did.
func (c *wsConn) read() error {
	for {
		typ, b, err := c.ws.Read(c.ctx)
		if err != nil {
			if c.ctx.Err() != nil {
				return context.Cause(c.ctx)
			}
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway:
			case websocket.StatusMessageTooBig:
				c.log.Info("websocket message over daemon.max_body_bytes; connection closed", "limit", c.srv.cfg.Daemon.MaxBodyBytes)
			default:
				c.log.Debug("websocket read", "err", err)
			}
			return ctxd.Errorf(ctxd.KindCanceled, "the client closed the connection or went away: %w", err)
		}
		if typ != websocket.MessageText {
			c.refuse("", ctxd.Errorf(ctxd.KindInvalid, "binary message: send JSON text messages"))
			continue
		}
		c.handle(b)
	}
}

// handle acts on one message. It never waits for an ask: those run in
// their own goroutines.
func (c *wsConn) handle(b []byte) {
	var head struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		c.refuse("", ctxd.Errorf(ctxd.KindInvalid, "malformed JSON message: %v", err))
		return
	}
	switch head.Type {
	case ctxd.WSAsk:
		c.ask(b, head.ID)
	case ctxd.WSCancel:
		c.cancel(head.ID)
	case ctxd.WSFeedback:
		c.feedback(b, head.ID)
	case "":
		c.refuse(head.ID, ctxd.Errorf(ctxd.KindInvalid, `"type" is required: ask, cancel or feedback`))
	default:
		c.refuse(head.ID, ctxd.Errorf(ctxd.KindInvalid, "unknown message type %q: send ask, cancel or feedback", head.Type))
	}
}

// wsFeedback is the shape of a feedback message; other fields are refused.
type wsFeedback struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	Sigil  string `json:"sigil"`
	Trace  int64  `json:"trace"`
	Action string `json:"action"`
	Note   string `json:"note"`
	By     int64  `json:"by"`
}

// feedback judges a trace as a feedback message asks and answers with the
// trace after it, or an error; either way through the queue of answers to
// messages that start nothing, so the reader never waits on the writer.
// The write is short (one SQLite commit) and done here, in order.
func (c *wsConn) feedback(b []byte, id string) {
	var m wsFeedback
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		c.refuse(id, ctxd.Errorf(ctxd.KindInvalid, "feedback: %v (fields: id, sigil, trace, action, note, by)", err))
		return
	}
	if m.ID == "" || m.Trace == 0 || m.Action == "" {
		c.refuse(id, ctxd.Errorf(ctxd.KindInvalid, `feedback: "id", "trace" and "action" are required`))
		return
	}
	s, err := c.srv.actor(c.r, m.Sigil)
	var after ctxd.Trace
	if err == nil {
		after, err = karmaRoutes{c.srv}.judge(c.ctx, s, strconv.FormatInt(m.Trace, 10), m.Action, ctxd.KarmaJudgement{Note: m.Note, By: m.By})
	}
	if err != nil {
		c.refuse(id, err)
		return
	}
	select {
	case c.refusals <- wsOut{msg: ctxd.WSMessage{Type: ctxd.WSFeedback, ID: id, Trace: after.ID, Action: m.Action, Judged: &after}}:
	default:
		c.end(ctxd.Errorf(ctxd.KindCanceled, "the client sent %d messages without reading their answers", wsRefusals+1))
	}
}

// wsAsk is the shape of an ask message; other fields are refused.
type wsAsk struct {
	Type      string      `json:"type"`
	ID        string      `json:"id"`
	Session   string      `json:"session"`
	Query     string      `json:"query"`
	Pin       bool        `json:"pin"`
	Sigil     string      `json:"sigil"`
	System    string      `json:"system"`
	History   []ctxd.Turn `json:"history"`
	MaxTokens int         `json:"max_tokens"`
	Persona   string      `json:"persona"`
}

// ask starts an ask in its own goroutine, or refuses it.
func (c *wsConn) ask(b []byte, id string) {
	var m wsAsk
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		c.refuse(id, ctxd.Errorf(ctxd.KindInvalid, "malformed ask: %v", err))
		return
	}
	switch {
	case m.ID == "":
		c.refuse("", ctxd.Errorf(ctxd.KindInvalid, `ask: "id" is required: the client's name for the ask, unique among its running asks`))
		return
	case m.Session == "":
		c.refuse(m.ID, ctxd.Errorf(ctxd.KindInvalid, `ask: "session" is required`))
		return
	case strings.TrimSpace(m.Query) == "":
		c.refuse(m.ID, ctxd.Errorf(ctxd.KindInvalid, `ask: "query" is required and must not be blank`))
		return
	}
	sigil, err := c.srv.actor(c.r, m.Sigil)
	if err != nil {
		c.refuse(m.ID, err)
		return
	}
	req := ctxd.AskRequest{Session: m.Session, Query: m.Query, Sigil: sigil.Name, Pin: m.Pin, System: m.System, History: m.History,
		MaxTokens: m.MaxTokens, Scopes: sigil.Scopes, Persona: m.Persona}

	c.mu.Lock()
	select {
	case <-c.srv.hub.stopping: // watchStop may not have seen it yet
		c.draining = true
	default:
	}
	_, dup := c.asks[m.ID]
	switch {
	case dup:
		err = ctxd.Errorf(ctxd.KindConflict, "ask id %q is already running on this connection: ids must be unique among running asks", m.ID)
	case c.draining:
		err = ctxd.Errorf(ctxd.KindUnavailable, "ctxd is shutting down")
	case len(c.asks) >= wsMaxAsks:
		err = ctxd.Errorf(ctxd.KindConflict, "this connection already runs %d asks, the cap per connection: wait for one to end or open another connection", wsMaxAsks)
	}
	if err != nil {
		c.mu.Unlock()
		c.refuse(m.ID, err)
		return
	}
	// The daemon's stop of requests (after the grace period) reaches the
	// ask through the upgrade request's context, as it reaches /v1/ask.
	ctx, cancel := context.WithCancelCause(c.r.Context())
	c.asks[m.ID] = cancel
	c.active++
	c.running.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.running.Done()
		c.run(ctx, cancel, m.ID, sigil, req)
	}()
}

// errCanceledByClient is the cause of an ask the client cancelled.
var errCanceledByClient = ctxd.Errorf(ctxd.KindCanceled, "cancelled by the client")

// cancel stops the running ask id; its last message is its error. A
// cancel of an id that is not running is ignored: the ask may just have
// ended.
func (c *wsConn) cancel(id string) {
	if id == "" {
		c.refuse("", ctxd.Errorf(ctxd.KindInvalid, `cancel: "id" is required`))
		return
	}
	c.mu.Lock()
	cancel, ok := c.asks[id]
	c.mu.Unlock()
	if ok {
		cancel(errCanceledByClient)
	}
}

// run answers one ask and queues its last message (and, when the ask
// started a new epoch, an epoch notice).
func (c *wsConn) run(ctx context.Context, cancel context.CancelCauseFunc, id string, sigil runcontext.Sigil, req ctxd.AskRequest) {
	defer cancel(nil)
	last, notice := c.answer(ctx, id, sigil, req)
	// Off the list before the last message is queued: a client that has
	// it may use the id again.
	c.mu.Lock()
	delete(c.asks, id)
	c.mu.Unlock()
	c.queue(last)
	if notice != nil {
		c.queue(*notice)
	}
	c.mu.Lock()
	c.active--
	idle := c.draining && c.active == 0
	c.mu.Unlock()
	if idle {
		c.goAway()
	}
}

// answer runs the ask through the orchestrator, streaming its tokens, and
// returns its last message.
func (c *wsConn) answer(ctx context.Context, id string, sigil runcontext.Sigil, req ctxd.AskRequest) (last ctxd.WSMessage, notice *ctxd.WSMessage) {
	// Each ask is a request of its own in the log and the summary: the
	// connection's id and the ask's.
	rid := reqid.From(ctx) + "." + id
	if !reqid.Valid(rid) {
		rid = reqid.New()
	}
	ctx = reqid.With(ctx, rid)
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("websocket ask panic", "session", req.Session, "panic", v)
			last, notice = wsError(id, ctxd.Errorf(ctxd.KindInternal, "internal error; see the daemon log")), nil
		}
	}()
	e, release, err := c.srv.persona(ctx, req.Persona, sigil.Name, nil)
	var sum *ctxd.Summary
	if err == nil {
		defer release()
		sum, err = e.Orch.AskAs(ctx, sigil, req, func(text string) error {
			return c.token(ctx, id, text)
		})
	}
	if err != nil {
		switch k := ctxd.KindOf(err); k {
		case ctxd.KindInternal, ctxd.KindNotRecorded:
			c.log.Error("ask failed", "session", req.Session, "kind", k, "err", err)
		case ctxd.KindBackend, ctxd.KindUnavailable:
			c.log.Warn("ask failed", "session", req.Session, "kind", k, "err", err)
		}
		return wsError(id, err), nil
	}
	return ctxd.WSMessage{Type: ctxd.WSSummary, ID: id, Summary: sum}, epochNotice(sum)
}

// token queues one piece of an answer, waiting while the queue is full.
// The writer gives up on a client that takes no message for
// daemon.write_timeout, which ends the connection: the ask then ends as
// if its client went away.
func (c *wsConn) token(ctx context.Context, id, text string) error {
	select {
	case c.out <- wsOut{msg: ctxd.WSMessage{Type: ctxd.WSToken, ID: id, Text: text}}:
		return nil
	case <-c.ctx.Done():
		return context.Cause(c.ctx)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// queue queues a message, waiting while the queue is full, unless the
// connection ends first.
func (c *wsConn) queue(m ctxd.WSMessage) {
	select {
	case c.out <- wsOut{msg: m}:
	case <-c.ctx.Done():
	}
}

// refuse answers a message that starts nothing with an error. It carries
// the message's id unless that is a running ask's, which it must not end.
// It never waits: a client that has sent more refused messages than the
// queue holds without reading their answers is not reading, and its
// connection ends.
func (c *wsConn) refuse(id string, err error) {
	c.mu.Lock()
	if _, running := c.asks[id]; running {
		id = ""
	}
	c.mu.Unlock()
	select {
	case c.refusals <- wsOut{msg: wsError(id, err), refused: true}:
	default:
		c.log.Info("websocket client sent refused messages faster than it read their errors; connection closed", "queued", wsRefusals)
		c.end(ctxd.Errorf(ctxd.KindCanceled, "the client sent %d refused messages without reading their errors", wsRefusals+1))
	}
}

// watchStop: when the daemon begins to stop, the connection takes no new
// asks and closes once those running have sent their last message. They
// have the shutdown grace period to finish; then the daemon stops them
// (through the upgrade request's context) and they send their error.
func (c *wsConn) watchStop() {
	select {
	case <-c.ctx.Done():
		return
	case <-c.srv.hub.stopping:
	}
	c.mu.Lock()
	c.draining = true
	idle := c.active == 0
	c.mu.Unlock()
	if idle {
		c.goAway()
	}
}

// goAway queues the close, once.
func (c *wsConn) goAway() {
	c.mu.Lock()
	closing := c.closing
	c.closing = true
	c.mu.Unlock()
	if closing {
		return
	}
	select {
	case c.out <- wsOut{goAway: true}:
	case <-c.ctx.Done():
	}
}

// write is the connection's only writer of data messages: the queue's
// messages and the hub's notices, one at a time. A client that does not
// take one within daemon.write_timeout is treated as gone.
func (c *wsConn) write() {
	timeout := c.srv.cfg.Daemon.WriteTimeout.Duration
	for {
		var o wsOut
		select {
		case <-c.ctx.Done():
			return
		case o = <-c.out:
		case o = <-c.refusals:
		case o.msg = <-c.sub.ch:
		}
		if o.goAway {
			c.closeGoingAway()
			return
		}
		b, err := json.Marshal(o.msg)
		if err != nil { // cannot happen: every field marshals
			c.log.Error("websocket message not encoded", "type", o.msg.Type, "err", err)
			continue
		}
		wctx, cancel := context.WithTimeout(c.ctx, timeout)
		err = c.ws.Write(wctx, websocket.MessageText, b)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Info("websocket client went away or stopped reading", "write_timeout", timeout, "err", err)
			}
			c.end(ctxd.Errorf(ctxd.KindCanceled, "the client went away or took no message for daemon.write_timeout (%s): %w", timeout, err))
			return
		}
		if o.refused {
			c.log.Debug("websocket message refused", "id", o.msg.ID, "kind", o.msg.Kind, "err", o.msg.Error)
		}
	}
}

// closeGoingAway closes the connection with 1001 (going away) because
// the daemon is stopping. A peer that does not answer the close frame
// within wsCloseWait is cut off.
func (c *wsConn) closeGoingAway() {
	stopping := ctxd.Errorf(ctxd.KindUnavailable, "ctxd is shutting down")
	t := time.AfterFunc(wsCloseWait, func() { c.end(stopping) })
	defer t.Stop()
	if err := c.ws.Close(websocket.StatusGoingAway, "ctxd is shutting down"); err != nil {
		c.log.Debug("websocket close", "err", err)
	}
	c.end(stopping)
}

// ping pings the peer every so often and drops it when it does not
// answer in time. A pong is read by the handler's reads.
func (c *wsConn) ping() {
	every := time.Duration(c.srv.hub.pingEvery.Load())
	timeout := time.Duration(c.srv.hub.pingTimeout.Load())
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, timeout)
		err := c.ws.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Info("websocket peer did not answer a ping; dropping it", "timeout", timeout, "err", err)
			}
			c.end(ctxd.Errorf(ctxd.KindCanceled, "the client did not answer a ping within %s: %w", timeout, err))
			return
		}
	}
}

// wsError is the error message of err for the ask (or message) id.
func wsError(id string, err error) ctxd.WSMessage {
	k := ctxd.KindOf(err)
	return ctxd.WSMessage{Type: ctxd.WSError, ID: id, Error: err.Error(), Kind: k, Status: k.Status()}
}

// epochNotice is the notice of an ask whose governor started a new epoch
// of its session, or nil.
func epochNotice(sum *ctxd.Summary) *ctxd.WSMessage {
	var acts []string
	for _, a := range sum.Governor {
		switch a.Kind {
		case ctxd.ActionCompact, ctxd.ActionCondense, ctxd.ActionStale:
			acts = append(acts, a.Kind)
		}
	}
	if acts == nil {
		return nil
	}
	return &ctxd.WSMessage{Type: ctxd.WSNotice, Notice: ctxd.NoticeEpoch, Session: sum.Session, Epoch: sum.Epoch, Actions: acts}
}
