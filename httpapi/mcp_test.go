package httpapi

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/mcptest"
	"github.com/ctxd/ctxd/internal/socktest"
	"github.com/ctxd/ctxd/sigils"
)

// mcpHTTPSession opens an MCP session on /v1/mcp of the daemon's socket
// with the go-sdk's streamable HTTP client, sending hdr with every request.
func mcpHTTPSession(t *testing.T, socket string, hdr http.Header) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	hc := &http.Client{Transport: headerTransport{hdr, tr}}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil)
	cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: "http://ctxd/v1/mcp", HTTPClient: hc}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

type headerTransport struct {
	hdr  http.Header
	next http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header[k] = v
	}
	return h.next.RoundTrip(r)
}

// TestMCPOverHTTP: /v1/mcp serves the MCP server over streamable HTTP,
// bound to the sigil of the request that opened the session: the tools
// and resources its scopes allow, asks that run on the daemon's request
// path (two in one MCP session share its default session), and an error
// result for what the daemon refuses. A token binds its sigil; a bad
// token or an unknown sigil is refused before any session is made.
func TestMCPOverHTTP(t *testing.T) {
	t.Parallel()
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Sigils["agent"] = config.Sigil{Scopes: []string{"ask", "search_codex"}, TokenSHA256: hash}
	}})
	sock := f.cfg.Daemon.Socket
	h := http.Header{"X-Ctxd-Scopes": {"ask"}, "Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
	if status, body := socktest.DoHeader(t, sock, "POST", "/v1/mcp", h, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`); status != 400 || !strings.Contains(body, "X-Ctxd-Scopes") {
		t.Errorf("narrowed scopes on /v1/mcp: %d %s", status, body)
	}

	plain, err := mcpHTTPSession(t, sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := mcptest.ToolNames(t, plain); !slices.Equal(got, []string{"ask", "status"}) {
		t.Errorf("the default sigil is offered %v", got)
	}
	f.backend.SetAnswer("an answer")
	var turns []int
	var session string
	for _, q := range []string{"Where is Listen?", "And Close?"} {
		res := mcptest.Call(t, plain, "ask", map[string]any{"query": q})
		text := mcptest.Text(res)
		if res.IsError || !strings.Contains(text, "an answer") {
			t.Fatalf("ask: %s", text)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var sum struct {
			Session string
			Turn    int
		}
		json.Unmarshal(b, &sum)
		turns = append(turns, sum.Turn)
		if session == "" {
			session = sum.Session
		} else if sum.Session != session {
			t.Errorf("the MCP session's asks went to %s and %s", session, sum.Session)
		}
	}
	if !slices.Equal(turns, []int{1, 2}) || !strings.HasPrefix(session, "mcp-") {
		t.Errorf("turns %v in session %q", turns, session)
	}
	// The asks ran on the daemon: its store holds them.
	if s, err := f.client.Session(t.Context(), session); err != nil || len(s.Turns) != 2 {
		t.Errorf("the daemon's session %s: %+v %v", session, s, err)
	}

	// A token binds its sigil, with its scopes.
	coder, err := mcpHTTPSession(t, sock, http.Header{"Authorization": {"Bearer " + tok}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mcptest.ToolNames(t, coder); !slices.Equal(got, []string{"ask", "search_codex", "status"}) {
		t.Errorf("sigil agent is offered %v", got)
	}
	res := mcptest.Call(t, coder, "status", nil)
	text := mcptest.Text(res)
	if res.IsError || !strings.Contains(text, `"ready": true`) {
		t.Errorf("status: %.300s", text)
	}
	// The daemon's refusal is a tool error: the small codex is loaded whole.
	if res := mcptest.Call(t, coder, "search_codex", map[string]any{"query": "Listen"}); !res.IsError || !strings.Contains(mcptest.Text(res), "not indexed for search") {
		t.Errorf("search_codex on a codex loaded whole: %v %q", res.IsError, mcptest.Text(res))
	}
	files, err := coder.ListResources(t.Context(), nil)
	if err != nil || len(files.Resources) == 0 {
		t.Errorf("resources: %+v %v", files, err)
	}

	// A bad token, and a sigil that does not exist, open no session.
	if _, err := mcpHTTPSession(t, sock, http.Header{"Authorization": {"Bearer ctxd_wrong"}}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("a bad token: %v", err)
	}
	if _, err := mcpHTTPSession(t, sock, http.Header{"X-Ctxd-Sigil": {"nobody"}}); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("an unknown sigil: %v", err)
	}
	// A session id is no way into another sigil's sessions.
	req, _ := http.NewRequest(http.MethodPost, "http://ctxd/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", coder.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("sigil agent's session id, without its token: %d; want 404 (no such session)", resp.StatusCode)
	}
}

// TestMCPStreamDoesNotHoldTheShutdown: the stream of the MCP server's
// messages that a client keeps open (its GET) ends when the daemon begins
// to stop: with a grace period longer than the guard, the stop does not
// wait it out.
func TestMCPStreamDoesNotHoldTheShutdown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.ShutdownGrace = config.Duration{Duration: 3 * wsGuard}
	}})
	cs, err := mcpHTTPSession(t, f.cfg.Daemon.Socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The go-sdk's client keeps a stream of the server's messages open
	// (GET /v1/mcp) for as long as its session lasts; this waits until
	// the session answers.
	if got := mcptest.ToolNames(t, cs); len(got) == 0 {
		t.Fatal("no tools")
	}
	f.cancel()
	f.runReturns(t)
}

// TestMCPToolCallInFlightAtShutdown: an ask an MCP client runs when the
// daemon begins to stop is a request like the others: the daemon waits
// for it through the grace period, then stops it at the backend, and only
// then closes the store; Run returns.
func TestMCPToolCallInFlightAtShutdown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.ShutdownGrace = config.Duration{Duration: 200 * time.Millisecond}
	}})
	cs, err := mcpHTTPSession(t, f.cfg.Daemon.Socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.backend.Hold()
	defer f.backend.Release()
	called := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"query": "a long one"}})
		called <- res
	}()
	select {
	case <-f.backend.Started():
	case <-time.After(wsGuard):
		t.Fatal("the ask did not reach the backend")
	}
	f.cancel()
	f.runReturns(t)
	if n := f.backend.Stopped(); n != 1 {
		t.Errorf("the backend was told to stop %d generations; want the MCP ask's", n)
	}
	select {
	case res := <-called:
		if res != nil && !res.IsError {
			t.Errorf("the stopped ask answered: %+v", res)
		}
	case <-time.After(wsGuard):
		t.Error("the MCP client's call did not end")
	}
}
