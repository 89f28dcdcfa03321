package mcpserver

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/internal/mcptest"
)

// fakeDaemon serves the few routes the MCP server uses, on a Unix socket.
// A request's token picks its sigil: "reader" may search and read the
// codex, "asker" (and no token) may only ask.
type fakeDaemon struct {
	socket string
	srv    *httptest.Server

	mu    sync.Mutex
	asks  []ctxd.AskRequest // guarded by mu
	codex bool              // guarded by mu: a codex is loaded
	rag   bool              // guarded by mu: the codex is searchable
}

var codexFiles = map[string]string{
	"README.md":        "# Handlers\n",
	"pkg/handlers.go":  "package pkg\n\nfunc Handler1() error { return nil }\n",
	"dir with space/a": "spaced\n",
}

func newFakeDaemon(t testing.TB) *fakeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeDaemon{socket: filepath.Join(dir, "d.sock"), codex: true, rag: true}
	ln, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(f.routes())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	f.srv = srv
	return f
}

func (f *fakeDaemon) set(codex, rag bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codex, f.rag = codex, rag
}

func (f *fakeDaemon) asked() []ctxd.AskRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.asks)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, k ctxd.Kind, msg string) {
	writeJSON(w, k.Status(), map[string]any{"error": msg, "kind": k})
}

func (f *fakeDaemon) routes() http.Handler {
	sigilOf := func(r *http.Request) ctxd.SigilInfo {
		switch r.Header.Get("Authorization") {
		case "Bearer reader":
			return ctxd.SigilInfo{Name: "reader", Scopes: []string{"ask", "search_codex"}, Authenticated: true}
		case "Bearer asker":
			return ctxd.SigilInfo{Name: "asker", Scopes: []string{"ask"}, Authenticated: true}
		}
		return ctxd.SigilInfo{Name: "default", Scopes: []string{"ask"}}
	}
	reader := func(w http.ResponseWriter, r *http.Request) bool {
		if !slices.Contains(sigilOf(r).Scopes, "search_codex") {
			writeErr(w, ctxd.KindForbidden, `sigil lacks the "search_codex" scope`)
			return false
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.codex {
			writeErr(w, ctxd.KindNotFound, "no codex is loaded")
			return false
		}
		return true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sigil", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer wrong" {
			writeErr(w, ctxd.KindUnauthorized, "Authorization: the token matches no sigil (wrong, or revoked)")
			return
		}
		writeJSON(w, 200, sigilOf(r))
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"version": "fake", "backend": map[string]any{"model": "m"}})
	})
	mux.HandleFunc("POST /v1/ask", func(w http.ResponseWriter, r *http.Request) {
		var req ctxd.AskRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeErr(w, ctxd.KindInvalid, err.Error())
			return
		}
		f.mu.Lock()
		f.asks = append(f.asks, req)
		turn := 0
		for _, a := range f.asks {
			if a.Session == req.Session {
				turn++
			}
		}
		f.mu.Unlock()
		if req.Query == "overload" {
			writeErr(w, ctxd.KindDoesNotFit, "the prompt does not fit in num_ctx 4096 even after the governor's actions")
			return
		}
		enc := json.NewEncoder(w)
		for _, tok := range []string{"Handler1 ", "returns ", "nil."} {
			_ = enc.Encode(ctxd.Event{Type: ctxd.EventToken, Text: tok})
		}
		if req.Query == "interrupt" {
			_ = enc.Encode(ctxd.Event{Type: ctxd.EventError, Error: "the daemon is shutting down", Status: 503, Kind: ctxd.KindInterrupted})
			return
		}
		cached := 0
		if turn > 1 {
			cached = 90
		}
		_ = enc.Encode(ctxd.Event{Type: ctxd.EventSummary, Summary: &ctxd.Summary{
			Session: req.Session, Turn: turn, Mode: "cag", PromptTokens: 100, CachedTokens: cached,
			EvaluatedTokens: 100 - cached, ReusePercent: float64(cached), AnswerTokens: 3,
		}})
	})
	mux.HandleFunc("GET /v1/codex/search", func(w http.ResponseWriter, r *http.Request) {
		if !reader(w, r) {
			return
		}
		f.mu.Lock()
		rag := f.rag
		f.mu.Unlock()
		if !rag {
			writeErr(w, ctxd.KindConflict, "the codex is not indexed for search: it is loaded whole (CAG mode) or not at all")
			return
		}
		q := r.URL.Query()
		ex := []ctxd.Excerpt{{Path: "pkg/handlers.go", Lines: "3-3", Text: "func Handler1() error { return nil }\n"}}
		if q.Get("k") == "2" {
			ex = append(ex, ctxd.Excerpt{Path: "README.md", Lines: "1-1", Text: "# Handlers\n"})
		}
		if q.Get("q") == "nothing" {
			ex = nil
		}
		writeJSON(w, 200, map[string]any{"query": q.Get("q"), "excerpts": ex})
	})
	mux.HandleFunc("GET /v1/codex/files", func(w http.ResponseWriter, r *http.Request) {
		if !reader(w, r) {
			return
		}
		var files []ctxd.CodexFile
		for p, c := range codexFiles {
			files = append(files, ctxd.CodexFile{Path: p, Bytes: int64(len(c)), Lines: strings.Count(c, "\n")})
		}
		slices.SortFunc(files, func(a, b ctxd.CodexFile) int { return strings.Compare(a.Path, b.Path) })
		writeJSON(w, 200, map[string]any{"files": files})
	})
	mux.HandleFunc("GET /v1/codex/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		if !reader(w, r) {
			return
		}
		p := r.PathValue("path")
		c, ok := codexFiles[p]
		if !ok {
			writeErr(w, ctxd.KindNotFound, "codex has no file "+p)
			return
		}
		writeJSON(w, 200, ctxd.CodexFileContent{CodexFile: ctxd.CodexFile{Path: p}, Content: c})
	})
	return mux
}

// connect builds a server whose client presents token ("" for none) and
// connects an MCP client to it in memory.
func connect(t testing.TB, f *fakeDaemon, token string) (*Server, *mcp.ClientSession) {
	t.Helper()
	var opts []client.Option
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	s, err := New(t.Context(), client.New(f.socket, opts...), Options{Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return s, connectTo(t, s)
}

func connectTo(t testing.TB, s *Server) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.Connect(t.Context(), st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v0"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// structured decodes a result's structured content into v.
func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

func TestToolsAndResourcesFollowTheSigil(t *testing.T) {
	f := newFakeDaemon(t)
	cases := []struct {
		name, token string
		tools       []string
		resources   bool
	}{
		{"no token: the default sigil", "", []string{"ask", "status"}, false},
		{"a sigil that only asks", "asker", []string{"ask", "status"}, false},
		{"a sigil that reads the codex", "reader", []string{"ask", "search_codex", "status"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, cs := connect(t, f, c.token)
			if got := mcptest.ToolNames(t, cs); !slices.Equal(got, c.tools) {
				t.Errorf("tools %v, want %v", got, c.tools)
			}
			if has := cs.InitializeResult().Capabilities.Resources != nil; has != c.resources {
				t.Errorf("resources capability %v, want %v (sigil %+v)", has, c.resources, s.Sigil())
			}
			res, err := cs.ListResources(t.Context(), nil)
			if c.resources {
				if err != nil || len(res.Resources) != len(codexFiles) {
					t.Fatalf("resources: %v, %+v", err, res)
				}
				return
			}
			if err == nil && len(res.Resources) > 0 {
				t.Errorf("a sigil without search_codex lists resources: %+v", res.Resources)
			}
			if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "ctxd-codex:///README.md"}); err == nil {
				t.Error("a sigil without search_codex reads a codex file")
			}
		})
	}
}

func TestNewFailsWithoutTheDaemon(t *testing.T) {
	f := newFakeDaemon(t)
	cases := []struct{ name, socket, token, want string }{
		{"no daemon", filepath.Join(t.TempDir(), "none.sock"), "", "cannot reach the daemon"},
		{"a token no sigil holds", f.socket, "wrong", "matches no sigil"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(t.Context(), client.New(c.socket, client.WithToken(c.token)), Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err %v, want one that says %q", err, c.want)
			}
		})
	}
}

func TestAsk(t *testing.T) {
	f := newFakeDaemon(t)
	s, cs := connect(t, f, "")
	var first, second askOutput
	res := mcptest.Call(t, cs, "ask", map[string]any{"query": "What does Handler1 return?"})
	structured(t, res, &first)
	if res.IsError || !strings.HasPrefix(mcptest.Text(res), "Handler1 returns nil.") || !strings.HasPrefix(first.Session, "mcp-") || first.Turn != 1 {
		t.Fatalf("first ask: %q %+v", mcptest.Text(res), first)
	}
	res = mcptest.Call(t, cs, "ask", map[string]any{"query": "And Handler2?", "pin": true})
	structured(t, res, &second)
	if second.Session != first.Session || second.Turn != 2 || second.CachedTokens != 90 || second.ReusePercent != 90 || second.EvaluatedTokens != 10 {
		t.Errorf("second ask in the connection's session: %+v", second)
	}
	if !strings.Contains(mcptest.Text(res), "90 cached (90.0%)") {
		t.Errorf("second ask's text: %q", mcptest.Text(res))
	}
	var named askOutput
	structured(t, mcptest.Call(t, cs, "ask", map[string]any{"query": "hi", "session": "mine.1", "persona": "writer"}), &named)
	if named.Session != "mine.1" || named.Turn != 1 {
		t.Errorf("ask in a named session: %+v", named)
	}
	// Another connection has its own default session.
	var other askOutput
	structured(t, mcptest.Call(t, connectTo(t, s), "ask", map[string]any{"query": "hi"}), &other)
	if other.Session == first.Session || !strings.HasPrefix(other.Session, "mcp-") {
		t.Errorf("second connection's session %q, first's %q", other.Session, first.Session)
	}
	asks := f.asked()
	if len(asks) != 4 || !asks[1].Pin || asks[0].Pin || asks[0].Sigil != "" || asks[2].Persona != "writer" || asks[0].Persona != "" {
		t.Errorf("the daemon was asked %+v", asks)
	}
}

func TestBadInputAndDaemonErrorsAreToolErrors(t *testing.T) {
	f := newFakeDaemon(t)
	f.set(true, false)
	_, cs := connect(t, f, "reader")
	cases := []struct {
		name, tool string
		args       map[string]any
		want       []string // in the error text
	}{
		{"ask without a query", "ask", map[string]any{}, []string{"query"}},
		{"ask with an empty query", "ask", map[string]any{"query": "  "}, []string{"query is required"}},
		{"ask with a query of the wrong type", "ask", map[string]any{"query": 5}, []string{"query"}},
		{"ask with a bad session", "ask", map[string]any{"query": "hi", "session": "../x"}, []string{"session"}},
		{"ask with an unknown argument", "ask", map[string]any{"query": "hi", "question": "hi"}, []string{"question"}},
		{"ask that does not fit", "ask", map[string]any{"query": "overload"}, []string{"does not fit", "does_not_fit", "HTTP 422"}},
		{"ask interrupted mid-stream", "ask", map[string]any{"query": "interrupt"}, []string{"shutting down", "interrupted", "HTTP 503"}},
		{"search without a query", "search_codex", map[string]any{"k": 2}, []string{"query"}},
		{"search with k 0", "search_codex", map[string]any{"query": "x", "k": 0}, []string{"k"}},
		{"search with k 51", "search_codex", map[string]any{"query": "x", "k": 51}, []string{"k", "50"}},
		{"search with k not a number", "search_codex", map[string]any{"query": "x", "k": "two"}, []string{"k"}},
		{"search of a codex loaded whole", "search_codex", map[string]any{"query": "Handler1"}, []string{"not indexed for search", "conflict", "HTTP 409"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := mcptest.Call(t, cs, c.tool, c.args)
			if !res.IsError {
				t.Fatalf("not an error: %q %v", mcptest.Text(res), res.StructuredContent)
			}
			t.Logf("%s", mcptest.Text(res))
			for _, w := range c.want {
				if !strings.Contains(mcptest.Text(res), w) {
					t.Errorf("error %q does not say %q", mcptest.Text(res), w)
				}
			}
		})
	}
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "karma_verify"}); err == nil {
		t.Error("an unknown tool is not an error")
	}
}

func TestUnreachableDaemonIsAToolError(t *testing.T) {
	f := newFakeDaemon(t)
	_, cs := connect(t, f, "reader")
	f.srv.Close() // the daemon stops after the server started
	for _, tool := range []string{"ask", "search_codex", "status"} {
		args := map[string]any{"query": "hi"}
		if tool == "status" {
			args = nil
		}
		res := mcptest.Call(t, cs, tool, args)
		if !res.IsError || !strings.Contains(mcptest.Text(res), tool) || !strings.Contains(mcptest.Text(res), "cannot reach the daemon") {
			t.Errorf("%s without the daemon: error %v, %q", tool, res.IsError, mcptest.Text(res))
		}
	}
}

func TestSearchCodex(t *testing.T) {
	f := newFakeDaemon(t)
	_, cs := connect(t, f, "reader")
	var out searchOutput
	res := mcptest.Call(t, cs, "search_codex", map[string]any{"query": "Handler1", "k": 2})
	structured(t, res, &out)
	if res.IsError || len(out.Excerpts) != 2 || out.Excerpts[0] != (excerpt{"pkg/handlers.go", "3-3", "func Handler1() error { return nil }\n"}) {
		t.Fatalf("search: %q %+v", mcptest.Text(res), out)
	}
	if want := "pkg/handlers.go:3-3\nfunc Handler1() error { return nil }\n\nREADME.md:1-1\n# Handlers"; mcptest.Text(res) != want {
		t.Errorf("search text %q, want %q", mcptest.Text(res), want)
	}
	res = mcptest.Call(t, cs, "search_codex", map[string]any{"query": "nothing"})
	structured(t, res, &out)
	if res.IsError || len(out.Excerpts) != 0 || !strings.Contains(mcptest.Text(res), "no excerpt") {
		t.Errorf("search that finds nothing: %q %+v", mcptest.Text(res), out)
	}
}

func TestStatus(t *testing.T) {
	f := newFakeDaemon(t)
	_, cs := connect(t, f, "")
	res := mcptest.Call(t, cs, "status", nil)
	var st map[string]any
	if err := json.Unmarshal([]byte(mcptest.Text(res)), &st); err != nil || res.IsError || st["version"] != "fake" {
		t.Errorf("status: %v %q", err, mcptest.Text(res))
	}
}

func TestCodexResources(t *testing.T) {
	f := newFakeDaemon(t)
	_, cs := connect(t, f, "reader")
	res, err := cs.ListResources(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range res.Resources {
		uris = append(uris, r.URI)
		if r.MIMEType != "text/plain" || r.Size != int64(len(codexFiles[r.Name])) {
			t.Errorf("resource %+v", r)
		}
	}
	want := []string{"ctxd-codex:///README.md", "ctxd-codex:///dir%20with%20space/a", "ctxd-codex:///pkg/handlers.go"}
	if !slices.Equal(uris, want) {
		t.Errorf("resource URIs %v, want %v", uris, want)
	}
	for i, uri := range want {
		got, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		if len(got.Contents) != 1 || got.Contents[0].Text != codexFiles[res.Resources[i].Name] || got.Contents[0].MIMEType != "text/plain" {
			t.Errorf("read %s: %+v", uri, got.Contents)
		}
	}
	for _, uri := range []string{"ctxd-codex:///missing.go", "ctxd-codex:///../etc/passwd", "ctxd-codex:///%zz", "file:///etc/passwd", "ctxd-codex:///"} {
		_, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri})
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != mcp.CodeResourceNotFound {
			t.Errorf("read %s: %v, want resource not found", uri, err)
		}
	}
	// No codex loaded: an empty list, and nothing to read.
	f.set(false, false)
	if res, err := cs.ListResources(t.Context(), nil); err != nil || len(res.Resources) != 0 {
		t.Errorf("without a codex: %v, %+v", err, res)
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: want[0]}); err == nil {
		t.Error("read without a codex: no error")
	}
}

func TestCodexResourcesWithoutTheDaemon(t *testing.T) {
	f := newFakeDaemon(t)
	_, cs := connect(t, f, "reader")
	f.srv.Close() // the daemon stops after the server started
	if _, err := cs.ListResources(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "cannot reach the daemon") {
		t.Errorf("list without the daemon: %v", err)
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "ctxd-codex:///README.md"}); err == nil || !strings.Contains(err.Error(), "cannot reach the daemon") {
		t.Errorf("read without the daemon: %v", err)
	}
}
