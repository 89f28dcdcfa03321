package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/sigils"
)

// nodeDir is where the npm clients are installed (make test runs npm ci).
const nodeDir = "node"

// needNode skips the test when Node.js or the pinned npm clients are
// missing (and fails it when CTXD_REQUIRE_NODE is set, as make test does).
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "openai", "package.json"))
	}
	if err != nil {
		msg := "Node.js and the pinned npm clients are needed (make test installs them with npm ci in integration/node): " + err.Error()
		if os.Getenv("CTXD_REQUIRE_NODE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return node
}

// doorsDaemon is a daemon on the real Ollama with the TCP listener on and
// a token for sigil "agent"; it returns the daemon, the listener's base
// URL and the token.
func doorsDaemon(t *testing.T) (*running, string, string) {
	t.Helper()
	return doorsDaemonOn(t, baseConfig)
}

// doorsDaemonOn is doorsDaemon on the backend configOf makes.
func doorsDaemonOn(t *testing.T, configOf func(testing.TB, string, string) config.Config) (*running, string, string) {
	t.Helper()
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	cfg := configOf(t, t.TempDir(), codexDir(t, 4000))
	cfg.Daemon.TCPListen = "127.0.0.1:0"
	cfg.Sigils = map[string]config.Sigil{
		"default": {Scopes: []string{"ask"}},
		"agent":   {Scopes: []string{"ask", "search_codex"}, TokenSHA256: hash},
	}
	r := start(t, cfg, true)
	addr := r.daemon.TCPAddr()
	if addr == "" {
		t.Fatal("the TCP listener does not listen")
	}
	return r, "http://" + addr, tok
}

// modelLoads is how often the managed Ollama loaded the model, as status
// reports it from Ollama's log.
func modelLoads(t *testing.T, r *running) int {
	t.Helper()
	var st httpapi.Status
	if err := r.client.Status(t.Context(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Backend.ModelLoads == nil {
		t.Fatal("status reports no model_loads for the managed Ollama")
	}
	return *st.Backend.ModelLoads
}

// runNode runs a script of integration/node and decodes its JSON output.
func runNode(t *testing.T, node, script string, env []string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("node %s printed %q: %v", script, out, err)
	}
}

type clientError struct {
	Thrown  bool   `json:"thrown"`
	Class   string `json:"class"`
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Type    string `json:"type"`
	Message string `json:"message"`
}

// TestDoors drives ctxd's front doors with clients nobody here wrote: the
// official openai and ollama npm packages over the TCP listener, Ollama's
// own Go client, and curl on the Unix socket.
func TestDoors(t *testing.T) {
	needOllama(t)
	node := needNode(t)
	r, base, tok := doorsDaemon(t)
	model := r.cfg.Backend.Model
	// Ollama reloads a model for a client's num_ctx: counted from its log
	// (make test-openai runs the doors in front of llama-server instead).
	onOllama := r.cfg.Backend.Kind == "ollama"
	loads := 1
	if onOllama {
		loads = modelLoads(t, r)
	}
	if loads != 1 {
		t.Fatalf("the model loaded %d times at start; want 1", loads)
	}
	var conversation []map[string]string // what the OpenAI client sent last
	var door []turnFigures               // what it got, turn by turn

	t.Run("openai npm", func(t *testing.T) {
		var out struct {
			Turns []struct {
				clientUsage
				Turn             int    `json:"turn"`
				CompletionTokens int    `json:"completion_tokens"`
				Stream           bool   `json:"stream"`
				Text             string `json:"text"`
			}
			Messages   []map[string]string
			Completion struct {
				Text         string
				PromptTokens int `json:"prompt_tokens"`
			}
			Models []string
			Errors map[string]clientError
		}
		runNode(t, node, "openai-chat.mjs", []string{"CTXD_BASE_URL=" + base + "/v1", "CTXD_TOKEN=" + tok, "CTXD_MODEL=" + model}, &out)
		if len(out.Turns) != 10 {
			t.Fatalf("%d turns", len(out.Turns))
		}
		for _, tu := range out.Turns {
			t.Logf("turn %2d stream=%-5v prompt %5d cached %5d (%.1f%%), of which the client's %d (usage) answer %d tokens", tu.Turn, tu.Stream, tu.CtxdPrompt, tu.CtxdCached,
				100*float64(tu.CtxdCached)/float64(tu.CtxdPrompt), tu.PromptTokens, tu.CompletionTokens)
			tu.check(t, tu.Turn)
			if tu.Turn >= 2 && float64(tu.CtxdCached) < 0.95*float64(tu.CtxdPrompt) {
				t.Errorf("turn %d: cached_tokens %d is under 95%% of prompt_tokens %d", tu.Turn, tu.CtxdCached, tu.CtxdPrompt)
			}
			if tu.CompletionTokens == 0 || tu.Text == "" {
				t.Errorf("turn %d: no answer", tu.Turn)
			}
		}
		if out.Completion.Text == "" || out.Completion.PromptTokens == 0 || len(out.Models) != 1 || out.Models[0] != model {
			t.Errorf("completion %+v models %v", out.Completion, out.Models)
		}
		for name, want := range map[string]clientError{
			"unknown_model":        {Class: "NotFoundError", Status: 404, Code: "model_not_found"},
			"bad_token":            {Class: "AuthenticationError", Status: 401, Code: "invalid_api_key"},
			"missing_messages":     {Class: "BadRequestError", Status: 400, Code: "invalid"},
			"over_window":          {Class: "BadRequestError", Status: 400, Code: "context_length_exceeded"},
			"oversize":             {Class: "APIError", Status: 413, Code: "too_large"},
			"stream_unknown_model": {Class: "NotFoundError", Status: 404, Code: "model_not_found"},
		} {
			got := out.Errors[name]
			if !got.Thrown || got.Status != want.Status || got.Code != want.Code || (want.Class != "APIError" && got.Class != want.Class) {
				t.Errorf("%s: the client got %+v; want %+v", name, got, want)
			}
		}

		conversation = out.Messages
		for _, tu := range out.Turns {
			door = append(door, turnFigures{tu.CtxdPrompt, tu.CtxdCached, tu.Text})
		}
	})

	t.Run("ollama npm", func(t *testing.T) {
		var out struct {
			Chats []struct {
				NumCtx     int    `json:"num_ctx"`
				Text       string `json:"text"`
				Done       bool   `json:"done"`
				DoneReason string `json:"done_reason"`
				Ctxd       struct {
					Ignored []string      `json:"ignored"`
					Summary *ctxd.Summary `json:"summary"`
				} `json:"ctxd"`
			}
			Generate struct {
				Response string
				Done     bool
			}
			List              []string
			ShowContextLength int `json:"show_context_length"`
			PS                []string
			Version           string
			Errors            map[string]clientError
		}
		runNode(t, node, "ollama-chat.mjs", []string{"CTXD_HOST=" + base, "CTXD_TOKEN=" + tok, "CTXD_MODEL=" + model}, &out)
		for i, c := range out.Chats {
			if !c.Done || c.Text == "" || c.Ctxd.Summary == nil || !contains(c.Ctxd.Ignored, "options.num_ctx") {
				t.Errorf("chat %d (num_ctx %d): %+v", i+1, c.NumCtx, c)
			} else if i > 0 && c.Ctxd.Summary.CachedTokens == 0 {
				t.Errorf("chat %d: nothing reused", i+1)
			}
		}
		if !out.Generate.Done || out.Generate.Response == "" || len(out.List) != 1 || out.ShowContextLength != r.cfg.Backend.NumCtx || len(out.PS) != 1 || out.Version == "" {
			t.Errorf("generate %+v list %v show context_length %d ps %v version %q", out.Generate, out.List, out.ShowContextLength, out.PS, out.Version)
		}
		for name, want := range map[string]clientError{
			"unknown_model": {Status: 404, Message: `model "llama3" not found`},
			"bad_token":     {Status: 401, Message: "matches no sigil"},
			"over_window":   {Status: 422, Message: "token"},
			"format":        {Status: 400, Message: "format"},
			"oversize":      {Status: 413, Message: "over the cap"},
		} {
			got := out.Errors[name]
			if !got.Thrown || got.Class != "ResponseError" || got.Status != want.Status || !strings.Contains(got.Message, want.Message) {
				t.Errorf("%s: the client got %+v; want status %d and %q", name, got, want.Status, want.Message)
			}
		}
	})

	t.Run("ollama go client", func(t *testing.T) {
		u, _ := url.Parse(base)
		c := api.NewClient(u, &http.Client{Transport: bearer{tok}})
		var text strings.Builder
		var last api.ChatResponse
		err := c.Chat(t.Context(), &api.ChatRequest{Model: model, Messages: []api.Message{{Role: "user", Content: "Which handler serves kind 7?"}},
			Options: map[string]any{"num_ctx": 8192, "num_batch": 32}}, func(r api.ChatResponse) error {
			text.WriteString(r.Message.Content)
			last = r
			return nil
		})
		if err != nil || !last.Done || text.Len() == 0 || last.PromptEvalCount == 0 {
			t.Fatalf("chat: %v %+v", err, last)
		}
		list, err := c.List(t.Context())
		if err != nil || len(list.Models) != 1 {
			t.Errorf("list: %+v %v", list, err)
		}
		if _, err := c.Show(t.Context(), &api.ShowRequest{Model: model}); err != nil {
			t.Errorf("show: %v", err)
		}
		if v, err := c.Version(t.Context()); err != nil || v == "" {
			t.Errorf("version %q %v", v, err)
		}
		err = c.Chat(t.Context(), &api.ChatRequest{Model: "nope", Messages: []api.Message{{Role: "user", Content: "hi"}}}, func(api.ChatResponse) error { return nil })
		if err == nil || !strings.Contains(err.Error(), `model "nope" not found`) {
			t.Errorf("unknown model: %v", err)
		}
		// Not streamed, the client returns a StatusError with the status.
		_, err = c.Show(t.Context(), &api.ShowRequest{Model: "nope"})
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != 404 || !strings.Contains(se.ErrorMessage, `"nope" not found`) {
			t.Errorf("show an unknown model: %v", err)
		}
	})

	t.Run("ollama cli", func(t *testing.T) {
		// The ollama CLI sends no header: its base URL carries the token.
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		for _, args := range [][]string{{"run", "ctxd", "Which handler serves kind 4?"}, {"list"}, {"show", "ctxd"}, {"ps"}} {
			cmd := exec.CommandContext(ctx, ollamatest.Binary(t), args...) // the ollama CLI, as a client of the Ollama door
			cmd.Env = append(os.Environ(), "OLLAMA_HOST="+base+"/t/"+tok)
			out, err := cmd.CombinedOutput()
			t.Logf("ollama %s:\n%s", strings.Join(args, " "), out)
			if err != nil {
				t.Errorf("ollama %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})

	t.Run("curl on the socket", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("curl not found")
		}
		out, err := exec.Command(curl, "-sS", "--unix-socket", r.cfg.Daemon.Socket, "http://ctxd/v1/ask",
			"-H", "Content-Type: application/json", "-d", `{"session":"curl","query":"What does Handler3 return?"}`).Output()
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var last ctxd.Event
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Type != ctxd.EventSummary || last.Summary.PromptTokens == 0 {
			t.Errorf("curl ask: %q %v", lines[len(lines)-1], err)
		}
		out, _ = exec.Command(curl, "-sS", "-w", "\n%{http_code}", "--unix-socket", r.cfg.Daemon.Socket, "http://ctxd/v1/ask",
			"-H", "Content-Type: application/json", "-d", `{"session":`).Output()
		if !strings.Contains(string(out), `"kind": "invalid"`) || !strings.HasSuffix(string(out), "400") {
			t.Errorf("curl malformed body: %s", out)
		}
		// The doors' shapes for a malformed body, on the socket.
		for path, want := range map[string]string{
			"/v1/chat/completions": `{"error":{"message":"malformed JSON body`,
			"/api/chat":            `{"error":"malformed JSON body`,
		} {
			out, _ = exec.Command(curl, "-sS", "-w", "\n%{http_code}", "--unix-socket", r.cfg.Daemon.Socket, "http://ctxd"+path, "-d", `{"model":`).Output()
			if !strings.HasPrefix(string(out), want) || !strings.HasSuffix(string(out), "400") {
				t.Errorf("curl %s with a malformed body: %s", path, out)
			}
		}
	})

	if onOllama {
		// No client's num_ctx reached Ollama: the model never reloaded.
		if n := modelLoads(t, r); n != loads {
			t.Errorf("the model loaded %d times during the test (clients sent num_ctx 2048, 8192, 4096): want none", n-loads)
		}
		log, err := os.ReadFile(filepath.Join(r.cfg.Daemon.StateDir, "ollama", "ollama.log"))
		// Ollama's scheduler logs this line once for every runner it starts.
		if n := strings.Count(string(log), `msg="loaded runners"`); err != nil || n != 1 {
			t.Errorf("ollama.log shows %d model loads (%v); want 1", n, err)
		}
	}

	if len(door) == 10 {
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		t.Run("native reports the same", func(t *testing.T) { compareWithNative(t, r.cfg, tok, conversation, door) })
	}
}

// TestOpenAIDoorOnLlamaServer: the same 10-turn conversation through the
// OpenAI door with the openai npm client, on llama-server, which reports
// how many prompt tokens it reused: usage.cached_tokens is that measured
// figure, and it stays at least 95% of the prompt from turn 2 on.
func TestOpenAIDoorOnLlamaServer(t *testing.T) {
	needLlamaServer(t)
	node := needNode(t)
	r, base, tok := doorsDaemonOn(t, llamaConfig)
	var out struct {
		Turns []struct {
			clientUsage
			Turn                int  `json:"turn"`
			Stream              bool `json:"stream"`
			CompletionTokens    int  `json:"completion_tokens"`
			BackendCachedTokens *int `json:"backend_cached_tokens"`
		}
	}
	runNode(t, node, "openai-chat.mjs", []string{"CTXD_BASE_URL=" + base + "/v1", "CTXD_TOKEN=" + tok, "CTXD_MODEL=" + r.cfg.Backend.Model}, &out)
	if len(out.Turns) != 10 {
		t.Fatalf("%d turns", len(out.Turns))
	}
	for _, tu := range out.Turns {
		if tu.BackendCachedTokens == nil {
			t.Fatalf("turn %d: no measured reuse from llama-server", tu.Turn)
		}
		measured := *tu.BackendCachedTokens
		t.Logf("turn %2d stream=%-5v prompt %5d cached %5d (%.1f%%, measured by llama-server) answer %d tokens", tu.Turn, tu.Stream,
			tu.CtxdPrompt, measured, 100*float64(measured)/float64(tu.CtxdPrompt), tu.CompletionTokens)
		tu.check(t, tu.Turn)
		if tu.Evaluated != tu.CtxdPrompt-measured {
			t.Errorf("turn %d: evaluated %d is not the prompt %d less llama-server's measured reuse %d", tu.Turn, tu.Evaluated, tu.CtxdPrompt, measured)
		}
		if tu.Turn >= 2 && float64(measured) < 0.95*float64(tu.CtxdPrompt) {
			t.Errorf("turn %d: llama-server reused %d of %d prompt tokens; want at least 95%%", tu.Turn, measured, tu.CtxdPrompt)
		}
		if tu.CompletionTokens == 0 {
			t.Errorf("turn %d: no answer", tu.Turn)
		}
	}
}

// turnFigures is what one turn reported.
type turnFigures struct {
	prompt, cached int
	text           string
}

// compareWithNative asks the conversation's questions through the native
// API, as the same sigil, on a fresh daemon (the first request of each
// daemon evaluates the stable blocks cold, so both compute the same
// tensors in the same order and answer alike), and checks that it reports
// the reuse the OpenAI door reported, turn by turn.
func compareWithNative(t *testing.T, cfg config.Config, token string, conversation []map[string]string, door []turnFigures) {
	cfg.Daemon.StateDir = t.TempDir()
	cfg.Daemon.Socket = filepath.Join(daemontest.ShortDir(t), "ctxd.sock")
	r := start(t, cfg, true)
	c := client.New(cfg.Daemon.Socket, client.WithToken(token))
	system := conversation[0]["content"]
	for i, d := range door {
		var sb strings.Builder
		sum, err := c.Ask(t.Context(), ctxd.AskRequest{Session: "native", System: system, Query: conversation[1+2*i]["content"]}, func(s string) { sb.WriteString(s) })
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("turn %2d: native %d of %d cached, OpenAI door %d of %d", i+1, sum.CachedTokens, sum.PromptTokens, d.cached, d.prompt)
		if sb.String() != d.text {
			t.Fatalf("turn %d: the native answer %q differs from the door's %q: the figures cannot be compared", i+1, sb.String(), d.text)
		}
		if i > 0 && (sum.CachedTokens != d.cached || sum.PromptTokens != d.prompt) {
			t.Errorf("turn %d: native reports %d of %d tokens cached, the OpenAI door %d of %d", i+1, sum.CachedTokens, sum.PromptTokens, d.cached, d.prompt)
		}
	}
	_ = r
}

// askText asks through the native API and returns the summary and answer.
func askText(t *testing.T, r *running, req ctxd.AskRequest) (*ctxd.Summary, string) {
	t.Helper()
	var sb strings.Builder
	sum, err := r.client.Ask(t.Context(), req, func(s string) { sb.WriteString(s) })
	if err != nil {
		t.Fatal(err)
	}
	return sum, sb.String()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// bearer adds a sigil's token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// clientUsage is one answer's usage, as the OpenAI client got it, beside
// ctxd's own figures.
type clientUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
	CtxdPrompt   int `json:"ctxd_prompt_tokens"`
	CtxdCached   int `json:"ctxd_cached_tokens"`
	Client       int `json:"client_tokens"`
	Evaluated    int `json:"evaluated_tokens"`
}

// check holds the usage to what the doors promise: the client's own part
// of the prompt, and of it all but what the backend evaluated.
func (u clientUsage) check(t *testing.T, turn int) {
	t.Helper()
	if u.Client <= 0 || u.Client > u.CtxdPrompt || u.PromptTokens != u.Client || u.CachedTokens != max(0, u.Client-u.Evaluated) {
		t.Errorf("turn %d: usage %+v is not the client's part of the prompt", turn, u)
	}
}
