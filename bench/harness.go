package bench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
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
	CAGRatio    float64 // codex.cag_ratio of the daemons; 0: the default
	Turns       int     // multi-turn session length
	ColdRepeats int     // cold first turns measured (the session's own included)
	Overhead    int     // requests for the sidecar-overhead measurement
	ScalingPcts []int

	// The many-agents phase: Agents sessions of AgentTurns turns each, all
	// at once, over one codex, once for each slot count in AgentSlots, with
	// its own model (the demo model of make run, whose turns are short
	// enough for 8 × 25 of them).
	Agents         int
	AgentTurns     int
	AgentSlots     []int
	AgentModel     modelgen.Config
	AgentModelPath string

	// The llama-server phase (skipped without LlamaServerBin): the agents'
	// model on llama-server and on Ollama at codex sizes LlamaSizes, two
	// agents interleaving LlamaInterleaveTurns turns on one and two slots,
	// and a restart at LlamaRestartTokens, cold and restored.
	LlamaServerBin       string
	LlamaNumCtx          int
	LlamaSizes           []int
	LlamaInterleaveTurns int
	LlamaPairs           int // paired ctxd/raw requests per codex size
	LlamaRestartTokens   int

	// The RAG phase: follow-up questions about RAGPackage (a directory of
	// RAGTree) on the agents' model, RAGTopK excerpts each.
	RAGTree    string
	RAGPackage string
	RAGTopK    int
	// The drifting sessions (over RAGTree too): their answers' length.
	DriftAnswerToks int

	// The answer-quality phase: the question sets under QualityDir
	// (LoadQualitySets) asked of each of QualityModels four ways, on
	// Ollama and (with LlamaServerBin) llama-server, answers at most
	// QualityAnswerToks tokens; QualityMax > 0 asks only the first that
	// many questions of each set (a quick look, not the figures).
	QualityDir        string
	QualityModels     []QualityModel
	QualityAnswerToks int
	QualityMax        int

	// The chunk-reuse phase (skipped without LlamaServerBin): the quality
	// sets on the first of QualityModels, with backend.cache_reuse =
	// CacheReuse (0: DefaultReuseChunk).
	CacheReuse int

	// The real-models phase: the llama-server phase's codex sizes, cold
	// and warm and ctxd − raw, on trained models.
	RealModels []RealModel

	// The dashboard phase (skipped without CtxdBin): the many-agents
	// workload through the ctxd binary, with dashboard pages open.
	CtxdBin string

	Phases []string // phases to run (see AllPhases); empty: all
	Log    func(format string, args ...any)
}

// The phases of the harness.
const (
	PhaseMultiTurn = "multi-turn"
	PhaseOverhead  = "overhead"
	PhaseCompose   = "compose"
	PhaseScaling   = "scaling"
	PhaseAgents    = "agents"
	PhaseLlama     = "llamacpp"
	PhaseRAG       = "rag"
	PhaseDrift     = "drift"
	PhaseQuality   = "quality"
	PhaseReal      = "real-models"
	PhaseReuse     = "reuse"
	PhasePersonas  = "personas"
	PhaseDashboard = "dashboard"
)

// AllPhases are the phases in the order they run.
var AllPhases = []string{PhaseMultiTurn, PhaseOverhead, PhaseCompose, PhaseScaling, PhaseAgents, PhaseLlama, PhaseRAG, PhaseDrift, PhaseQuality, PhaseReal, PhaseReuse, PhasePersonas, PhaseDashboard}

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
		Agents:      8, AgentTurns: 25, AgentSlots: []int{1, 2}, AgentModel: modelgen.DemoConfig(),
		LlamaNumCtx: 16384, LlamaSizes: []int{2000, 8000, 14000}, LlamaInterleaveTurns: 20, LlamaRestartTokens: 8000, LlamaPairs: 30,
		RAGTree: filepath.Join(runtime.GOROOT(), "src", "encoding"), RAGPackage: "csv", RAGTopK: 3, DriftAnswerToks: 48,
		QualityDir: filepath.Join("testdata", "quality"), QualityAnswerToks: 48,
		QualityModels: []QualityModel{{Name: "smollm2", Path: filepath.Join("var", "models", "smollm2-135m-instruct-q4_1.gguf"), NumCtx: 8192, RAGNumCtx: 2048}},
		RealModels: []RealModel{
			{Name: "smollm2", Path: filepath.Join("var", "models", "smollm2-135m-instruct-q4_1.gguf"), NumCtx: 8192, Sizes: []int{6000}},
			{Name: "gemma3", Path: filepath.Join("var", "models", "gemma-3-270m-q4_k_m.gguf"), NumCtx: 24576, Sizes: []int{6000, 20000}},
		},
		Log: func(string, ...any) {},
	}
}

// stack is a private `ollama serve` with one model, and the daemon in
// front of it (in-process, external mode, so direct requests and ctxd's
// share one model load).
type stack struct {
	work   string
	srv    *ollama.Server
	direct *ollama.Client
	tok    *llamatok.Tokenizer
	ctxd   *client.Client
	socket string
	stop   func()
}

// startStack starts a server with slots slots and the model m (written to
// path if missing or stale), loads it with numCtx, writes a codex of about
// half the window, and starts the daemon over it.
func startStack(ctx context.Context, cfg Config, m modelgen.Config, path string, numCtx, slots int) (*stack, error) {
	return startStackWith(ctx, cfg, m, path, numCtx, slots, nil)
}

// startStackWith is startStack with the daemon's configuration adjusted by
// tweak (nil: none).
func startStackWith(ctx context.Context, cfg Config, m modelgen.Config, path string, numCtx, slots int, tweak func(*config.Config)) (*stack, error) {
	work, err := os.MkdirTemp("", "ctxd-bench-")
	if err != nil {
		return nil, err
	}
	st := &stack{work: work}
	cleanups := []func(){func() { os.RemoveAll(work) }}
	st.stop = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (*stack, error) { st.stop(); return nil, err }
	// A generated model is written if missing or stale; a trained one (no
	// layers in m: only its name) is the file at path.
	if m.Layers > 0 {
		if wrote, err := modelgen.Ensure(path, m); err != nil {
			return fail(err)
		} else if wrote {
			cfg.Log("wrote the model %s (%.1fM parameters) to %s", m.Name, float64(m.Params())/1e6, path)
		}
	}
	if st.tok, err = llamatok.Open(path); err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { st.tok.Close() })
	st.srv, err = ollama.Start(ctx, ollama.ServeConfig{
		Binary: cfg.OllamaBin, Addr: "127.0.0.1:0", NumParallel: slots,
		ModelsDir: filepath.Join(work, "models"), HomeDir: filepath.Join(work, "home"),
		LogPath: filepath.Join(work, "ollama.log"), Env: []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, func() { st.srv.Close() })
	st.direct = ollama.New(st.srv.URL(), m.Name, ollama.Options{NumCtx: numCtx, NumBatch: 512})
	if err := st.direct.Import(ctx, path); err != nil {
		return fail(err)
	}
	if err := st.direct.Load(ctx); err != nil {
		return fail(err)
	}
	codexDir := filepath.Join(work, "codex-half")
	if err := writeCodex(st.tok, codexDir, numCtx/2-300); err != nil {
		return fail(err)
	}
	dc := config.Default(config.Env{UID: os.Getuid(), Home: work})
	dc.Daemon.Socket = filepath.Join(work, "s.sock")
	dc.Daemon.StateDir = filepath.Join(work, "state")
	dc.Daemon.LogLevel = "warn"
	dc.Backend.Mode, dc.Backend.URL, dc.Backend.Model, dc.Backend.Slots = "external", st.srv.URL().String(), m.Name, slots
	dc.Backend.NumCtx, dc.Backend.NumBatch = numCtx, 512
	dc.Limits.AnswerReserve, dc.Limits.MaxDepth = cfg.AnswerToks, 0
	dc.Codex.Path, dc.Codex.Watch = codexDir, false
	dc.Codex.LoadRoots = []string{"/"} // the harness loads its own trees and Go's source
	if cfg.CAGRatio > 0 {
		dc.Codex.CAGRatio = cfg.CAGRatio
	}
	// A sigil the harness searches the codex with (the default one asks).
	dc.Sigils["bench-search"] = config.Sigil{Scopes: []string{"search_codex"}}
	if tweak != nil {
		tweak(&dc)
	}
	ds, err := runDaemon(ctx, dc)
	if err != nil {
		return fail(err)
	}
	cleanups = append(cleanups, ds.stop)
	st.socket, st.ctxd = dc.Daemon.Socket, ds.ctxd
	return st, nil
}

// env is what the single-session phases share: the bench model's stack.
type env struct {
	*stack
	cfg  Config
	slot []int // tokens the backend slot holds after the last direct request
}

// Run runs the configured phases and returns the report: prev (an earlier
// run's, or nil) with the phases that ran replaced. Each phase records
// when it ran, so a report merged from several runs says which is which.
func Run(ctx context.Context, cfg Config, prev *Report) (*Report, error) {
	r := &Report{}
	if prev != nil {
		*r = *prev
	}
	now := time.Now().UTC().Format(time.RFC3339)
	r.Ran = maps.Clone(r.Ran) // prev's stays as it was
	if r.Ran == nil {
		r.Ran = map[string]string{}
	}
	if prev != nil {
		// A phase the last run measured without saying when (results
		// written before phases_ran listed it) was measured when that run
		// started: its section keeps that date, not this run's.
		for _, p := range AllPhases {
			if _, ok := r.Ran[p]; !ok && prev.Started != "" {
				r.Ran[p] = prev.Started
			}
		}
	}
	r.Started, r.Config = now, cfg
	phases := cfg.Phases
	if len(phases) == 0 {
		phases = AllPhases
	}
	for _, p := range phases {
		if !slices.Contains(AllPhases, p) {
			return nil, fmt.Errorf("bench: unknown phase %q (phases: %s)", p, strings.Join(AllPhases, ", "))
		}
	}
	want := func(p string) bool { return slices.Contains(phases, p) }
	machine := machine(cfg)
	if want(PhaseMultiTurn) || want(PhaseOverhead) || want(PhaseScaling) {
		st, err := startStack(ctx, cfg, cfg.Model, cfg.ModelPath, cfg.NumCtx, 1)
		if err != nil {
			return nil, err
		}
		defer st.stop()
		e := &env{stack: st, cfg: cfg}
		if machine.Ollama, err = ollamaVersion(ctx, cfg, st); err != nil {
			return nil, err
		}
		r.Machine = machine
		if want(PhaseMultiTurn) {
			cfg.Log("multi-turn: %d turns, three ways", cfg.Turns)
			if r.MultiTurn, err = e.multiTurn(ctx); err != nil {
				return nil, fmt.Errorf("bench: multi-turn: %w", err)
			}
			r.Ran[PhaseMultiTurn] = now
		}
		if want(PhaseOverhead) {
			cfg.Log("sidecar overhead: %d requests", cfg.Overhead)
			if prev != nil && prev.Overhead.Requests > 0 {
				r.PreviousOverhead = &PreviousOverhead{Ran: prev.ranAt(PhaseOverhead), Overhead: prev.Overhead}
			}
			if r.Overhead, err = e.overhead(ctx); err != nil {
				return nil, fmt.Errorf("bench: overhead: %w", err)
			}
			r.Ran[PhaseOverhead] = now
		}
		if want(PhaseScaling) {
			cfg.Log("scaling: %v%% of the prompt budget", cfg.ScalingPcts)
			if r.Scaling, err = e.scaling(ctx); err != nil {
				return nil, fmt.Errorf("bench: scaling: %w", err)
			}
			r.Ran[PhaseScaling] = now
		}
	}
	if want(PhaseCompose) {
		cfg.Log("compose latency")
		r.Compose = composeLatency()
		r.Ran[PhaseCompose] = now
	}
	if want(PhaseAgents) {
		runs, err := agents(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: agents: %w", err)
		}
		r.Agents = runs
		r.Ran[PhaseAgents] = now
	}
	if want(PhaseLlama) {
		if cfg.LlamaServerBin == "" {
			cfg.Log("llama-server phase skipped: no llama-server binary (--llama-server)")
		} else {
			run, err := llamaPhase(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: llamacpp: %w", err)
			}
			r.Llama = &run
			r.Ran[PhaseLlama] = now
		}
	}
	if want(PhaseRAG) {
		run, err := ragPhase(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: rag: %w", err)
		}
		r.RAG = &run
		r.Ran[PhaseRAG] = now
	}
	if want(PhaseDrift) {
		runs, err := driftPhase(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: drift: %w", err)
		}
		r.Drift, r.DriftBaseline = runs, nil // a baseline is of the run it was measured beside
		r.Ran[PhaseDrift] = now
	}
	if want(PhaseQuality) {
		runs, err := qualityPhase(ctx, cfg)
		if err != nil {
			return nil, err
		}
		r.Quality = runs
		r.Ran[PhaseQuality] = now
	}
	if want(PhaseReal) {
		if cfg.LlamaServerBin == "" {
			cfg.Log("real-models phase skipped: no llama-server binary (--llama-server)")
		} else {
			runs, err := realPhase(ctx, cfg)
			if err != nil {
				return nil, err
			}
			r.Real = runs
			r.Ran[PhaseReal] = now
		}
	}
	if want(PhaseReuse) {
		if cfg.LlamaServerBin == "" {
			cfg.Log("chunk-reuse phase skipped: no llama-server binary (--llama-server)")
		} else {
			run, err := reusePhase(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: reuse: %w", err)
			}
			r.Reuse = &run
			r.Ran[PhaseReuse] = now
		}
	}
	if want(PhaseDashboard) {
		if cfg.CtxdBin == "" {
			cfg.Log("dashboard phase skipped: no ctxd binary (--ctxd)")
		} else {
			run, err := dashboardPhase(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: dashboard: %w", err)
			}
			r.Dashboard = &run
			r.Ran[PhaseDashboard] = now
		}
	}
	if want(PhasePersonas) {
		if cfg.LlamaServerBin == "" {
			cfg.Log("personas phase skipped: no llama-server binary (--llama-server)")
		} else {
			run, err := personasPhase(ctx, cfg)
			if err != nil {
				return nil, fmt.Errorf("bench: personas: %w", err)
			}
			r.Personas = &run
			r.Ran[PhasePersonas] = now
		}
	}
	if r.Machine.CPU == "" {
		r.Machine = machine
	}
	return r, nil
}

// ollamaVersion is the server's version, or the label for builds that
// carry none.
func ollamaVersion(ctx context.Context, cfg Config, st *stack) (string, error) {
	v, err := st.direct.Version(ctx)
	if err != nil {
		return "", err
	}
	if v == "0.0.0" && cfg.OllamaLabel != "" { // go install builds carry no version
		v = cfg.OllamaLabel
	}
	return v, nil
}

// askCtxd asks through the daemon and measures time to first token on the
// client's side of the socket.
func (e *env) askCtxd(ctx context.Context, session, q string) (*ctxd.Summary, time.Duration, error) {
	// ctxd's requests move the backend slot: a direct request after one
	// evaluates from scratch as far as this harness can know.
	e.slot = nil
	return ask(ctx, e.ctxd, session, q)
}

// ask asks through the daemon and measures time to first token on the
// client's side of the socket.
func ask(ctx context.Context, c *client.Client, session, q string) (*ctxd.Summary, time.Duration, error) {
	start := time.Now()
	var ttft time.Duration
	sum, err := c.Ask(ctx, ctxd.AskRequest{Session: session, Query: q}, func(string) {
		if ttft == 0 {
			ttft = time.Since(start)
		}
	})
	if err == nil && ttft == 0 {
		ttft = time.Since(start)
	}
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
