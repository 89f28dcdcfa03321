package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/mcptest"
	"github.com/ctxd/ctxd/sigils"
)

// buildCtxd builds the ctxd command of this tree, for the tests that run
// it as its users do.
func buildCtxd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ctxd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/ctxd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestMCPServesTheRealDaemon runs the real `ctxd mcp` binary as an MCP
// client launches it (a subprocess speaking MCP on stdin and stdout) in
// front of the real daemon on the real Ollama, and drives it with the MCP
// Go SDK's client: the tools each sigil is offered, two asks in one
// session (the second reusing the first's prompt), search_codex on a codex
// loaded whole (the daemon's error) and on one retrieved from, and the
// codex's files as resources, before and after a reload.
func TestMCPServesTheRealDaemon(t *testing.T) {
	needOllama(t)
	bin := buildCtxd(t)
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	codex := codexDir(t, 4500)
	cfg := baseConfig(t, t.TempDir(), codex)
	cfg.Sigils = map[string]config.Sigil{
		"default": {Scopes: []string{"ask", "codex:load", "sessions:read"}},
		"coder":   {Scopes: []string{"ask", "search_codex", "sessions:read"}, TokenSHA256: hash},
	}
	d := start(t, cfg, true)
	sock := cfg.Daemon.Socket

	// Without a token: the default sigil, which may only ask.
	plain := mcpSession(t, bin, nil, "--socket", sock)
	if got := mcptest.ToolNames(t, plain); !slices.Equal(got, []string{"ask", "status"}) {
		t.Errorf("the default sigil is offered %v", got)
	}
	if plain.InitializeResult().Capabilities.Resources != nil {
		t.Error("the default sigil is offered resources")
	}

	// With coder's token, from $CTXD_TOKEN as an MCP client's config passes it.
	cs := mcpSession(t, bin, []string{"CTXD_TOKEN=" + tok}, "--socket", sock)
	if got := mcptest.ToolNames(t, cs); !slices.Equal(got, []string{"ask", "search_codex", "status"}) {
		t.Errorf("sigil coder is offered %v", got)
	}

	var turns [2]struct {
		Session         string  `json:"session"`
		Turn            int     `json:"turn"`
		Mode            string  `json:"mode"`
		PromptTokens    int     `json:"prompt_tokens"`
		CachedTokens    int     `json:"cached_tokens"`
		EvaluatedTokens int     `json:"evaluated_tokens"`
		ReusePercent    float64 `json:"reuse_percent"`
	}
	for i, q := range []string{"What does Handler3 return?", "Which handler serves kind 7?"} {
		res := mcptest.Call(t, cs, "ask", map[string]any{"query": q})
		if res.IsError {
			t.Fatalf("ask %q: %s", q, mcptest.Text(res))
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &turns[i]); err != nil {
			t.Fatalf("ask's structured content %s: %v", b, err)
		}
		t.Logf("ask %d: %s — %s", i+1, b, mcptest.Text(res))
	}
	first, second := turns[0], turns[1]
	if !strings.HasPrefix(first.Session, "mcp-") || second.Session != first.Session || first.Turn != 1 || second.Turn != 2 || second.Mode != "cag" {
		t.Errorf("two asks in the connection's session: %+v", turns)
	}
	if second.CachedTokens <= 0 || 2*second.CachedTokens <= second.PromptTokens || second.EvaluatedTokens != second.PromptTokens-second.CachedTokens {
		t.Errorf("the second ask reused %d of %d prompt tokens (%.1f%%), evaluated %d; want most of the prompt",
			second.CachedTokens, second.PromptTokens, second.ReusePercent, second.EvaluatedTokens)
	}
	// The session is the daemon's, and coder's: it holds both turns.
	if st, err := client.New(sock, client.WithToken(tok)).Session(t.Context(), first.Session); err != nil || len(st.Turns) != 2 {
		t.Errorf("session %s on the daemon: %v, %+v", first.Session, err, st)
	}

	// A codex loaded whole is not searched: the daemon's error, as a tool error.
	if res := mcptest.Call(t, cs, "search_codex", map[string]any{"query": "Handler3"}); !res.IsError || !strings.Contains(mcptest.Text(res), "not indexed for search") || !strings.Contains(mcptest.Text(res), "HTTP 409") {
		t.Errorf("search_codex of a codex loaded whole: error %v, %q", res.IsError, mcptest.Text(res))
	}
	if res := mcptest.Call(t, cs, "status", nil); res.IsError || !json.Valid([]byte(mcptest.Text(res))) || !strings.Contains(mcptest.Text(res), `"codex"`) {
		t.Errorf("status: %.300s", mcptest.Text(res))
	}
	checkCodexResources(t, cs, codex)

	// A codex too large to load whole is retrieved from, and searched.
	big := codexDir(t, 40000)
	st, err := d.client.LoadCodex(t.Context(), big, nil)
	if err != nil || st.Plan.Mode != "rag" {
		t.Fatalf("load a larger codex: %v, %+v", err, st)
	}
	res := mcptest.Call(t, cs, "search_codex", map[string]any{"query": "Handler12 kind", "k": 2})
	var found struct {
		Excerpts []struct{ Path, Lines, Text string } `json:"excerpts"`
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &found); err != nil || res.IsError || len(found.Excerpts) != 2 ||
		!strings.Contains(found.Excerpts[0].Text, "Handler12") || !strings.Contains(mcptest.Text(res), found.Excerpts[0].Path+":"+found.Excerpts[0].Lines) {
		t.Errorf("search_codex of a codex retrieved from: %v %s\n%.500s", err, b, mcptest.Text(res))
	}
	// The resources follow the codex the daemon holds now.
	checkCodexResources(t, cs, big)

	// Bad input is an error the agent can read, and the server goes on.
	if res := mcptest.Call(t, cs, "search_codex", map[string]any{"query": "x", "k": 99}); !res.IsError || !strings.Contains(mcptest.Text(res), "maximum") {
		t.Errorf("search_codex with k 99: error %v, %q", res.IsError, mcptest.Text(res))
	}
	if _, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: "ctxd-codex:///no/such/file.go"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("read of a file the codex does not hold: %v", err)
	}
	if res := mcptest.Call(t, cs, "status", nil); res.IsError {
		t.Errorf("status after bad input: %s", mcptest.Text(res))
	}
}

// checkCodexResources lists the codex's files as resources and reads one,
// comparing it with the file on disk.
func checkCodexResources(t *testing.T, cs *mcp.ClientSession, dir string) {
	t.Helper()
	res, err := cs.ListResources(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range res.Resources {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{"README.md", "handlers.go"}) {
		t.Fatalf("codex resources %v", names)
	}
	got, err := cs.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: res.Resources[1].URI})
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "handlers.go"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Contents) != 1 || got.Contents[0].Text != string(want) || got.Contents[0].MIMEType != "text/plain" || res.Resources[1].Size != int64(len(want)) {
		t.Errorf("read %s: %d contents, %d bytes (listed as %d), want the %d bytes on disk", res.Resources[1].URI, len(got.Contents), len(got.Contents[0].Text), res.Resources[1].Size, len(want))
	}
}

// mcpSession runs `ctxd mcp` with args and env (KEY=VALUE) and connects
// to it as an MCP client launching it would. Its stderr is logged when the
// test fails.
func mcpSession(t *testing.T, bin string, env []string, args ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"mcp"}, args...)...)
	cmd.Env = append(append(os.Environ(), "CTXD_TOKEN=", "CTXD_SOCKET="), env...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "ctxd-integration", Version: "test"}, nil).
		Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to %v: %v\n%s", cmd.Args, err, stderr.String())
	}
	t.Cleanup(func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close %v: %v", cmd.Args, err)
		}
		if t.Failed() {
			t.Logf("stderr of %v:\n%s", cmd.Args, stderr.String())
		}
	})
	return cs
}

// lockedBuffer is a bytes.Buffer a subprocess's output goroutine and the
// test can share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestMCPOverHTTPWithTheNpmClient: the daemon's streamable HTTP endpoint
// (/v1/mcp on the TCP listener, with a token) serves the official MCP
// TypeScript SDK's client what `ctxd mcp` serves it over stdio.
func TestMCPOverHTTPWithTheNpmClient(t *testing.T) {
	needOllama(t)
	node := needNode(t)
	_, base, tok := doorsDaemon(t)
	checkMCPClient(t, node, []string{"CTXD_MCP_URL=" + base + "/v1/mcp", "CTXD_TOKEN=" + tok})
}
