package httpapi

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/socktest"
)

// The bounds of the second trust round (issue 27): each refused with an
// error that names its key, and shown in status.

// TestKarmaNotesAndJudgementsAreBounded (finding 6): ~300 notes of 1 MB
// grew the database to 297 MB, and reading that trace took the daemon
// from 0.72 to 1.96 GB. A note is now at most karma.max_note_bytes and a
// trace has at most karma.max_judgements.
func TestKarmaNotesAndJudgementsAreBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{sqlite: true, config: func(c *config.Config) {
		c.Karma.MaxNoteBytes, c.Karma.MaxJudgements = 100, 3
		c.Sigils["default"] = config.Sigil{Scopes: []string{"ask", "karma:read", "karma:write", "admin"}}
	}})
	ctx := t.Context()
	a := f.ask(t, "k", "how do I test?")
	if _, err := f.client.Judge(ctx, a.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: strings.Repeat("x", 101)}); ctxd.KindOf(err) != ctxd.KindTooLarge || !strings.Contains(err.Error(), "karma.max_note_bytes") {
		t.Errorf("a note over the bound: %v, want too large naming karma.max_note_bytes", err)
	}
	for i := range 3 {
		if _, err := f.client.Judge(ctx, a.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: strings.Repeat("y", 100)}); err != nil {
			t.Fatalf("judgement %d within the bound: %v", i+1, err)
		}
	}
	_, err := f.client.Judge(ctx, a.Trace, ctxd.KarmaReject, ctxd.KarmaJudgement{})
	if ctxd.KindOf(err) != ctxd.KindTooMany || !strings.Contains(err.Error(), "karma.max_judgements") {
		t.Errorf("a judgement past the bound: %v, want too many naming karma.max_judgements", err)
	}
	if status, body := f.do(t, "GET", "/v1/status", "", ""); status != 200 || !strings.Contains(body, `"key": "karma.max_judgements"`) {
		t.Errorf("status does not show the karma bounds: %d %s", status, body)
	}
}

// TestOneSigilsWebSocketsLeaveRoomForOthers (finding 5): 1,024 idle
// WebSockets of one token holder held the listener's cap and every other
// client out. A sigil now holds at most daemon.max_websockets_per_sigil;
// another sigil's connections and asks go on.
func TestOneSigilsWebSocketsLeaveRoomForOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.MaxWebSocketsPerSigil = 3
		c.Sigils["greedy"] = config.Sigil{Scopes: []string{"ask"}}
		c.Sigils["other"] = config.Sigil{Scopes: []string{"ask"}}
		c.Sigils["operator"] = config.Sigil{Scopes: []string{"admin"}}
	}})
	sock := f.cfg.Daemon.Socket
	for range 3 {
		c := dialWS(t, sock+"?sigil=greedy", nil)
		t.Cleanup(func() { c.CloseNow() })
	}
	status, body := socktest.Do(t, sock, "GET", "/v1/ws?sigil=greedy", "", "")
	if status != http.StatusTooManyRequests || !strings.Contains(body, "daemon.max_websockets_per_sigil") {
		t.Errorf("a fourth WebSocket of one sigil: %d %s, want 429 naming daemon.max_websockets_per_sigil", status, body)
	}
	o := newPeer(t, sock+"?sigil=other", nil)
	o.send(`{"id":"1","type":"ask","session":"o","query":"still served?"}`)
	if m, _ := o.final("1"); m.Error != "" {
		t.Errorf("another sigil's ask over a WebSocket: %+v", m)
	}
	if status, body := f.do(t, "POST", "/v1/ask", "application/json", `{"session":"o2","query":"hi","sigil":"other"}`); status != 200 {
		t.Errorf("another sigil's ask: %d %s", status, body)
	}
	if _, body := f.do(t, "GET", "/v1/status?sigil=operator", "", ""); !strings.Contains(body, `"greedy": 3`) {
		t.Errorf("status does not show an admin the greedy sigil's WebSockets:\n%s", body)
	}
	if _, body := f.do(t, "GET", "/v1/status?sigil=other", "", ""); strings.Contains(body, "greedy") {
		t.Errorf("status shows another sigil what the greedy sigil holds:\n%s", body)
	}
}

// TestMCPSessionsAreBounded (finding 7): 20,000 initialize calls held
// 20,000 sessions (a goroutine and ~15 KB each) for 30 minutes. A sigil
// now holds at most daemon.max_mcp_sessions_per_sigil, all sigils
// together daemon.max_mcp_sessions; a session ended makes room.
func TestMCPSessionsAreBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.MaxMCPSessionsPerSigil, c.Daemon.MaxMCPSessions = 2, 3
		c.Sigils["peer"] = config.Sigil{Scopes: []string{"ask"}}
	}})
	sock := f.cfg.Daemon.Socket
	h := http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}`
	first, err := mcpHTTPSession(t, sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mcpHTTPSession(t, sock, nil); err != nil {
		t.Fatal(err)
	}
	status, body := socktest.DoHeader(t, sock, "POST", "/v1/mcp", h, initialize)
	if status != http.StatusTooManyRequests || !strings.Contains(body, "daemon.max_mcp_sessions_per_sigil") {
		t.Errorf("a third session of one sigil: %d %s, want 429 naming daemon.max_mcp_sessions_per_sigil", status, body)
	}
	if _, err := mcpHTTPSession(t, sock, http.Header{"X-Ctxd-Sigil": {"peer"}}); err != nil {
		_, body := socktest.DoHeader(t, sock, "GET", "/v1/status", nil, "")
		t.Errorf("another sigil's session: %v\n%s", err, body)
	}
	hp := h.Clone()
	hp.Set("X-Ctxd-Sigil", "peer")
	status, body = socktest.DoHeader(t, sock, "POST", "/v1/mcp", hp, initialize)
	if status != http.StatusTooManyRequests || !strings.Contains(body, "daemon.max_mcp_sessions") {
		t.Errorf("a session past the daemon's bound: %d %s, want 429 naming daemon.max_mcp_sessions", status, body)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// The server ends the session as the client's DELETE arrives; the
	// room is there once it has.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := mcpHTTPSession(t, sock, nil)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a session after one ended: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
