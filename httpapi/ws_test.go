package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/sigils"
)

// wsGuard bounds every wait of these tests: reaching it means a hang.
const wsGuard = 10 * time.Second

// wsPeer is a raw WebSocket client of the daemon: it sends what a test
// writes, byte for byte, and reads every message in a goroutine (which is
// what answers the daemon's pings) unless told not to.
type wsPeer struct {
	t    *testing.T
	ws   *websocket.Conn
	in   chan ctxd.WSMessage
	stop chan struct{} // ends the reader at cleanup
	done chan struct{} // closed when the reader returned
	err  error         // why it did; set before done closes

	backlog []ctxd.WSMessage // read while looking for another ask's messages
}

// dialWS opens a raw session on the daemon's socket.
// dialWS opens a WebSocket to the daemon on socket; "?sigil=NAME" after
// the socket's path names the connection's sigil.
func dialWS(t *testing.T, socket string, opts *websocket.DialOptions) *websocket.Conn {
	t.Helper()
	socket, query, _ := strings.Cut(socket, "?")
	url := "ws://ctxd/v1/ws"
	if query != "" {
		url += "?" + query
	}
	if opts == nil {
		opts = &websocket.DialOptions{}
	}
	opts.HTTPClient = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	ws, _, err := websocket.Dial(t.Context(), url, opts)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(16 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return ws
}

// newPeer opens a raw session and starts reading it.
func newPeer(t *testing.T, socket string, opts *websocket.DialOptions) *wsPeer {
	t.Helper()
	p := &wsPeer{t: t, ws: dialWS(t, socket, opts), in: make(chan ctxd.WSMessage, 4096), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			_, b, err := p.ws.Read(context.Background())
			if err != nil {
				p.err = err
				return
			}
			var m ctxd.WSMessage
			if err := json.Unmarshal(b, &m); err != nil {
				p.err = fmt.Errorf("malformed message %q: %w", b, err)
				return
			}
			select {
			case p.in <- m:
			case <-p.stop:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(p.stop)
		_ = p.ws.CloseNow()
		<-p.done
	})
	return p
}

// send writes one text message.
func (p *wsPeer) send(msg string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wsGuard)
	defer cancel()
	if err := p.ws.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		p.t.Fatalf("send %s: %v", msg, err)
	}
}

// next is the next message.
func (p *wsPeer) next() ctxd.WSMessage {
	p.t.Helper()
	select {
	case m := <-p.in:
		return m
	default:
	}
	select {
	case m := <-p.in:
		return m
	case <-p.done:
		select {
		case m := <-p.in:
			return m
		default:
		}
		p.t.Fatalf("the connection ended: %v", p.err)
	case <-time.After(wsGuard):
		p.t.Fatalf("no message within %s", wsGuard)
	}
	return ctxd.WSMessage{}
}

// final reads up to the last message of ask id (its summary or error),
// returning it and the text of its tokens. Messages of other asks wait in
// the backlog for their own final; notices are skipped.
func (p *wsPeer) final(id string) (ctxd.WSMessage, string) {
	p.t.Helper()
	var sb strings.Builder
	for {
		var m ctxd.WSMessage
		if i := slices.IndexFunc(p.backlog, func(m ctxd.WSMessage) bool { return m.ID == id }); i >= 0 {
			m = p.backlog[i]
			p.backlog = slices.Delete(p.backlog, i, i+1)
		} else if m = p.next(); m.Type == ctxd.WSNotice {
			continue
		} else if m.ID != id {
			p.backlog = append(p.backlog, m)
			continue
		}
		switch m.Type {
		case ctxd.WSToken:
			sb.WriteString(m.Text)
		case ctxd.WSSummary, ctxd.WSError:
			return m, sb.String()
		}
	}
}

// closed waits for the connection to end and returns its close status.
func (p *wsPeer) closed() websocket.StatusCode {
	p.t.Helper()
	select {
	case <-p.done:
		return websocket.CloseStatus(p.err)
	case <-time.After(wsGuard):
		p.t.Fatalf("the connection still open after %s", wsGuard)
	}
	return 0
}

func askMsg(id, session, query string) string {
	b, _ := json.Marshal(ctxd.WSAskMessage(id, ctxd.AskRequest{Session: session, Query: query}))
	return string(b)
}

func connect(t *testing.T, c *client.Client) *client.Conn {
	t.Helper()
	conn, err := c.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestWSTwoAsksOnOneConnection: two asks run at once on one connection,
// their tokens interleaved, each answered whole under its own id.
func TestWSTwoAsksOnOneConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{slots: 2})
	const answer = "one two three four"
	f.backend.SetAnswer(answer)
	f.backend.Hold()
	conn := connect(t, f.client)
	type result struct {
		sum  *ctxd.Summary
		err  error
		text string
	}
	started := make(chan string, 2)
	results := make(chan result, 2)
	var wg sync.WaitGroup
	for _, session := range []string{"a", "b"} {
		wg.Go(func() {
			var sb strings.Builder
			sum, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: "question of " + session}, func(s string) {
				if sb.Len() == 0 {
					started <- session
				}
				sb.WriteString(s)
			})
			results <- result{sum, err, sb.String()}
		})
	}
	// Both stream before either ends: the backend holds each after its
	// first piece until Release.
	for range 2 {
		select {
		case <-started:
		case <-time.After(wsGuard):
			t.Fatal("the two asks did not both start streaming")
		}
	}
	f.backend.Release()
	wg.Wait()
	close(results)
	var sessions []string
	for r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.text != answer || r.sum.Turn != 1 {
			t.Errorf("session %s: text %q, summary %+v", r.sum.Session, r.text, r.sum)
		}
		sessions = append(sessions, r.sum.Session)
	}
	slices.Sort(sessions)
	if !slices.Equal(sessions, []string{"a", "b"}) {
		t.Errorf("answered sessions %v", sessions)
	}
	if m := f.backend.MaxRunning(); m != 2 {
		t.Errorf("%d generations at once, want the two asks together", m)
	}
}

// TestWSCancel: a cancel stops its ask at once, with kind canceled and
// nothing recorded, while the other ask on the connection goes on; the Go
// client sends the cancel when its context ends.
func TestWSCancel(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{slots: 2})
	f.backend.Hold()

	t.Run("wire", func(t *testing.T) {
		p := newPeer(t, f.cfg.Daemon.Socket, nil)
		p.send(askMsg("r1", "cancelled", "a long answer"))
		p.send(askMsg("r2", "kept", "another long answer"))
		for seen := map[string]bool{}; len(seen) < 2; {
			m := p.next()
			if m.Type == ctxd.WSToken {
				seen[m.ID] = true
			}
			p.backlog = append(p.backlog, m) // for final
		}
		p.send(`{"type":"cancel","id":"r1"}`)
		// The backend still holds r2: r1's end cannot wait for a release.
		last, _ := p.final("r1")
		if last.Type != ctxd.WSError || last.Kind != ctxd.KindCanceled || last.Status != 499 || !strings.Contains(last.Error, "cancelled by the client") {
			t.Fatalf("r1 ended with %+v", last)
		}
		f.backend.Release()
		last, text := p.final("r2")
		if last.Type != ctxd.WSSummary || last.Summary.Session != "kept" || text != "an answer" {
			t.Fatalf("r2 ended with %+v after %q", last, text)
		}
		if s, _ := f.store.Session(t.Context(), "cancelled"); s.Count != 0 {
			t.Errorf("a cancelled answer was recorded: %+v", s)
		}
		if f.backend.Stopped() != 1 {
			t.Errorf("the backend stopped %d generations, want 1", f.backend.Stopped())
		}
	})

	t.Run("client context", func(t *testing.T) {
		f.backend.Hold()
		conn := connect(t, f.client)
		ctx, cancel := context.WithCancel(t.Context())
		_, err := conn.Ask(ctx, ctxd.AskRequest{Session: "gone", Query: "long answer"}, func(string) { cancel() })
		var api *client.APIError
		if !errors.As(err, &api) || api.Kind != ctxd.KindCanceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled ask returned %v", err)
		}
		f.backend.Release()
		// The connection is still usable.
		sum, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "gone", Query: "again"}, nil)
		if err != nil || sum.Turn != 1 {
			t.Fatalf("the next ask: %+v, %v", sum, err)
		}
	})
}

// TestWSClientThatStopsReadingEndsItsAsk: a client that asks and never
// reads must not hold its backend slot: after daemon.write_timeout its
// connection ends, and the ask with it, as if it went away.
func TestWSClientThatStopsReadingEndsItsAsk(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.WriteTimeout = config.Duration{Duration: 200 * time.Millisecond}
	}})
	f.backend.SetAnswer(strings.Repeat("word ", 400_000)) // megabytes of messages: more than the socket buffers hold
	ws := dialWS(t, f.cfg.Daemon.Socket, nil)
	if err := ws.Write(t.Context(), websocket.MessageText, []byte(askMsg("r1", "stalled", "a long answer"))); err != nil {
		t.Fatal(err)
	}
	// Never read. The only slot is freed for another session.
	daemontest.WaitFor(t, func() bool { return f.backend.Stopped() == 1 })
	f.backend.SetAnswer("an answer")
	if sum := f.ask(t, "other", "still served?"); sum.Turn != 1 {
		t.Errorf("the next session: %+v", sum)
	}
	if s, _ := f.store.Session(t.Context(), "stalled"); s.Count != 0 {
		t.Errorf("the answer nobody read was recorded: %+v", s)
	}
}

// TestWSPeerThatStopsAnsweringPingsIsDropped: a peer that does not answer
// a ping in time is dropped; one that answers stays and is served.
func TestWSPeerThatStopsAnsweringPingsIsDropped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.srv.hub.setPing(50*time.Millisecond, 500*time.Millisecond)

	pings := make(chan struct{}, 100)
	live := newPeer(t, f.cfg.Daemon.Socket, &websocket.DialOptions{OnPingReceived: func(context.Context, []byte) bool {
		select {
		case pings <- struct{}{}:
		default:
		}
		return true
	}})
	dead := newPeer(t, f.cfg.Daemon.Socket, &websocket.DialOptions{OnPingReceived: func(context.Context, []byte) bool {
		return false // no pong
	}})
	dead.closed()
	t.Logf("the silent peer's connection ended: %v", dead.err)
	// The live peer has answered pings meanwhile, and is still served.
	for range 3 {
		select {
		case <-pings:
		case <-time.After(wsGuard):
			t.Fatal("the live peer was not pinged")
		}
	}
	live.send(askMsg("r1", "alive", "still there?"))
	if last, _ := live.final("r1"); last.Type != ctxd.WSSummary {
		t.Fatalf("the live peer's ask: %+v", last)
	}
}

// TestWSBadMessages: each bad message gets an error that names the
// problem, and the connection stays usable.
func TestWSBadMessages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	p := newPeer(t, f.cfg.Daemon.Socket, nil)
	cases := []struct {
		name, msg string
		id        string
		kind      ctxd.Kind
		mention   string
	}{
		{"malformed JSON", `{"type":"ask","id":"a1","session":"s"`, "", ctxd.KindInvalid, "malformed JSON"},
		{"not an object", `[1,2]`, "", ctxd.KindInvalid, "malformed JSON"},
		{"unknown type", `{"type":"dance","id":"d1"}`, "d1", ctxd.KindInvalid, `unknown message type "dance"`},
		{"missing type", `{"id":"x1"}`, "x1", ctxd.KindInvalid, `"type" is required`},
		{"missing id", `{"type":"ask","session":"s","query":"hi"}`, "", ctxd.KindInvalid, `"id" is required`},
		{"missing session", `{"type":"ask","id":"a2","query":"hi"}`, "a2", ctxd.KindInvalid, `"session" is required`},
		{"missing query", `{"type":"ask","id":"a3","session":"s"}`, "a3", ctxd.KindInvalid, `"query" is required`},
		{"blank query", `{"type":"ask","id":"a3b","session":"s","query":"  "}`, "a3b", ctxd.KindInvalid, `"query" is required`},
		{"unknown field", `{"type":"ask","id":"a4","session":"s","query":"hi","temperature":2}`, "a4", ctxd.KindInvalid, "temperature"},
		{"bad session id", `{"type":"ask","id":"a5","session":"../etc","query":"hi"}`, "a5", ctxd.KindInvalid, "session"},
		{"unknown sigil", `{"type":"ask","id":"a6","session":"s","query":"hi","sigil":"root"}`, "a6", ctxd.KindForbidden, "root"},
		{"unknown persona", `{"type":"ask","id":"a7","session":"s","query":"hi","persona":"nobody"}`, "a7", ctxd.KindNotFound, `persona "nobody" not found`},
		{"feedback, unknown field", `{"type":"feedback","id":"f1","turn":1,"score":1}`, "f1", ctxd.KindInvalid, `unknown field "turn"`},
		{"feedback, no trace", `{"type":"feedback","id":"f2","action":"verify"}`, "f2", ctxd.KindInvalid, `"trace"`},
		{"feedback, karma off", `{"type":"feedback","id":"f3","trace":1,"action":"verify"}`, "f3", ctxd.KindForbidden, `lacks the "karma:write" scope`},
		{"cancel without id", `{"type":"cancel"}`, "", ctxd.KindInvalid, `"id" is required`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p.send(c.msg)
			m := p.next()
			if m.Type != ctxd.WSError || m.ID != c.id || m.Kind != c.kind || m.Status != c.kind.Status() || !strings.Contains(m.Error, c.mention) {
				t.Errorf("answer %+v, want an error of kind %s for id %q mentioning %q", m, c.kind, c.id, c.mention)
			}
		})
	}
	t.Run("binary message", func(t *testing.T) {
		if err := p.ws.Write(t.Context(), websocket.MessageBinary, []byte(askMsg("b1", "s", "hi"))); err != nil {
			t.Fatal(err)
		}
		if m := p.next(); m.Type != ctxd.WSError || m.Kind != ctxd.KindInvalid || !strings.Contains(m.Error, "text") {
			t.Errorf("answer %+v", m)
		}
	})
	// A cancel of an id that is not running is no error (it may just
	// have ended): the next message is the next ask's.
	p.send(`{"type":"cancel","id":"never"}`)
	p.send(askMsg("ok", "s", "still usable?"))
	if m := p.next(); m.ID != "ok" {
		t.Errorf("after a cancel of nothing: %+v", m)
	}
	if last, _ := p.final("ok"); last.Type != ctxd.WSSummary || last.Summary.Turn != 1 {
		t.Errorf("the ask after the bad messages: %+v", last)
	} else if rid := last.Summary.RequestID; len(rid) < 4 || !strings.HasSuffix(rid, ".ok") {
		t.Errorf("a WebSocket ask's request id %q is not the connection's and the ask's", rid)
	}
}

// TestWSDuplicateIDAndCap: an id already running is refused without
// touching the running ask, and a connection runs at most wsMaxAsks asks.
func TestWSDuplicateIDAndCap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.backend.Hold()
	p := newPeer(t, f.cfg.Daemon.Socket, nil)
	p.send(askMsg("r1", "s1", "first"))
	if m := p.next(); m.Type != ctxd.WSToken || m.ID != "r1" {
		t.Fatalf("first message %+v", m)
	}
	p.send(askMsg("r1", "s9", "same id"))
	if m := p.next(); m.Type != ctxd.WSError || m.ID != "" || m.Kind != ctxd.KindConflict || !strings.Contains(m.Error, `"r1" is already running`) {
		t.Fatalf("a duplicate id: %+v", m)
	}
	for i := 2; i <= wsMaxAsks; i++ { // queued behind r1 for the only slot
		p.send(askMsg(fmt.Sprint("r", i), fmt.Sprint("s", i), "more"))
	}
	p.send(askMsg("over", "s0", "one too many"))
	if m := p.next(); m.Type != ctxd.WSError || m.ID != "over" || m.Kind != ctxd.KindConflict || !strings.Contains(m.Error, fmt.Sprint(wsMaxAsks, " asks")) {
		t.Fatalf("an ask over the cap: %+v", m)
	}
	f.backend.Release()
	for i := 1; i <= wsMaxAsks; i++ {
		if last, _ := p.final(fmt.Sprint("r", i)); last.Type != ctxd.WSSummary || last.Summary.Session != fmt.Sprint("s", i) {
			t.Errorf("r%d: %+v", i, last)
		}
	}
}

// TestWSNotices: a codex reload, a change of an environment band and a
// compaction each reach the connection as a notice.
func TestWSNotices(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) { c.Limits.MaxDepth = 2 }})
	conn := connect(t, f.client)
	notice := func(kind string) ctxd.WSMessage {
		t.Helper()
		for {
			select {
			case n, ok := <-conn.Notices():
				if !ok {
					t.Fatalf("connection ended: %v", conn.Err())
				}
				if n.Type == ctxd.WSNotice && n.Notice == kind {
					return n
				}
				t.Logf("skipped %+v", n)
			case <-time.After(wsGuard):
				t.Fatalf("no %s notice", kind)
			}
		}
	}

	if _, err := f.client.LoadCodex(t.Context(), daemontest.SmallCodex(t), nil); err != nil {
		t.Fatal(err)
	}
	if n := notice(ctxd.NoticeCodexReloaded); n.Codex == nil || n.Codex.Mode != "cag" {
		t.Errorf("codex notice %+v", n)
	}

	f.sensor.SetVRAM("high")
	if n := notice(ctxd.NoticeEnvironment); n.Environment == nil || n.Environment.VRAM != "high" {
		t.Errorf("environment notice %+v", n)
	}

	var compacted *ctxd.Summary
	for i := 0; compacted == nil && i < 6; i++ {
		sum, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "deep", Query: fmt.Sprint("question ", i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(sum.Governor, func(a ctxd.Action) bool { return a.Kind == ctxd.ActionCompact }) {
			compacted = sum
		}
	}
	if compacted == nil {
		t.Fatal("no compaction in 6 turns with max_depth 2")
	}
	if n := notice(ctxd.NoticeEpoch); n.Session != "deep" || n.Epoch != compacted.Epoch || n.Epoch == 0 || !slices.Contains(n.Actions, ctxd.ActionCompact) {
		t.Errorf("epoch notice %+v after summary epoch %d", n, compacted.Epoch)
	}
}

// TestWSHubDropsNoticesForASlowConnection: publishing never waits for a
// connection; one that does not keep up misses notices and is told how
// many in the next one, while one that keeps up misses none.
func TestWSHubDropsNoticesForASlowConnection(t *testing.T) {
	t.Parallel()
	h := newHub(make(chan struct{}), fake.NewSensor(), slog.New(slog.DiscardHandler))
	slow, quick := h.subscribe(), h.subscribe()
	defer h.unsubscribe(slow)
	defer h.unsubscribe(quick)
	const extra = 5
	// The quick connection takes each notice as it comes; the slow one
	// takes none until the end.
	quickGot := make(chan int, 1)
	go func() {
		got := 0
		for range wsNoticeQueue + extra {
			h.publish(ctxd.WSMessage{Notice: ctxd.NoticeCodexReloaded})
			if n := <-quick.ch; n.Dropped == 0 && n.Type == ctxd.WSNotice {
				got++
			}
		}
		quickGot <- got
	}()
	select {
	case got := <-quickGot:
		if got != wsNoticeQueue+extra {
			t.Errorf("the quick connection got %d whole notices of %d", got, wsNoticeQueue+extra)
		}
	case <-time.After(wsGuard):
		t.Fatal("publish waited for a connection that does not read")
	}
	for range wsNoticeQueue {
		if n := <-slow.ch; n.Dropped != 0 {
			t.Errorf("a queued notice says %d dropped", n.Dropped)
		}
	}
	h.publish(ctxd.WSMessage{Notice: ctxd.NoticeEnvironment})
	if n := <-slow.ch; n.Dropped != extra || n.Notice != ctxd.NoticeEnvironment {
		t.Errorf("the next notice after %d drops: %+v", extra, n)
	}
}

// TestWSTokenAuthenticatesTheConnection: a token sent with the upgrade
// request makes every ask on the connection act as its sigil.
func TestWSTokenAuthenticatesTheConnection(t *testing.T) {
	t.Parallel()
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	var revoked atomic.Bool // the reload revokes the token
	var f *fixture
	f = newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Sigils["coder"] = config.Sigil{Scopes: []string{"ask", "search_codex"}, TokenSHA256: hash}
	}, reread: func() (config.Config, error) {
		c := f.cfg
		if revoked.Load() {
			c.Sigils = map[string]config.Sigil{"default": c.Sigils["default"],
				"coder": {Scopes: []string{"ask", "search_codex"}, RevokedSHA256: []string{hash}}}
		}
		return c, nil
	}})
	conn := connect(t, client.New(f.cfg.Daemon.Socket, client.WithToken(tok)))
	_, err = conn.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "hi", Sigil: "default"}, nil)
	var api *client.APIError
	if !errors.As(err, &api) || api.Kind != ctxd.KindForbidden || !strings.Contains(api.Message, `"coder"`) {
		t.Errorf("an ask naming another sigil than its token's: %v", err)
	}
	if _, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "hi"}, nil); err != nil {
		t.Errorf("an ask as the token's sigil: %v", err)
	}
	_, err = client.New(f.cfg.Daemon.Socket, client.WithToken("ctxd_wrong")).Connect(t.Context())
	if !errors.As(err, &api) || api.Status != http.StatusUnauthorized {
		t.Errorf("a connection with a bad token: %v", err)
	}
	// A reload that revokes the token ends its authority on the open
	// connection too.
	revoked.Store(true)
	if st := f.srv.core.Reload(t.Context()); !st.OK {
		t.Fatalf("reload: %+v", st)
	}
	_, err = conn.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "still me?"}, nil)
	if !errors.As(err, &api) || api.Kind != ctxd.KindUnauthorized || !strings.Contains(api.Message, "revoked") {
		t.Errorf("an ask on the connection after its token was revoked: %v", err)
	}
}

// TestWSShutdown: the daemon's stop does not wait for open connections; a
// running ask has the grace period to finish and otherwise ends with its
// error, as on /v1/ask; then the daemon closes the connection (going
// away) and Run returns.
func TestWSShutdown(t *testing.T) {
	t.Parallel()
	t.Run("idle connection", func(t *testing.T) {
		t.Parallel()
		// A grace period longer than the guard: the stop must not wait it out.
		f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
			c.Daemon.ShutdownGrace = config.Duration{Duration: 3 * wsGuard}
		}})
		conn := connect(t, f.client)
		f.cancel()
		f.runReturns(t)
		<-conn.Done()
		var api *client.APIError
		if err := conn.Err(); !errors.As(err, &api) || api.Kind != ctxd.KindUnavailable {
			t.Errorf("the connection ended with %v", err)
		}
	})

	t.Run("ask finishes in the grace period", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
			c.Daemon.ShutdownGrace = config.Duration{Duration: 3 * wsGuard}
		}})
		hub := f.srv.hub
		f.backend.Hold()
		p := newPeer(t, f.cfg.Daemon.Socket, nil)
		p.send(askMsg("r1", "s", "long answer"))
		if m := p.next(); m.Type != ctxd.WSToken {
			t.Fatalf("first message %+v", m)
		}
		f.cancel()
		daemontest.WaitFor(t, func() bool {
			select {
			case <-hub.stopping:
				return true
			default:
				return false
			}
		})
		p.send(askMsg("r2", "s2", "too late"))
		if last, _ := p.final("r2"); last.Type != ctxd.WSError || last.Kind != ctxd.KindUnavailable || !strings.Contains(last.Error, "shutting down") {
			t.Errorf("an ask after the stop: %+v", last)
		}
		f.backend.Release()
		if last, _ := p.final("r1"); last.Type != ctxd.WSSummary {
			t.Errorf("an ask that finished in the grace period ended with %+v", last)
		}
		if code := p.closed(); code != websocket.StatusGoingAway {
			t.Errorf("closed with %v (%v), want going away", code, p.err)
		}
		f.runReturns(t)
		if s, _ := f.store.Session(context.Background(), "s"); s.Count != 1 {
			t.Errorf("the answer finished in the grace period was not recorded: %+v", s)
		}
	})

	t.Run("ask cut at the end of the grace period", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
			c.Daemon.ShutdownGrace = config.Duration{Duration: 300 * time.Millisecond}
		}})
		f.backend.Hold()
		p := newPeer(t, f.cfg.Daemon.Socket, nil)
		p.send(askMsg("r1", "s", "long answer"))
		if m := p.next(); m.Type != ctxd.WSToken {
			t.Fatalf("first message %+v", m)
		}
		f.cancel()
		last, _ := p.final("r1")
		if last.Type != ctxd.WSError || last.Kind != ctxd.KindInterrupted || !strings.Contains(last.Error, "not recorded") {
			t.Errorf("an ask cut at shutdown ended with %+v", last)
		}
		if code := p.closed(); code != websocket.StatusGoingAway {
			t.Errorf("closed with %v (%v), want going away", code, p.err)
		}
		f.runReturns(t)
		f.backend.Release()
		if s, _ := f.store.Session(context.Background(), "s"); s.Count != 0 {
			t.Errorf("a cut answer was recorded: %+v", s)
		}
	})
}

// TestWSRefusalsNeverBlockTheReader: with the writer's queue full (a
// long answer streaming to a slow client), the reader still answers bad
// messages without waiting, so it goes on reading pongs and cancels; a
// client that leaves more refusals unread than their queue holds is not
// reading, and its connection ends, saying why.
func TestWSRefusalsNeverBlockTheReader(t *testing.T) {
	t.Parallel()
	ctx, end := context.WithCancelCause(t.Context())
	c := &wsConn{ctx: ctx, end: end, log: slog.New(slog.DiscardHandler),
		out: make(chan wsOut), refusals: make(chan wsOut, wsRefusals), asks: map[string]context.CancelCauseFunc{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range wsRefusals {
			c.refuse(fmt.Sprint(i), ctxd.Errorf(ctxd.KindInvalid, "bad message %d", i))
		}
		if ctx.Err() != nil {
			t.Errorf("the connection ended with %d refusals queued: %v", wsRefusals, context.Cause(ctx))
		}
		c.refuse("one-too-many", ctxd.Errorf(ctxd.KindInvalid, "bad message"))
	}()
	select {
	case <-done:
	case <-time.After(wsGuard):
		t.Fatal("refuse waited for the writer")
	}
	if n := len(c.refusals); n != wsRefusals {
		t.Errorf("%d refusals queued; want %d", n, wsRefusals)
	}
	if ctx.Err() == nil || !strings.Contains(context.Cause(ctx).Error(), "refused messages without reading") {
		t.Errorf("the connection of a client that does not read: %v", context.Cause(ctx))
	}
}
