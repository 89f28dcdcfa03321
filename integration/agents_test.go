package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/sigils"
)

// agentsDir holds the real coding agents, pinned in its package-lock.json
// (make test installs them with npm ci).
var agentsDir = filepath.Join("agents")

// agentQuestions are the turns each agent is given: questions about one
// area of the codex (its reader), as a user working on it asks them.
var agentQuestions = []string{
	"How does the Reader parse a quoted field?",
	"What happens in the Reader when a quote appears inside an unquoted field?",
	"How does the Reader count lines and columns for its ParseError?",
	"What does the Reader's LazyQuotes option change?",
	"How does the Reader handle a field that spans several lines?",
}

// needAgents skips the test when the pinned agents are not installed (and
// fails it when CTXD_REQUIRE_NODE is set, as make test does).
func needAgents(t *testing.T) {
	t.Helper()
	for _, p := range []string{"node_modules/opencode-ai/bin/opencode.exe", "node_modules/@qwen-code/qwen-code/cli-entry.js", "node_modules/node/bin/node"} {
		if _, err := os.Stat(filepath.Join(agentsDir, p)); err != nil {
			msg := "the real agents are needed (make test installs them with npm ci in integration/agents): " + err.Error()
			if os.Getenv("CTXD_REQUIRE_NODE") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// csvCodex is a copy of Go's encoding/csv: a real package of about 23k
// tokens, the codebase the agents work on.
func csvCodex(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatalf("go env GOROOT: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "src", "encoding", "csv")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// agentsAnswerReserve is the longest answer, as make run's: ctxd's answer
// reserve, and the cap the recorder puts on the answers an agent asks of
// raw llama-server.
const agentsAnswerReserve = 128

// agentsDaemon is a daemon on a managed llama-server with two slots (an
// agent's side requests take the other) serving the demo model trained
// for window, the TCP listener on and a token for sigil "agent" made with
// the agent preset. It returns the daemon, the listener's address and the
// token.
func agentsDaemon(t *testing.T, window int, codex string) (*running, string, string) {
	t.Helper()
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	m := modelgen.DemoConfig()
	m.Name, m.ContextLength = fmt.Sprintf("ctxd-demo-%d", window), window
	cfg := baseConfig(t, t.TempDir(), codex)
	cfg.Backend.Kind, cfg.Backend.Binary = "llamacpp", llamaservertest.Binary(t)
	cfg.Backend.GGUF, cfg.Backend.Model, cfg.Backend.NumCtx, cfg.Backend.Slots = ollamatest.Model(t, m), m.Name, window, 2
	cfg.Limits.AnswerReserve = agentsAnswerReserve
	cfg.Daemon.TCPListen = "127.0.0.1:0"
	cfg.Sigils = map[string]config.Sigil{
		"default": {Scopes: []string{"ask"}},
		"agent":   {Scopes: sigils.Presets["agent"], TokenSHA256: hash},
	}
	r := start(t, cfg, true)
	return r, r.daemon.TCPAddr(), tok
}

// exchange is one request an agent made, as the recording proxy between
// the agent and the server saw it.
type exchange struct {
	Turn      int     `json:"turn"`
	Main      bool    `json:"main"` // offers the agent's whole tool set: its conversation, not a side request
	Tools     int     `json:"tools"`
	System    int     `json:"system_chars"`
	Status    int     `json:"status"`
	HeadersMs float64 `json:"headers_ms"`     // from the request's arrival to the response's headers
	FirstMs   float64 `json:"first_token_ms"` // to the first chunk with content (or tool calls)
	DoneMs    float64 `json:"done_ms"`
	Error     string  `json:"error,omitempty"` // an error chunk, or a status other than 200
	Gone      bool    `json:"client_gone"`     // the agent went away before the answer ended (a timeout, a cancel)

	Summary *ctxd.Summary `json:"-"` // ctxd's summary (its last chunk)
	// Usage and Timings are what a raw llama-server reported.
	Usage struct {
		Prompt int `json:"prompt_tokens"`
	} `json:"-"`
	Timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	} `json:"-"`
}

// recorder is a reverse proxy that records each chat completion passing
// through it, streaming as it comes.
type recorder struct {
	upstream string // base URL
	srv      *http.Server
	addr     string
	// maxTokens, if set, caps the answers the agent asks for (as ctxd's
	// answer reserve caps them), for a server that would honour any
	// length: a random model's answers never end on their own.
	maxTokens int

	mu   sync.Mutex
	turn int
	log  []*exchange
}

func newRecorder(t *testing.T, upstream string) *recorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{upstream: upstream, addr: ln.Addr().String()}
	r.srv = &http.Server{Handler: r}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// exchanges are the requests recorded in turn.
func (r *recorder) exchanges(turn int) []*exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*exchange
	for _, e := range r.log {
		if e.Turn == turn {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) setTurn(n int) {
	r.mu.Lock()
	r.turn = n
	r.mu.Unlock()
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	arrived := time.Now()
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	e := &exchange{Turn: r.turn}
	r.log = append(r.log, e)
	n := len(r.log)
	r.mu.Unlock()
	if dir := os.Getenv("CTXD_AGENTS_DUMP"); dir != "" { // the requests as the agent sent them, to see what it does
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%03d-turn%d.json", n, e.Turn)), body, 0o644)
	}
	var shape struct {
		Tools    []json.RawMessage `json:"tools"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &shape)
	if r.maxTokens > 0 {
		var fields map[string]any
		if json.Unmarshal(body, &fields) == nil {
			for _, k := range []string{"max_tokens", "max_completion_tokens"} {
				if v, ok := fields[k].(float64); ok && int(v) > r.maxTokens {
					fields[k] = r.maxTokens
				}
			}
			if _, ok := fields["max_tokens"]; !ok {
				fields["max_tokens"] = r.maxTokens
			}
			body, _ = json.Marshal(fields)
		}
	}
	e.Tools = len(shape.Tools)
	for _, m := range shape.Messages {
		if m.Role == "system" {
			e.System += len(m.Content)
		}
	}
	out, _ := http.NewRequestWithContext(req.Context(), req.Method, r.upstream+req.URL.Path, bytes.NewReader(body))
	for k, v := range req.Header {
		out.Header[k] = v
	}
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		e.Error, e.Gone = err.Error(), req.Context().Err() != nil
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	e.Status, e.HeadersMs = resp.StatusCode, ms(time.Since(arrived))
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := w.Write(line); werr != nil || rc.Flush() != nil {
				e.Gone = true
				return
			}
			e.read(line, arrived)
		}
		if err != nil {
			break
		}
	}
	if req.Context().Err() != nil {
		e.Gone = true
	}
	e.DoneMs = ms(time.Since(arrived))
	if resp.StatusCode != http.StatusOK && e.Error == "" {
		e.Error = fmt.Sprintf("status %d", resp.StatusCode)
	}
}

// read takes one line of the answer: an SSE data line's chunk, or the
// whole body of an answer that is not streamed.
func (e *exchange) read(line []byte, arrived time.Time) {
	data := bytes.TrimSpace(bytes.TrimPrefix(line, []byte("data: ")))
	if len(data) == 0 || data[0] != '{' {
		return
	}
	var c struct {
		Choices []struct {
			Delta *struct {
				Content   *string           `json:"content"`
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"delta"`
		} `json:"choices"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
		Ctxd  *ctxd.Summary `json:"ctxd"`
		Usage *struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
		Timings *struct {
			CacheN  int `json:"cache_n"`
			PromptN int `json:"prompt_n"`
		} `json:"timings"`
	}
	if json.Unmarshal(data, &c) != nil {
		return
	}
	if c.Error != nil {
		e.Error = c.Error.Message
	}
	for _, ch := range c.Choices {
		if d := ch.Delta; d != nil && e.FirstMs == 0 && (d.Content != nil && *d.Content != "" || len(d.ToolCalls) > 0) {
			e.FirstMs = ms(time.Since(arrived))
		}
	}
	if c.Ctxd != nil {
		e.Summary = c.Ctxd
	}
	if c.Usage != nil {
		e.Usage.Prompt = c.Usage.Prompt
	}
	if c.Timings != nil {
		e.Timings.CacheN, e.Timings.PromptN = c.Timings.CacheN, c.Timings.PromptN
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// agent is one coding agent the suite runs: how to run one turn of it.
type agent struct {
	name string
	// turn runs the agent's next turn (the first if n is 1) in dir, with
	// its requests sent to base (an OpenAI base URL) with key.
	turn func(ctx context.Context, t *testing.T, n int, question, dir, base, key string) error
}

// agentHome is a home directory for one agent's run: its state and
// configuration stay there.
func agentHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	for _, d := range []string{"config", "data", "state", "cache"} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return home
}

// runAgent runs one command of an agent and fails with its output if it
// does not exit 0.
func runAgent(ctx context.Context, t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v\n%s", filepath.Base(cmd.Path), err, out.String())
	}
	t.Logf("%s: %s", filepath.Base(cmd.Path), strings.TrimSpace(lastLines(out.String(), 3)))
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// opencode is opencode (opencode-ai on npm) with ctxd as an
// OpenAI-compatible provider, as the README's opencode.json sets it up;
// its first turn also asks for a title (a side request).
func opencode(t *testing.T, window int) agent {
	home := agentHome(t)
	// opencode installs its plugin package into its config directory in
	// the background unless it is there: it is, so nothing is fetched.
	cfgDir := filepath.Join(home, "config", "opencode")
	if err := os.MkdirAll(filepath.Join(cfgDir, "node_modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"package.json":      `{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}`,
		"package-lock.json": `{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}}}`,
	} {
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin, _ := filepath.Abs(filepath.Join(agentsDir, "node_modules", "opencode-ai", "bin", "opencode.exe"))
	readme := readmeCode(t, "opencode", "json")
	return agent{name: "opencode", turn: func(ctx context.Context, t *testing.T, n int, question, dir, base, key string) error {
		conf := opencodeConfig(t, readme, base, key, window)
		args := []string{"run", "--model", "ctxd/ctxd"}
		if n > 1 {
			args = append(args, "--continue")
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir, cmd.Stdin = dir, strings.NewReader(question) // the question on stdin: opencode quotes an argument that has spaces
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, "config"), "XDG_DATA_HOME="+filepath.Join(home, "data"),
			"XDG_STATE_HOME="+filepath.Join(home, "state"), "XDG_CACHE_HOME="+filepath.Join(home, "cache"),
			"OPENCODE_CONFIG_CONTENT="+conf, "OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1")
		return runAgent(ctx, t, cmd)
	}}
}

// opencodeConfig is the README's opencode.json with this daemon's base
// URL, token and window put in, and opencode's own updates and sharing off.
func opencodeConfig(t *testing.T, readme, base, key string, window int) string {
	t.Helper()
	var conf map[string]any
	if err := json.Unmarshal([]byte(readme), &conf); err != nil {
		t.Fatalf("the README's opencode.json: %v", err)
	}
	p, _ := conf["provider"].(map[string]any)
	c, _ := p["ctxd"].(map[string]any)
	opts, _ := c["options"].(map[string]any)
	models, _ := c["models"].(map[string]any)
	m, _ := models["ctxd"].(map[string]any)
	limit, _ := m["limit"].(map[string]any)
	if opts == nil || limit == nil || conf["model"] != "ctxd/ctxd" {
		t.Fatalf("the README's opencode.json has no provider ctxd with options, a model ctxd with limits, and model ctxd/ctxd:\n%s", readme)
	}
	opts["baseURL"], opts["apiKey"], limit["context"] = base, key, window
	conf["autoupdate"], conf["share"] = false, "disabled"
	b, _ := json.Marshal(conf)
	return string(b)
}

// qwenEnv is the environment the README's Qwen Code block exports, with
// CTXD_URL and CTXD_TOKEN as given.
func qwenEnv(t *testing.T, url, token string) []string {
	t.Helper()
	block := readmeBlock(t, "qwen")
	for _, line := range strings.Split(block, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "export "); ok {
			var env []string
			for _, kv := range strings.Fields(rest) {
				kv = strings.ReplaceAll(strings.ReplaceAll(kv, "$CTXD_URL", url), "$CTXD_TOKEN", token)
				env = append(env, kv)
			}
			return env
		}
	}
	t.Fatalf("the README's qwen block exports nothing:\n%s", block)
	return nil
}

// qwenCode is Qwen Code (@qwen-code/qwen-code on npm) on Node 22 with
// ctxd as its OpenAI endpoint, set by the environment as the README says;
// every turn it also sends a memory-extraction request (a side request).
func qwenCode(t *testing.T) agent {
	home := agentHome(t)
	if err := os.MkdirAll(filepath.Join(home, ".qwen"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The demo model's weights are random: its answers repeat themselves
	// as no trained model's do, and Qwen Code's loop detection (which
	// judges the model's text, not the server) would end a run at random.
	settings := `{"security":{"auth":{"selectedType":"openai"}},"general":{"enableAutoUpdate":false},"privacy":{"usageStatisticsEnabled":false},"tools":{"useRipgrep":false},"model":{"skipLoopDetection":true}}`
	if err := os.WriteFile(filepath.Join(home, ".qwen", "settings.json"), []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	// node_modules/.bin holds qwen and Node 22 (the node package): first
	// on PATH, `qwen` runs as the README's block runs it.
	bin, _ := filepath.Abs(filepath.Join(agentsDir, "node_modules", ".bin"))
	return agent{name: "qwen-code", turn: func(ctx context.Context, t *testing.T, n int, question, dir, base, key string) error {
		var args []string
		if n > 1 {
			args = append(args, "--continue")
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "qwen"), append(args, question)...)
		cmd.Dir = dir
		cmd.Env = append(append(os.Environ(), "HOME="+home, "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH")),
			qwenEnv(t, strings.TrimSuffix(base, "/v1"), key)...)
		return runAgent(ctx, t, cmd)
	}}
}

// agentRun is one agent's turns against one server, as recorded.
type agentRun struct {
	Agent  string       `json:"agent"`
	Server string       `json:"server"` // "ctxd" or "llama-server"
	Window int          `json:"window"`
	Turns  [][]exchange `json:"turns"`  // per turn, its requests in order
	Failed string       `json:"failed"` // the turn that failed and how, where failures are recorded rather than fatal
}

// runAgentTurns runs the agent's turns through a recorder in front of
// base (the server's address, without /v1). A turn that fails fails the
// test, unless record: then it ends the run and is recorded in Failed.
func runAgentTurns(t *testing.T, a agent, server, base, key, dir string, window, maxTokens int, record bool, questions []string) agentRun {
	t.Helper()
	rec := newRecorder(t, base)
	rec.maxTokens = maxTokens
	run := agentRun{Agent: a.name, Server: server, Window: window}
	for i, q := range questions {
		rec.setTurn(i + 1)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		start := time.Now()
		err := a.turn(ctx, t, i+1, q, dir, "http://"+rec.addr+"/v1", key)
		cancel()
		if err != nil && record {
			run.Failed = fmt.Sprintf("turn %d: %s", i+1, lastLines(err.Error(), 1))
			t.Logf("%s on %s: %s", a.name, server, run.Failed)
			return run
		}
		if err != nil {
			digest.fatalf(t, "%s turn %d: %s\n%v", a.name, i+1, lastLines(err.Error(), 1), err)
		}
		var turn []exchange
		for _, e := range rec.exchanges(i + 1) {
			turn = append(turn, *e)
		}
		mainTools := 0
		for _, e := range turn {
			mainTools = max(mainTools, e.Tools)
		}
		for k := range turn {
			turn[k].Main = turn[k].Tools == mainTools
		}
		t.Logf("%s on %s, turn %d: %d requests in %.1f s", a.name, server, i+1, len(turn), time.Since(start).Seconds())
		run.Turns = append(run.Turns, turn)
	}
	return run
}

// codexChanged is why the summary says the codex block changed, if it
// does: the working set moved, or the prefix broke at the codex block.
func codexChanged(s *ctxd.Summary) string {
	if ws := s.WorkingSet; ws != nil && ws.Moved != "" {
		return "working set moved: " + ws.Moved
	}
	if b := s.PrefixBreak; b != nil && (b.Block == "codex" || b.Block == "identity" || b.Block == "environment") {
		return "break at " + b.Block + ": " + b.Reason
	}
	return ""
}

// floorTokens is the prompt's share every request has in common: ctxd's
// identity, the codex and the environment.
func floorTokens(s *ctxd.Summary) int { return blockTokens(s, "identity", "codex", "environment") }

// ownTokens is what a request's client itself sent, in tokens: its tools
// and system text (the sigil block), its conversation and its question
// (with the question's excerpts, which are evaluated with it).
func ownTokens(s *ctxd.Summary) int { return blockTokens(s, "sigil", "state", "query") }

// blockTokens is the tokens of the summary's blocks named.
func blockTokens(s *ctxd.Summary, names ...string) int {
	n := 0
	for _, b := range s.Budget.Blocks {
		if slices.Contains(names, b.Block) {
			n += b.Tokens
		}
	}
	return n
}

var agentsLong = flag.Int("agents-long", 0, "also run Qwen Code's first turn alone at this window, cold (a first prompt of 40k tokens and more at 49152)")

var agentsWrite = flag.String("agents-write", "", "also run each agent against raw llama-server and write the agents table into this markdown file (docs/benchmarks.md)")

// TestRealAgents points opencode and Qwen Code, installed from npm, at
// ctxd's OpenAI door over Go's encoding/csv on a generated model: opencode
// at a 16k window, Qwen Code at 32k, five turns each with their side
// requests (opencode's title, Qwen Code's memory extraction, and its
// retries and continuations of answers cut at the answer reserve). They
// are configured as the README says (opencode.json, Qwen Code's
// environment). Each turn must complete with no refusal and no client
// timeout, and every answer's headers come before its first token; from
// the second turn on, every request reuses ctxd's identity, codex and
// environment as llama-server measured it (the codex is never evaluated
// again), and side requests evaluate no more than their own text plus 10%.
func TestRealAgents(t *testing.T) {
	needLlamaServer(t)
	needAgents(t)
	codex := csvCodex(t)
	var runs []agentRun
	for _, c := range []struct {
		window int
		agent  func(*testing.T) agent
	}{
		{16384, func(t *testing.T) agent { return opencode(t, 16384) }},
		{32768, qwenCode},
	} {
		a := c.agent(t)
		t.Run(a.name, func(t *testing.T) {
			r, addr, tok := agentsDaemon(t, c.window, codex)
			work := t.TempDir() // the agent's project: the codex's files, as the agent sees them
			copyDir(t, codex, work)
			run := runAgentTurns(t, a, "ctxd", "http://"+addr, tok, work, c.window, 0, false, agentQuestions)
			checkAgentRun(t, run)
			runs = append(runs, run)
			if err := r.stop(); err != nil {
				t.Error(err)
			}
			if *agentsWrite != "" {
				runs = append(runs, rawAgentRun(t, c.agent(t), c.window, work))
			}
		})
	}
	if *agentsLong > 0 {
		// A cold first turn of 40k tokens and more: Qwen Code's first
		// question on a window this large, where the codex's share fills
		// what Qwen Code's own prompt leaves.
		a := qwenCode(t)
		t.Run(a.name+"-long", func(t *testing.T) {
			r, addr, tok := agentsDaemon(t, *agentsLong, codex)
			work := t.TempDir()
			copyDir(t, codex, work)
			run := runAgentTurns(t, a, "ctxd", "http://"+addr, tok, work, *agentsLong, 0, false, agentQuestions[:1])
			checkAgentRun(t, run)
			runs = append(runs, run)
			if err := r.stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if *agentsWrite != "" && !t.Failed() {
		if err := writeAgentsTable(*agentsWrite, runs); err != nil {
			t.Fatal(err)
		}
	}
}

// checkAgentRun holds one run to the targets.
func checkAgentRun(t *testing.T, run agentRun) {
	t.Helper()
	for i, turn := range run.Turns {
		n := i + 1
		if len(turn) == 0 || !turn[0].Main && !anyMain(turn) {
			digest.errorf(t, "%s turn %d: no request of the conversation (%d requests)", run.Agent, n, len(turn))
		}
		for _, e := range turn {
			what := "side request"
			if e.Main {
				what = "conversation"
			}
			switch {
			case e.Error != "" || e.Status != http.StatusOK:
				digest.errorf(t, "%s turn %d, %s: refused or failed: status %d, %s", run.Agent, n, what, e.Status, e.Error)
				continue
			case e.Gone:
				digest.errorf(t, "%s turn %d, %s: the agent went away before the answer ended (a client timeout)", run.Agent, n, what)
				continue
			case e.Summary == nil:
				digest.errorf(t, "%s turn %d, %s: no summary in the answer", run.Agent, n, what)
				continue
			}
			s := e.Summary
			measured := -1
			if s.BackendCachedTokens != nil {
				measured = *s.BackendCachedTokens
			}
			t.Logf("%s turn %d %-12s headers %6.1f ms, first token %8.1f ms; prompt %5d, reused %5d (measured), evaluated %5d, own %5d; mode %s%s",
				run.Agent, n, what, e.HeadersMs, e.FirstMs, s.PromptTokens, measured, s.EvaluatedTokens, ownTokens(s), s.Mode, note(s))
			// The headers leave when the request is accepted: before the
			// prompt is read, so before the first token (a bound of a
			// second only against a stalled daemon; the benchmark reports
			// the time itself against the 100 ms target).
			if e.FirstMs > 0 && e.HeadersMs > e.FirstMs || e.HeadersMs > 1000 {
				digest.errorf(t, "%s turn %d, %s: headers after %.1f ms, first token after %.1f ms", run.Agent, n, what, e.HeadersMs, e.FirstMs)
			}
			if n < 2 {
				continue
			}
			// Warm from the second turn: every request, the conversation's
			// and the side requests, reuses the floor it shares with every
			// other (ctxd's identity, the codex, the environment), unless
			// the codex block changed and the summary says why (the RAG
			// working set moved, or the codex was planned again to make
			// room); a side request evaluates no more than its own text
			// and a tenth.
			if f := floorTokens(s); measured < 0 || float64(measured) < 0.98*float64(f) {
				if why := codexChanged(s); why != "" {
					t.Logf("%s turn %d, %s: the codex block changed (%s): %d tokens evaluated again", run.Agent, n, what, why, s.EvaluatedTokens)
				} else {
					digest.errorf(t, "%s turn %d, %s: reused %d tokens, less than the %d of ctxd's identity, codex and environment, and the summary does not say why", run.Agent, n, what, measured, f)
				}
			}
			// (A side request whose codex block changed, and says why,
			// evaluates that block again as well.)
			if !e.Main && codexChanged(s) == "" && float64(s.EvaluatedTokens) > 1.1*float64(ownTokens(s)) {
				digest.errorf(t, "%s turn %d: a side request evaluated %d tokens; its own text is %d (want at most 10%% more)", run.Agent, n, s.EvaluatedTokens, ownTokens(s))
			}
			// The 95% reuse target is measured, not asserted: with the demo
			// model's random answers (sampled tokens that tokenize otherwise
			// when sent back) and agents that rewrite their history, it is
			// not always met; the agents table in docs/benchmarks.md
			// reports each turn.
			// What the target cannot count as reused: this request's own
			// codex excerpts (retrieved for its question, new to every
			// prompt) are logged beside it.
			if e.Main && float64(measured) < 0.95*float64(s.PromptTokens) {
				fresh := 0
				if ws := s.WorkingSet; ws != nil {
					fresh = ws.ExcerptTokensNew
				}
				t.Logf("%s turn %d: the conversation reused %.1f%% of its prompt (target 95%%); %d of its tokens are this question's new codex excerpts, and it reused %.1f%% of the rest",
					run.Agent, n, 100*float64(measured)/float64(s.PromptTokens), fresh, 100*float64(measured)/float64(max(1, s.PromptTokens-fresh)))
			}
		}
	}
}

func anyMain(turn []exchange) bool {
	for _, e := range turn {
		if e.Main {
			return true
		}
	}
	return false
}

// note is what a summary says about its reuse, for the log.
func note(s *ctxd.Summary) string {
	var parts []string
	for _, n := range []string{s.ReuseNote, s.SlotNote, s.PrefixNote} {
		if n != "" {
			parts = append(parts, n)
		}
	}
	if b := s.PrefixBreak; b != nil {
		parts = append(parts, "break at "+b.Block+": "+b.Reason)
	}
	for _, a := range s.Governor {
		parts = append(parts, "governor "+a.Kind+": "+a.Reason)
	}
	if s.Codex.ClientRoom > 0 {
		parts = append(parts, fmt.Sprintf("client room %d", s.Codex.ClientRoom))
	}
	if ws := s.WorkingSet; ws != nil && ws.Moved != "" {
		parts = append(parts, "working set moved: "+ws.Moved)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	entries, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// rawAgentRun runs the agent's turns against llama-server itself (its
// OpenAI endpoint, with the model's own template through --jinja), on the
// same model and window: the baseline the agents table compares ctxd to.
// Its prompts hold no codex.
func rawAgentRun(t *testing.T, a agent, window int, work string) agentRun {
	t.Helper()
	m := modelgen.DemoConfig()
	m.Name, m.ContextLength = fmt.Sprintf("ctxd-demo-%d", window), window
	base := llamaservertest.Start(t, ollamatest.Model(t, m), "-c", fmt.Sprint(2*window), "-np", "2", "--jinja", "--temp", "0.8")
	dir := t.TempDir()
	copyDir(t, work, dir)
	return runAgentTurns(t, a, "llama-server", base, "none", dir, window, agentsAnswerReserve, true, agentQuestions)
}

const (
	agentsBegin = "<!-- bench:agents:begin (written by `make bench-agents`: integration.TestRealAgents -agents-write) -->"
	agentsEnd   = "<!-- bench:agents:end -->"
)

// writeAgentsTable writes the runs as a table between the markers in the
// markdown file at path.
func writeAgentsTable(path string, runs []agentRun) error {
	var sb strings.Builder
	sb.WriteString(agentsBegin + "\n")
	fmt.Fprintf(&sb, "\nMeasured %s on this machine (2 CPU cores) with the demo model (random weights) over Go's `encoding/csv`; llama-server with two slots. "+
		"Per turn, each request the agent made: the conversation's (`conv`) and its side requests (`side`: opencode's title, Qwen Code's memory extraction). "+
		"*Headers* and *first token* are the agent's wait, from its request's arrival to the response's headers and to the first token (the agent's first byte); "+
		"*prompt*, *reused* and *evaluated* are llama-server's own counts (`cache_n`, `prompt_n`). "+
		"Through ctxd the prompt holds the codex (retrieval, under the room the agent's prompt leaves); straight to llama-server it holds no codex at all, "+
		"only the agent's own text rendered by the model's template; its answers are capped at ctxd's answer reserve (%d tokens) there too, as the random model's never end on their own.\n\n",
		time.Now().UTC().Format("2006-01-02"), agentsAnswerReserve)
	sb.WriteString("| agent | window | server | turn | request | headers ms | first token ms | prompt | reused | evaluated |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range runs {
		for i, turn := range run.Turns {
			for _, e := range turn {
				kind := "side"
				if e.Main {
					kind = "conv"
				}
				prompt, reused, evaluated := e.Usage.Prompt, e.Timings.CacheN, e.Timings.PromptN
				if s := e.Summary; s != nil {
					prompt, evaluated = s.PromptTokens, s.EvaluatedTokens
					if s.BackendCachedTokens != nil {
						reused = *s.BackendCachedTokens
					}
				}
				fmt.Fprintf(&sb, "| %s | %dk | %s | %d | %s | %.0f | %.0f | %d | %d | %d |\n", run.Agent, run.Window/1024, run.Server, i+1, kind,
					e.HeadersMs, e.FirstMs, prompt, reused, evaluated)
			}
		}
	}
	for _, run := range runs {
		if run.Failed != "" {
			fmt.Fprintf(&sb, "\n%s on %s stopped at %s\n", run.Agent, run.Server, run.Failed)
		}
	}
	if *agentsLong > 0 {
		fmt.Fprintf(&sb, "\nThe qwen-code rows at %dk are its first turn alone, cold (no slot holds anything yet), on a window where ctxd's codex and Qwen Code's own prompt pass 40k tokens: the headers leave at once and a keep-alive every 5 s while the prompt is read, so no client timeout fires however long the first token takes.\n", *agentsLong/1024)
	}
	sb.WriteString("\n" + agentsEnd)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(b)
	i, j := strings.Index(doc, agentsBegin), strings.Index(doc, agentsEnd)
	if i < 0 || j < i {
		doc = strings.TrimRight(doc, "\n") + "\n\n## Real coding agents\n\n" + sb.String() + "\n"
	} else {
		doc = doc[:i] + sb.String() + doc[j+len(agentsEnd):]
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}
