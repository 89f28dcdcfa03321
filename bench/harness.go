package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
)

// Config says what to run.
type Config struct {
	OllamaBin   string
	OllamaLabel string // the version to report when the binary does not know its own
	ModelPath   string // where the bench model is (written if missing)
	Model       modelgen.Config
	NumCtx      int
	AnswerToks  int
	Turns       int // multi-turn session length
	ColdRepeats int // cold first turns measured (the session's own included)
	Overhead    int // requests for the sidecar-overhead measurement
	ScalingPcts []int
	Log         func(format string, args ...any)
}

// DefaultConfig is the harness as `make bench` runs it: a 28M-parameter
// model whose cold prompt evaluation takes visible time on a 2-core CPU.
func DefaultConfig() Config {
	return Config{
		Model: modelgen.Config{
			Name: "ctxd-bench", Vocab: modelgen.VocabSPM, VocabSize: 4096,
			Embedding: 512, Layers: 8, Heads: 8, KVHeads: 2, FeedForward: 1536,
			ContextLength: 8192, F16: true, Seed: 7,
		},
		NumCtx: 4096, AnswerToks: 8, Turns: 20, ColdRepeats: 3, Overhead: 30,
		ScalingPcts: []int{10, 30, 50, 69, 85},
		Log:         func(string, ...any) {},
	}
}

// Env is what the phases share: the server, the daemon, a tokenizer.
type env struct {
	cfg    Config
	work   string
	srv    *ollama.Server
	direct *ollama.Client
	tok    *llamatok.Tokenizer
	ctxd   *client.Client
	socket string
	slot   []int // tokens the backend slot holds after the last direct request
	stop   func()
}

// Run runs every phase and returns the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	e, err := setup(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer e.stop()
	r := &Report{Machine: machine(cfg), Config: cfg, Started: time.Now().UTC().Format(time.RFC3339)}
	if r.Machine.Ollama, err = e.direct.Version(ctx); err != nil {
		return nil, err
	}
	if r.Machine.Ollama == "0.0.0" && cfg.OllamaLabel != "" { // go install builds carry no version
		r.Machine.Ollama = cfg.OllamaLabel
	}
	cfg.Log("multi-turn: %d turns, three ways", cfg.Turns)
	if r.MultiTurn, err = e.multiTurn(ctx); err != nil {
		return nil, fmt.Errorf("bench: multi-turn: %w", err)
	}
	cfg.Log("sidecar overhead: %d requests", cfg.Overhead)
	if r.Overhead, err = e.overhead(ctx); err != nil {
		return nil, fmt.Errorf("bench: overhead: %w", err)
	}
	cfg.Log("compose latency")
	r.Compose = composeLatency()
	cfg.Log("scaling: %v%% of the prompt budget", cfg.ScalingPcts)
	if r.Scaling, err = e.scaling(ctx); err != nil {
		return nil, fmt.Errorf("bench: scaling: %w", err)
	}
	return r, nil
}

func setup(ctx context.Context, cfg Config) (*env, error) {
	work, err := os.MkdirTemp("", "ctxd-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{cfg: cfg, work: work}
	cleanups := []func(){func() { os.RemoveAll(work) }}
	e.stop = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (*env, error) { e.stop(); return nil, err }
	if wrote, err := modelgen.Ensure(cfg.ModelPath, cfg.Model); err != nil {
		return fail(err)
	} else if wrote {
		cfg.Log("wrote the bench model (%.1fM parameters) to %s", float64(cfg.Model.Params())/1e6, cfg.ModelPath)
	}
	if e.tok, err = llamatok.Open(cfg.ModelPath); err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { e.tok.Close() })
	e.srv, err = ollama.Start(ctx, ollama.ServeConfig{
		Binary: cfg.OllamaBin, Addr: "127.0.0.1:0",
		ModelsDir: filepath.Join(work, "models"), HomeDir: filepath.Join(work, "home"),
		LogPath: filepath.Join(work, "ollama.log"), Env: []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { e.srv.Close() })
	load := ollama.Options{NumCtx: cfg.NumCtx, NumBatch: 512}
	e.direct = ollama.New(e.srv.URL(), "ctxd-bench", load)
	if err := e.direct.Import(ctx, cfg.ModelPath); err != nil {
		return fail(err)
	}
	if err := e.direct.Load(ctx); err != nil {
		return fail(err)
	}
	// The daemon, in-process, on the same server: external mode, so it and
	// the direct requests share one model load and one slot.
	codexDir := filepath.Join(work, "codex-half")
	if err := writeCodex(e.tok, codexDir, cfg.NumCtx/2-300); err != nil {
		return fail(err)
	}
	dc := config.Default(config.Env{UID: os.Getuid(), Home: work})
	dc.Daemon.Socket = filepath.Join(work, "s.sock")
	dc.Daemon.StateDir = filepath.Join(work, "state")
	dc.Daemon.LogLevel = "warn"
	dc.Backend.Mode, dc.Backend.URL, dc.Backend.Model = "external", e.srv.URL().String(), "ctxd-bench"
	dc.Backend.NumCtx, dc.Backend.NumBatch = cfg.NumCtx, 512
	dc.Limits.AnswerReserve, dc.Limits.MaxDepth = cfg.AnswerToks, 0
	dc.Codex.Path, dc.Codex.Watch = codexDir, false
	d, err := daemon.New(dc, daemon.Options{Logger: slog.New(slog.DiscardHandler), Version: "bench"})
	if err != nil {
		return fail(err)
	}
	ln, err := daemon.Listen(dc.Daemon.Socket)
	if err != nil {
		return fail(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Run(dctx, ln, func() { close(ready) }) }()
	cleanups = append(cleanups, func() { cancel(); <-done; ln.Close() })
	select {
	case <-ready:
	case err := <-done:
		return fail(fmt.Errorf("daemon stopped: %w", err))
	case <-time.After(5 * time.Minute):
		return fail(fmt.Errorf("daemon not ready within 5 minutes"))
	}
	e.socket = dc.Daemon.Socket
	e.ctxd = client.New(dc.Daemon.Socket)
	return e, nil
}

// askCtxd asks through the daemon and measures time to first token on the
// client's side of the socket.
func (e *env) askCtxd(ctx context.Context, session, q string) (*ctxd.Summary, time.Duration, error) {
	start := time.Now()
	var ttft time.Duration
	sum, err := e.ctxd.Ask(ctx, ctxd.AskRequest{Session: session, Query: q}, func(string) {
		if ttft == 0 {
			ttft = time.Since(start)
		}
	})
	if err == nil && ttft == 0 {
		ttft = time.Since(start)
	}
	// ctxd's requests move the backend slot: a direct request after one
	// evaluates from scratch as far as this harness can know.
	e.slot = nil
	return sum, ttft, err
}

// askCold asks through the daemon in a new session after a prompt that
// shares nothing but BOS with ctxd's took the backend's only slot, so the
// whole prompt is evaluated again.
func (e *env) askCold(ctx context.Context, session, q string) (*ctxd.Summary, time.Duration, error) {
	if _, err := e.askDirect(ctx, "Unrelated prompt for "+session+"."); err != nil {
		return nil, 0, err
	}
	return e.askCtxd(ctx, session, q)
}

// askDirect sends a raw prompt straight to Ollama, as an agent without
// ctxd would, and counts the tokens it had to evaluate.
func (e *env) askDirect(ctx context.Context, prompt string) (Turn, error) {
	ids, err := e.tok.Tokenize(prompt)
	if err != nil {
		return Turn{}, err
	}
	cached := scheduler.LCP(e.slot, ids)
	if cached == len(ids) {
		cached-- // the runner always evaluates at least one token
	}
	// The options ctxd sends; none of them reloads the model.
	res, err := e.direct.Generate(ctx, ctxd.GenerateRequest{Prompt: prompt, MaxTokens: e.cfg.AnswerToks, NumKeep: len(ids), Stop: []string{runcontext.StopSequence}}, nil)
	if err != nil {
		return Turn{}, err
	}
	e.slot = ids
	return Turn{
		TTFTMs: ms(res.TTFT), PromptTokens: len(ids), EvaluatedTokens: len(ids) - cached,
		PromptEvalMs: ms(res.PromptEvalDuration), Answer: res.Text,
	}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// machine describes where the numbers come from.
func machine(cfg Config) Machine {
	m := Machine{OS: runtime.GOOS + "/" + runtime.GOARCH, Cores: runtime.NumCPU(), Go: runtime.Version(),
		ModelParams: cfg.Model.Params(), NumCtx: cfg.NumCtx}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		m.MemoryGiB = float64(kb) / (1 << 20)
	}
	m.Model = fmt.Sprintf("%s, %s vocabulary of %d, %d layers, embedding %d, %d heads (%d KV), ff %d, f16=%v",
		cfg.Model.Name, cfg.Model.Vocab, cfg.Model.VocabSize, cfg.Model.Layers, cfg.Model.Embedding,
		cfg.Model.Heads, cfg.Model.KVHeads, cfg.Model.FeedForward, cfg.Model.F16)
	return m
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i]
}
