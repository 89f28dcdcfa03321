package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readmeBlock is the sh block between the README's markers.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	return readmeCode(t, name, "sh")
}

// readmeCode is the first code block in lang between the README's markers.
func readmeCode(t *testing.T, name, lang string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "<!-- "+name+":begin")
	j := strings.Index(s, "<!-- "+name+":end -->")
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s block", name)
	}
	block := s[i:j]
	fence := "```" + lang + "\n"
	start := strings.Index(block, fence)
	if start < 0 {
		t.Fatalf("README.md's %s block has no %s code", name, lang)
	}
	code := block[start+len(fence):]
	end := strings.Index(code, "```")
	if end < 0 {
		t.Fatalf("README.md's %s block has an unclosed %s fence", name, lang)
	}
	return code[:end]
}

// TestReadmeDoors runs the README's commands for pointing agents at ctxd,
// as written, against a real daemon with the TCP listener on: only the
// address and the token the reader would paste are this daemon's.
func TestReadmeDoors(t *testing.T) {
	needOllama(t)
	needNode(t)
	if _, err := os.Stat(filepath.Join("..", "bin", "ollama")); err != nil {
		t.Skipf("the README runs bin/ollama, which `make ollama` builds: %v", err)
	}
	_, base, tok := doorsDaemon(t)
	block := readmeBlock(t, "doors")
	if !strings.Contains(block, "http://127.0.0.1:11435") || !strings.Contains(block, "CTXD_TOKEN=ctxd_...") {
		t.Fatalf("the block no longer sets the address and token this test replaces:\n%s", block)
	}
	block = strings.Replace(block, "http://127.0.0.1:11435", base, 1)
	block = strings.Replace(block, "CTXD_TOKEN=ctxd_...", "CTXD_TOKEN="+tok, 1)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", block)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	t.Logf("README block output:\n%s", out)
	if err != nil {
		t.Fatalf("the README's commands failed: %v", err)
	}
	got := string(out)
	for _, want := range []string{`"object":"chat.completion"`, `"cached_tokens"`, `"done":true`, `"ignored":["options.num_ctx"]`} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %s", want)
		}
	}
	// The openai agent's and the ollama library's second question reuse
	// the first exchange.
	for _, who := range []string{"turn", "ollama turn"} {
		m := regexp.MustCompile(`\[` + who + ` 2: (\d+) prompt tokens, (\d+) cached`).FindStringSubmatch(got)
		if m == nil {
			t.Errorf("%q: no second turn printed", who)
			continue
		}
		prompt, _ := strconv.Atoi(m[1])
		cached, _ := strconv.Atoi(m[2])
		if float64(cached) < 0.9*float64(prompt) {
			t.Errorf("%q: the second turn reused %d of %d tokens", who, cached, prompt)
		}
	}
}

// TestReadmeMCP gives an MCP client nobody here wrote, the official MCP
// TypeScript SDK's, the README's server config as a desktop client reads
// it, and runs the README's hand-made MCP session, against a real daemon.
// Only the path of ctxd, the token and the socket (the daemon under test
// does not listen at the default one) are this test's.
func TestReadmeMCP(t *testing.T) {
	needOllama(t)
	node := needNode(t)
	bin := buildCtxd(t)
	r, _, tok := doorsDaemon(t)
	sock := r.cfg.Daemon.Socket

	raw := readmeCode(t, "mcp", "json")
	if !strings.Contains(raw, `"/home/you/ctxd/bin/ctxd"`) || !strings.Contains(raw, `"ctxd_..."`) {
		t.Fatalf("the config no longer holds the path and token this test replaces:\n%s", raw)
	}
	raw = strings.Replace(raw, "/home/you/ctxd/bin/ctxd", bin, 1)
	raw = strings.Replace(raw, "ctxd_...", tok, 1)
	var cfg struct {
		MCPServers map[string]struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("the README's MCP config is not JSON: %v\n%s", err, raw)
	}
	server := cfg.MCPServers["ctxd"]
	server.Env["CTXD_SOCKET"] = sock // as the README says to add where the client lacks XDG_RUNTIME_DIR
	cfg.MCPServers["ctxd"] = server
	js, _ := json.Marshal(cfg)

	checkMCPClient(t, node, []string{"CTXD_MCP_CONFIG=" + string(js)})

	// The hand-made session, as written but for the binary's path.
	block := readmeBlock(t, "mcp")
	if !strings.Contains(block, "| bin/ctxd mcp") {
		t.Fatalf("the block no longer runs bin/ctxd mcp:\n%s", block)
	}
	block = strings.Replace(block, "| bin/ctxd mcp", "| "+bin+" mcp", 1)
	cmd := exec.CommandContext(t.Context(), "bash", "-euo", "pipefail", "-c", block)
	cmd.Env = append(os.Environ(), "CTXD_SOCKET="+sock, "CTXD_TOKEN="+tok)
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("the README's MCP session: %v\n%s", err, got)
	}
	type rpcLine struct {
		Result struct {
			ServerInfo struct{ Name string } `json:"serverInfo"`
			Tools      []struct{ Name string }
		} `json:"result"`
	}
	var lines []rpcLine
	for _, l := range strings.Split(strings.TrimSpace(string(got)), "\n") {
		var one rpcLine
		if err := json.Unmarshal([]byte(l), &one); err != nil {
			t.Fatalf("the README's MCP session printed %q: %v", l, err)
		}
		lines = append(lines, one)
	}
	if len(lines) != 2 || lines[0].Result.ServerInfo.Name != "ctxd" || len(lines[1].Result.Tools) != 3 {
		t.Errorf("the README's MCP session printed:\n%s", got)
	}
}

// checkMCPClient runs the MCP TypeScript SDK's client (mcp-client.mjs)
// with env against a daemon of doorsDaemon and checks what it got: the
// tools of sigil agent's scopes, two asks in one session (the second
// reusing the first's prompt), the status, the codex's files as
// resources, and an MCP error for each bad input, after which the server
// still serves.
func checkMCPClient(t *testing.T, node string, env []string) {
	t.Helper()
	type toolResult struct {
		IsError bool   `json:"isError"`
		Thrown  bool   `json:"thrown"`
		Code    int    `json:"code"`
		Text    string `json:"text"`
	}
	type mcpClientRun struct {
		Fatal  string   `json:"fatal"`
		Tools  []string `json:"tools"`
		Server struct{ Name string }
		Asks   []struct {
			IsError bool   `json:"isError"`
			Text    string `json:"text"`
			Summary struct {
				Session      string `json:"session"`
				Turn         int    `json:"turn"`
				PromptTokens int    `json:"prompt_tokens"`
				CachedTokens int    `json:"cached_tokens"`
			} `json:"summary"`
		}
		Status struct {
			IsError bool `json:"isError"`
			JSON    struct {
				Ready bool `json:"ready"`
			} `json:"json"`
		}
		Resources   []string              `json:"resources"`
		Readme      string                `json:"readme"`
		Errors      map[string]toolResult `json:"errors"`
		AfterErrors bool                  `json:"after_errors"`
	}
	var out mcpClientRun
	runNode(t, node, "mcp-client.mjs", env, &out)
	if out.Fatal != "" {
		t.Fatalf("the MCP client failed: %s", out.Fatal)
	}
	if out.Server.Name != "ctxd" || !slices.Equal(out.Tools, []string{"ask", "search_codex", "status"}) {
		t.Errorf("server %+v offers %v; want ask, search_codex and status (the token's sigil has search_codex)", out.Server, out.Tools)
	}
	if len(out.Asks) != 2 {
		t.Fatalf("%d asks", len(out.Asks))
	}
	for i, a := range out.Asks {
		if a.IsError || a.Text == "" || a.Summary.Session != "mcp-npm" || a.Summary.Turn != i+1 {
			t.Errorf("ask %d: %+v", i+1, a)
		}
	}
	if s := out.Asks[1].Summary; 2*s.CachedTokens <= s.PromptTokens {
		t.Errorf("the second ask reused %d of %d prompt tokens; want most", s.CachedTokens, s.PromptTokens)
	}
	if out.Status.IsError || !out.Status.JSON.Ready {
		t.Errorf("status: %+v", out.Status)
	}
	if !slices.Equal(out.Resources, []string{"ctxd-codex:///README.md", "ctxd-codex:///handlers.go"}) || !strings.Contains(out.Readme, "# Handlers") {
		t.Errorf("resources %v, README.md read as %q", out.Resources, out.Readme)
	}
	for name, e := range out.Errors {
		t.Logf("bad input %s: %+v", name, e)
	}
	for name, want := range map[string]string{
		"search_cag":       "not indexed for search", // the daemon's error, as a tool error
		"missing_query":    "query",
		"bad_session":      "session",
		"unknown_tool":     "rm_rf",
		"unknown_resource": "not found",
	} {
		got := out.Errors[name]
		if !(got.IsError || got.Thrown) || !strings.Contains(strings.ToLower(got.Text), want) {
			t.Errorf("%s: the client got %+v; want an error naming %q", name, got, want)
		}
	}
	if out.AfterErrors {
		t.Error("status failed after the bad input: the server did not stay up")
	}
}
