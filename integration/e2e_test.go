package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/socktest"
)

// askB asks in session "bench" and returns the summary.
func askB(d *running, query string) (*ctxd.Summary, error) {
	return d.client.Ask(context.Background(), ctxd.AskRequest{Session: "bench", Query: query}, nil)
}

// askAndCancel asks and goes away (cancels) after the answer's third
// piece, and returns how many pieces came; it skips the test if the answer
// ended on its own first (nothing to observe).
func askAndCancel(t *testing.T, c *client.Client, session, query string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pieces := 0
	_, err := c.Ask(ctx, ctxd.AskRequest{Session: session, Query: query}, func(string) {
		if pieces++; pieces == 3 {
			cancel()
		}
	})
	if err == nil {
		t.Skipf("the answer ended on its own after %d pieces, before the cancel: nothing to observe", pieces)
	}
	return pieces
}

func ask(t *testing.T, c *client.Client, session, query string) (*ctxd.Summary, string) {
	t.Helper()
	var sb strings.Builder
	sum, err := c.Ask(context.Background(), ctxd.AskRequest{Session: session, Query: query}, func(s string) { sb.WriteString(s) })
	if err != nil {
		t.Fatalf("ask %q: %v", query, err)
	}
	return sum, sb.String()
}

// TestSessionReusesPrefixAndSurvivesRestart runs a 3-turn session through
// the socket on the real Ollama, then restarts the daemon and continues.
func TestSessionReusesPrefixAndSurvivesRestart(t *testing.T) {
	needOllama(t)
	state := t.TempDir()
	sessionSurvivesRestart(t, baseConfig(t, state, codexDir(t, 4500)))
}

// TestSessionOnLlamaServerSurvivesRestart is the same on llama-server.
func TestSessionOnLlamaServerSurvivesRestart(t *testing.T) {
	needLlamaServer(t)
	sessionSurvivesRestart(t, llamaConfig(t, t.TempDir(), codexDir(t, 4500)))
}

// sessionSurvivesRestart runs a 3-turn session through the socket, then
// restarts the daemon and continues it.
func sessionSurvivesRestart(t *testing.T, cfg config.Config) {
	d := start(t, cfg, true)

	var prev *ctxd.Summary
	queries := []string{"What does Handler3 return?", "Which handler serves kind 7?", "Summarize the README."}
	for i, q := range queries {
		sum, answer := ask(t, d.client, "e2e", q)
		t.Logf("turn %d: %d prompt tokens, %d cached (%.1f%%), backend prompt_eval_count %d, ttft %.1f ms, backend prompt eval %.1f ms, answer %q",
			sum.Turn, sum.PromptTokens, sum.CachedTokens, sum.ReusePercent, sum.BackendPromptN, sum.TTFTMillis, sum.PromptEvalMs, answer)
		if sum.Turn != i+1 || sum.Mode != "cag" || sum.Session != "e2e" {
			t.Fatalf("turn %d summary: %+v", i+1, sum)
		}
		// Ollama v0.6.5 counts cached tokens in prompt_eval_count, so this
		// checks ctxd's tokenizer against the runner's, token for token.
		if sum.BackendPromptN != sum.PromptTokens {
			t.Errorf("turn %d: ctxd counted %d prompt tokens, the backend %d", i+1, sum.PromptTokens, sum.BackendPromptN)
		}
		if sum.PromptTokens+sum.Budget.AnswerReserve > sum.Budget.NumCtx {
			t.Errorf("turn %d: %d prompt tokens + %d reserve exceed num_ctx %d", i+1, sum.PromptTokens, sum.Budget.AnswerReserve, sum.Budget.NumCtx)
		}
		if i == 0 {
			if sum.CachedTokens != 0 || sum.PrefixNote == "" {
				t.Errorf("turn 1: %d cached tokens, note %q", sum.CachedTokens, sum.PrefixNote)
			}
		} else {
			if sum.PrefixBreak != nil {
				t.Errorf("turn %d broke the prefix: %+v", i+1, sum.PrefixBreak)
			}
			if sum.CachedTokens != prev.PromptTokens {
				t.Errorf("turn %d: %d cached tokens, want the whole previous prompt (%d)", i+1, sum.CachedTokens, prev.PromptTokens)
			}
			if sum.ReusePercent < 95 {
				t.Errorf("turn %d reuses %.1f%% of the prompt, want at least 95%%", i+1, sum.ReusePercent)
			}
		}
		prev = sum
	}

	// The exact prompt the last turn sent, block by block.
	var lp ctxd.LastPrompt
	if err := d.client.GetJSON(context.Background(), "/v1/sessions/e2e/prompt", &lp); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(lp.Prompt, "### IDENTITY") || !strings.Contains(lp.Prompt, queries[1]) || !strings.HasSuffix(lp.Prompt, queries[2]+"\n### ASSISTANT\n") {
		t.Errorf("last prompt of e2e:\n%.300s\n...\n%s", lp.Prompt, lp.Prompt[max(0, len(lp.Prompt)-300):])
	}
	if n := len(lp.Blocks); n != 7 || lp.Blocks[0].Offset != 0 || lp.Blocks[n-1].Offset+lp.Blocks[n-1].Bytes != len(lp.Prompt) || lp.Blocks[n-1].Name != "query" {
		t.Errorf("blocks of the last prompt: %+v (prompt %d bytes)", lp.Blocks, len(lp.Prompt))
	}

	if err := d.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	d2 := start(t, cfg, true)
	var sess struct {
		Turns []struct{ Query, Answer string } `json:"turns"`
	}
	if err := d2.client.GetJSON(context.Background(), "/v1/sessions/e2e", &sess); err != nil {
		t.Fatal(err)
	}
	if len(sess.Turns) != 3 || sess.Turns[2].Query != queries[2] {
		t.Fatalf("after restart the session has %d turns: %+v", len(sess.Turns), sess.Turns)
	}
	sum, _ := ask(t, d2.client, "e2e", "And after the restart?")
	if sum.Turn != 4 || sum.PrefixNote == "" {
		t.Errorf("turn after restart: %+v", sum)
	}
	if sum.BackendPromptN != sum.PromptTokens {
		t.Errorf("after restart: ctxd counted %d prompt tokens, the backend %d", sum.PromptTokens, sum.BackendPromptN)
	}
}

// raw sends a request over the socket and returns status and body.
func raw(t *testing.T, socket, method, path, contentType string, body []byte) (int, string) {
	t.Helper()
	return socktest.Do(t, socket, method, path, contentType, string(body))
}

func TestBadInputGetsClearErrors(t *testing.T) {
	needOllama(t)
	badInputGetsClearErrors(t, baseConfig(t, t.TempDir(), codexDir(t, 2000)))
}

// TestBadInputOnLlamaServer is the same on llama-server.
func TestBadInputOnLlamaServer(t *testing.T) {
	needLlamaServer(t)
	badInputGetsClearErrors(t, llamaConfig(t, t.TempDir(), codexDir(t, 2000)))
}

func badInputGetsClearErrors(t *testing.T, cfg config.Config) {
	cfg.Daemon.MaxBodyBytes = 64 << 10
	cfg.Limits.MaxChars = 40000
	d := start(t, cfg, true)
	sock := cfg.Daemon.Socket
	big := `{"session":"s","query":"` + strings.Repeat("x", 70<<10) + `"}`
	var words strings.Builder
	for i := 0; words.Len() < 30000; i++ {
		fmt.Fprintf(&words, "Handler%d kind%d ", i, i*7)
	}
	overWindow := `{"session":"s","query":"` + words.String() + `"}`
	overChars := `{"session":"s","query":"` + strings.Repeat("y", 45000) + `"}`
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		mention                         string
	}{
		{"malformed JSON", "POST", "/v1/ask", "application/json", `{"session": "s", "query": `, 400, "malformed JSON"},
		{"missing query", "POST", "/v1/ask", "application/json", `{"session": "s"}`, 400, "query"},
		{"blank query", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "  "}`, 400, "query"},
		{"missing session", "POST", "/v1/ask", "application/json", `{"query": "hi"}`, 400, "session"},
		{"bad session format", "POST", "/v1/ask", "application/json", `{"session": "../../etc", "query": "hi"}`, 400, "session"},
		{"unknown field", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi", "temperature": 2}`, 400, "temperature"},
		{"two values", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi"} {}`, 400, "follows the JSON value"},
		{"empty body", "POST", "/v1/ask", "application/json", ``, 400, "empty body"},
		{"wrong content type", "POST", "/v1/ask", "text/plain", `{"session": "s", "query": "hi"}`, 415, "application/json"},
		{"oversized body", "POST", "/v1/ask", "application/json", big, 413, "max_body_bytes"},
		{"over the window", "POST", "/v1/ask", "application/json", overWindow, 422, "reserved for the answer"},
		{"over the char cap", "POST", "/v1/ask", "application/json", overChars, 422, "over the cap of 40000"},
		{"unknown sigil", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi", "sigil": "root"}`, 403, "root"},
		{"unknown route", "GET", "/v2/ask", "", ``, 404, "no route"},
		{"wrong method", "GET", "/v1/ask", "", ``, 405, "use POST"},
		{"bad session id in path", "GET", "/v1/sessions/a%20b", "", ``, 400, "session"},
		{"prompt of a bad session id", "GET", "/v1/sessions/a%20b/prompt", "", ``, 400, "session"},
		{"prompt of a session that sent none", "GET", "/v1/sessions/never/prompt", "", ``, 404, "sent no prompt"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := raw(t, sock, c.method, c.path, c.ctype, []byte(c.body))
			if status != c.status {
				t.Fatalf("status %d, want %d; body %s", status, c.status, body)
			}
			if c.mention != "" && !strings.Contains(body, c.mention) {
				t.Errorf("body %s does not mention %q", body, c.mention)
			}
			var e struct{ Error string }
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" {
				t.Errorf("body %q is not a JSON error", body)
			}
		})
	}
	// Still up and answering after all that.
	sum, _ := ask(t, d.client, "after-errors", "still there?")
	if sum.Turn != 1 {
		t.Errorf("session after errors: %+v", sum)
	}
	if status, body := raw(t, sock, "GET", "/v1/schema", "", nil); status != 200 || !strings.Contains(body, `"RunContext"`) {
		t.Errorf("schema: %d %.200s", status, body)
	}
}

func TestSocketHygiene(t *testing.T) {
	needOllama(t)
	cfg := baseConfig(t, t.TempDir(), "")
	start(t, cfg, false)
	if _, err := daemon.Listen(cfg.Daemon.Socket); !errors.Is(err, daemon.ErrInUse) {
		t.Errorf("second daemon on a live socket: %v, want ErrInUse", err)
	}
	info, err := os.Stat(cfg.Daemon.Socket)
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", info.Mode().Perm(), err)
	}

	dir := daemontest.ShortDir(t)
	plain := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(plain, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := daemon.Listen(plain); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen on a regular file: %v", err)
	}
	if b, _ := os.ReadFile(plain); string(b) != "keep me" {
		t.Error("a non-socket path was touched")
	}

	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close() // leaves the socket file behind, as a crash would
	ln2, err := daemon.Listen(stale)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	ln2.Close()
}

func TestBackendDownOrModelMissing(t *testing.T) {
	needOllama(t)
	// External backend that is not there.
	cfg := baseConfig(t, t.TempDir(), "")
	cfg.Backend.Mode = "external"
	cfg.Backend.URL = "http://127.0.0.1:1"
	d := start(t, cfg, false)
	waitFor(t, func() bool {
		status, body := raw(t, cfg.Daemon.Socket, "GET", "/v1/health", "", nil)
		return status == 503 && strings.Contains(body, "not reachable")
	})
	status, body := raw(t, cfg.Daemon.Socket, "POST", "/v1/ask", "application/json", []byte(`{"session":"s","query":"hi"}`))
	if status != 503 || !strings.Contains(body, "not reachable") {
		t.Errorf("ask with the backend down: %d %s", status, body)
	}
	_ = d

	// A real server that lacks the model.
	srv := ollamatest.Start(t)
	cfg2 := baseConfig(t, t.TempDir(), "")
	cfg2.Backend.Mode = "external"
	cfg2.Backend.URL = srv.URL().String()
	cfg2.Backend.Model = "no-such-model"
	start(t, cfg2, false)
	waitFor(t, func() bool {
		status, body := raw(t, cfg2.Daemon.Socket, "POST", "/v1/ask", "application/json", []byte(`{"session":"s","query":"hi"}`))
		return status == 503 && strings.Contains(body, "no-such-model") && strings.Contains(body, "not found")
	})
	if status, _ := raw(t, cfg2.Daemon.Socket, "GET", "/v1/status", "", nil); status != 200 {
		t.Errorf("status while the model is missing: %d", status)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWindowThatCannotFitStopsStartUp: an explicit num_ctx whose KV cache
// does not fit the memory ends Run with the numbers, as documented, rather
// than retrying for ever.
// TestLlamaServerDownOrModelMissing: an external llama-server that is not
// there is a 503 naming it while the daemon stays up; a managed one whose
// model file is missing, or an external one whose backend.gguf names a
// missing file, stops start-up with an error naming the key to fix.
func TestLlamaServerDownOrModelMissing(t *testing.T) {
	needLlamaServer(t)
	cfg := llamaConfig(t, t.TempDir(), "")
	cfg.Backend.Mode, cfg.Backend.URL = "external", "http://127.0.0.1:1"
	start(t, cfg, false)
	waitFor(t, func() bool {
		status, body := raw(t, cfg.Daemon.Socket, "GET", "/v1/health", "", nil)
		return status == 503 && strings.Contains(body, "not reachable")
	})
	if status, body := raw(t, cfg.Daemon.Socket, "POST", "/v1/ask", "application/json", []byte(`{"session":"s","query":"hi"}`)); status != 503 || !strings.Contains(body, "not reachable") {
		t.Errorf("ask with llama-server down: %d %s", status, body)
	}

	missing := llamaConfig(t, t.TempDir(), "")
	missing.Backend.GGUF = filepath.Join(t.TempDir(), "gone.gguf")
	if err := runUntilStopped(t, missing); err == nil || !strings.Contains(err.Error(), "backend.gguf") || !strings.Contains(err.Error(), "gone.gguf") {
		t.Errorf("managed llama-server without its model file: Run ended with %v", err)
	}

	// An external server with backend.gguf naming a file that is not
	// there: the key is wrong, and the error says so. (With the key empty,
	// ctxd counts through the server: TestExternalLlamaServerWithoutTheModelFile.)
	model := modelPath(t, testModel())
	copied := filepath.Join(t.TempDir(), "copy.gguf")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, data, 0o644); err != nil {
		t.Fatal(err)
	}
	url := llamaservertest.Start(t, copied, "-c", "2048")
	if err := os.Remove(copied); err != nil {
		t.Fatal(err)
	}
	unreadable := llamaConfig(t, t.TempDir(), "")
	unreadable.Backend.Mode, unreadable.Backend.URL, unreadable.Backend.GGUF = "external", url, copied
	if err := runUntilStopped(t, unreadable); err == nil || !strings.Contains(err.Error(), "backend.gguf") || !strings.Contains(err.Error(), "copy.gguf") {
		t.Errorf("external llama-server with backend.gguf naming a missing file: Run ended with %v", err)
	}
}

// runUntilStopped runs a daemon that is expected to stop on its own (a
// configuration that cannot work) and returns Run's error.
func runUntilStopped(t *testing.T, cfg config.Config) error {
	t.Helper()
	if cfg.Backend.Kind == "openai" && cfg.Backend.URL == "" {
		cfg.Backend.NumCtx = 4096 // the server's; the configured one is checked against it
		startOpenAIServer(t, &cfg)
		cfg.Backend.NumCtx = 400_000_000
	}
	d, err := daemon.New(cfg, daemon.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)), BackendEnv: []string{"PATH=" + os.Getenv("PATH")}})
	if err != nil {
		return err
	}
	ln, err := daemon.Listen(cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background(), ln, nil) }()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("the daemon kept running with a configuration that cannot work")
		return nil
	}
}

func TestWindowThatCannotFitStopsStartUp(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		cfg := b.config(t, t.TempDir(), "")
		cfg.Backend.NumCtx = 400_000_000
		// ctxd plans a window in the memory it has; in front of another
		// server, it checks the window against the one the server serves.
		want := []string{"num_ctx 400000000", "free"}
		if b.name == "openai" {
			want = []string{"num_ctx = 400000000", "over the 4096 tokens the server serves"}
		}
		if err := runUntilStopped(t, cfg); err == nil || !strings.Contains(err.Error(), want[0]) || !strings.Contains(err.Error(), want[1]) {
			t.Errorf("Run ended with %v, want the numbers of the window that does not fit", err)
		}
	})
}
