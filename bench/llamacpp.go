package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/modelgen"
)

// LlamaRun is the llama-server phase: the same generated model on
// llama-server (through ctxd, and raw) and on Ollama (through ctxd), in one
// run.
type LlamaRun struct {
	Model      string          `json:"model"`
	Server     string          `json:"server"`
	Sizes      []LlamaSize     `json:"sizes"`
	Interleave []InterleaveRun `json:"interleave"`
	Restart    RestartRun      `json:"restart"`
}

// LlamaSize is one codex size.
type LlamaSize struct {
	TargetTokens int `json:"target_tokens"`
	StableTokens int `json:"stable_tokens"` // the stable blocks, codex included, as the plan counts them
	// Warm turns of one session (time to first token, client side).
	LlamaWarmMs  []float64 `json:"llama_warm_ms"`
	OllamaWarmMs []float64 `json:"ollama_warm_ms"`
	// Tokens llama-server evaluated on each warm turn (prompt − cache_n).
	LlamaWarmEvaluated []int   `json:"llama_warm_evaluated"`
	LlamaColdMs        float64 `json:"llama_cold_ms"`
	OllamaColdMs       float64 `json:"ollama_cold_ms"`
	// Paired: the same prompt's ids through ctxd, then raw to the same
	// llama-server slot; both find it cached.
	PairedCtxdMs []float64 `json:"paired_ctxd_ms"`
	PairedRawMs  []float64 `json:"paired_raw_ms"`
	OverheadP50  float64   `json:"overhead_p50_ms"` // pairwise ctxd − raw
	// Inside: the client's time to first token through ctxd minus ctxd's
	// own measurement of llama-server's (from sending the ids: the
	// summary's timing.backend_ttft_ms; its ttft_ms counts from the
	// request's arrival).
	OwnMs []float64 `json:"own_ms"`
	// Tokens the server evaluated for each pair: through ctxd, raw.
	PairedEvaluated [][2]int `json:"paired_evaluated"`
	OwnP50          float64  `json:"own_p50_ms"`
	// Where ctxd − raw goes, pair by pair. The backend leg: ctxd's
	// measurement of llama-server's time to first token minus the raw
	// client's, both from sending the ids (connections, their ownership
	// check, the request). Inside, from the summary's timing: the governor
	// (building, counting and fitting the prompt) and the rest before the
	// ids are sent (taking the session, checks).
	BackendLegMs  []float64 `json:"backend_leg_ms,omitempty"`
	GovernorMs    []float64 `json:"governor_ms,omitempty"`
	OtherMs       []float64 `json:"other_ms,omitempty"`
	BackendLegP50 float64   `json:"backend_leg_p50_ms,omitempty"`
	GovernorP50   float64   `json:"governor_p50_ms,omitempty"`
	OtherP50      float64   `json:"other_p50_ms,omitempty"`
}

// InterleaveRun is two agents taking turns over one codex.
type InterleaveRun struct {
	Slots     int       `json:"slots"`
	TTFTMs    []float64 `json:"ttft_ms"`   // per turn, A B A B ...
	Evaluated []int     `json:"evaluated"` // tokens the server evaluated per turn (prompt − cache_n)
}

// RestartRun is time to first token on an 8k-token codex right after the
// server starts: cold (nothing saved) and restored from the saved slot.
type RestartRun struct {
	StableTokens int     `json:"stable_tokens"`
	ColdMs       float64 `json:"cold_ms"`
	RestoredMs   float64 `json:"restored_ms"`
	Ratio        float64 `json:"cold_over_restored"`
}

// llamaStack is the daemon in front of a managed llama-server.
type llamaStack struct {
	ctxd  *client.Client
	raw   *llamacpp.Client
	key   string // the managed server's API key
	state string
	stop  func()
}

func startLlamaStack(ctx context.Context, cfg Config, modelPath, codexDir, state string, numCtx, slots int) (*llamaStack, error) {
	dc := config.Default(config.Env{UID: os.Getuid(), Home: state})
	dc.Daemon.Socket = filepath.Join(state, "s.sock")
	dc.Daemon.StateDir = state
	dc.Daemon.LogLevel = "warn"
	dc.Backend.Kind, dc.Backend.Binary, dc.Backend.GGUF, dc.Backend.Model = "llamacpp", cfg.LlamaServerBin, modelPath, "bench"
	dc.Backend.NumCtx, dc.Backend.Slots, dc.Backend.CacheReuse = numCtx, slots, cfg.CacheReuse
	dc.Limits.AnswerReserve, dc.Limits.MaxDepth = cfg.AnswerToks, 0
	dc.Codex.Path, dc.Codex.Watch = codexDir, false
	dc.Codex.LoadRoots = []string{"/"} // the harness loads its own trees
	// The harness also talks to the server itself (the raw comparison):
	// it chooses the key the managed server requires.
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	dc.Backend.APIKey = hex.EncodeToString(key)
	if cfg.CAGRatio > 0 {
		dc.Codex.CAGRatio = cfg.CAGRatio
	}
	st, err := runDaemon(ctx, dc)
	if err != nil {
		return nil, err
	}
	var status httpapi.Status
	if err := st.ctxd.GetJSON(ctx, "/v1/status", &status); err != nil {
		st.stop()
		return nil, err
	}
	raw, err := llamacpp.New(status.Backend.URL, llamacpp.Options{APIKey: dc.Backend.APIKey})
	if err != nil {
		st.stop()
		return nil, err
	}
	if _, err := raw.Props(ctx); err != nil {
		st.stop()
		return nil, err
	}
	return &llamaStack{ctxd: st.ctxd, raw: raw, key: dc.Backend.APIKey, state: state, stop: st.stop}, nil
}

// llamaPhase measures llama-server against Ollama on the demo model.
func llamaPhase(ctx context.Context, cfg Config) (LlamaRun, error) {
	m := cfg.AgentModel
	run := LlamaRun{Model: fmt.Sprintf("%s (%.1fM parameters), num_ctx %d", m.Name, float64(m.Params())/1e6, cfg.LlamaNumCtx)}
	if _, err := modelgen.Ensure(cfg.AgentModelPath, m); err != nil {
		return run, err
	}
	tok, err := llamatok.Open(cfg.AgentModelPath)
	if err != nil {
		return run, err
	}
	defer tok.Close()
	work, err := os.MkdirTemp("", "ctxd-bench-llama-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(work)

	sizes, server, err := llamaSizes(ctx, cfg, m, cfg.AgentModelPath, tok, work, cfg.LlamaNumCtx, cfg.LlamaSizes)
	if err != nil {
		return run, err
	}
	run.Sizes, run.Server = sizes, server

	// Two agents interleaving over one codex: one shared slot, then a slot each.
	mid := filepath.Join(work, "codex-mid")
	if err := writeCodex(tok, mid, cfg.LlamaRestartTokens); err != nil {
		return run, err
	}
	for _, slots := range []int{1, 2} {
		cfg.Log("llama-server: two agents interleaving %d turns each on %d slot(s)", cfg.LlamaInterleaveTurns, slots)
		st, err := startLlamaStack(ctx, cfg, cfg.AgentModelPath, mid, filepath.Join(work, fmt.Sprintf("inter-%d", slots)), cfg.LlamaNumCtx, slots)
		if err != nil {
			return run, err
		}
		ir := InterleaveRun{Slots: slots}
		for turn := range cfg.LlamaInterleaveTurns {
			for a, agent := range []string{"A", "B"} {
				sum, t, err := ask(ctx, st.ctxd, agent, question(2*turn+a))
				if err != nil {
					st.stop()
					return run, err
				}
				ir.TTFTMs, ir.Evaluated = append(ir.TTFTMs, ms(t)), append(ir.Evaluated, evaluated(sum))
			}
		}
		st.stop()
		run.Interleave = append(run.Interleave, ir)
	}

	// Restart: cold start on a fresh state, then a restart restored from
	// the slot the first request saved.
	cfg.Log("llama-server: time to first token after a restart, cold and restored")
	rst, err := startLlamaStack(ctx, cfg, cfg.AgentModelPath, mid, filepath.Join(work, "restart"), cfg.LlamaNumCtx, 1)
	if err != nil {
		return run, err
	}
	defer rst.stop()
	sum, cold, err := ask(ctx, rst.ctxd, "r1", question(1))
	if err != nil {
		return run, err
	}
	run.Restart = RestartRun{StableTokens: sum.Codex.StableTokens, ColdMs: ms(cold)}
	pid, err := llamaPID(rst.state)
	if err != nil {
		return run, err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return run, err
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var s httpapi.Status
		if rst.ctxd.GetJSON(ctx, "/v1/status", &s) == nil && s.Backend.Restarts >= 1 && s.Ready {
			break
		}
		if time.Now().After(deadline) {
			return run, fmt.Errorf("llama-server not restarted within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, restored, err := ask(ctx, rst.ctxd, "r2", question(2))
	if err != nil {
		return run, err
	}
	run.Restart.RestoredMs = ms(restored)
	run.Restart.Ratio = run.Restart.ColdMs / run.Restart.RestoredMs
	cfg.Log("  cold %.0f ms, restored %.0f ms: %.0f×", run.Restart.ColdMs, run.Restart.RestoredMs, run.Restart.Ratio)
	return run, nil
}

// llamaSizes measures model m (written to path if it is a generated one;
// a file as it is when m has no layers) at each codex size of sizes, in
// a window of numCtx: on llama-server and Ollama side by side, cold and
// warm turns, and ctxd − raw llama-server pairs for the same token ids.
func llamaSizes(ctx context.Context, cfg Config, m modelgen.Config, path string, tok *llamatok.Tokenizer, work string, numCtx int, sizes []int) ([]LlamaSize, string, error) {
	var out []LlamaSize
	server := ""
	// Codex sizes, llama-server and Ollama side by side; the codex loads
	// whole at every size.
	cfg.CAGRatio = 0.95
	ost, err := startStack(ctx, cfg, m, path, numCtx, 1)
	if err != nil {
		return out, server, err
	}
	defer ost.stop()
	lst, err := startLlamaStack(ctx, cfg, path, "", filepath.Join(work, "sizes-"+m.Name), numCtx, 1)
	if err != nil {
		return out, server, err
	}
	defer lst.stop()
	if p, err := lst.raw.Props(ctx); err == nil {
		server = p.Build
	}
	for _, target := range sizes {
		cfg.Log("llama-server: codex of about %d tokens", target)
		dir := filepath.Join(work, fmt.Sprintf("codex-%s-%d", m.Name, target))
		if err := writeCodex(tok, dir, target); err != nil {
			return out, server, err
		}
		s := LlamaSize{TargetTokens: target}
		for _, side := range []struct {
			c     *client.Client
			cold  *float64
			warm  *[]float64
			label string
		}{{lst.ctxd, &s.LlamaColdMs, &s.LlamaWarmMs, "llama"}, {ost.ctxd, &s.OllamaColdMs, &s.OllamaWarmMs, "ollama"}} {
			st, err := side.c.LoadCodex(ctx, dir, nil)
			if err != nil {
				return out, server, err
			}
			s.StableTokens = st.Plan.StableTokens
			session := fmt.Sprintf("size-%d", target)
			for i := range 4 {
				sum, t, err := ask(ctx, side.c, session, question(target+i))
				if err != nil {
					return out, server, fmt.Errorf("%s: %w", side.label, err)
				}
				if i == 0 {
					*side.cold = ms(t)
					continue
				}
				*side.warm = append(*side.warm, ms(t))
				if side.label == "llama" {
					s.LlamaWarmEvaluated = append(s.LlamaWarmEvaluated, evaluated(sum))
				}
			}
		}
		// Paired overhead on llama-server: a new session with the same
		// question renders the same prompt; its ids go raw to the same slot.
		// Which goes first alternates, so whatever the server does between
		// requests falls on both sides alike; the first pair only moves the
		// slot to this prompt.
		for i := range cfg.LlamaPairs + 1 {
			session := fmt.Sprintf("pair-%d-%d", target, i)
			var evalCtxd, evalRaw int
			var timing ctxd.Timing
			viaCtxd := func() (float64, float64, error) {
				sum, tc, err := ask(ctx, lst.ctxd, session, question(0))
				if err != nil {
					return 0, 0, err
				}
				evalCtxd, timing = evaluated(sum), sum.Timing
				return ms(tc), ms(tc) - sum.Timing.BackendTTFTMs, nil
			}
			raw := func() (float64, error) {
				var lp ctxd.LastPrompt
				if err := lst.ctxd.GetJSON(ctx, "/v1/sessions/pair-"+fmt.Sprint(target)+"-0/prompt", &lp); err != nil {
					return 0, err
				}
				ids, err := tok.Tokenize(lp.Prompt)
				if err != nil {
					return 0, err
				}
				start := time.Now()
				var first time.Duration
				gen, err := lst.raw.Generate(ctx, ctxd.GenerateRequest{Tokens: ids, Slot: 0, MaxTokens: cfg.AnswerToks, Stop: lp.Stop}, func(string) error {
					if first == 0 {
						first = time.Since(start)
					}
					return nil
				})
				if err != nil {
					return 0, err
				}
				evalRaw = len(ids) - gen.BackendCached
				if first == 0 {
					first = time.Since(start)
				}
				return ms(first), nil
			}
			var c, own, r float64
			var err error
			if i%2 == 0 {
				if c, own, err = viaCtxd(); err == nil {
					r, err = raw()
				}
			} else if r, err = raw(); err == nil {
				c, own, err = viaCtxd()
			}
			if err != nil {
				return out, server, err
			}
			if i == 0 {
				continue
			}
			s.PairedCtxdMs, s.PairedRawMs, s.OwnMs = append(s.PairedCtxdMs, c), append(s.PairedRawMs, r), append(s.OwnMs, own)
			s.PairedEvaluated = append(s.PairedEvaluated, [2]int{evalCtxd, evalRaw})
			s.BackendLegMs = append(s.BackendLegMs, timing.BackendTTFTMs-r)
			s.GovernorMs, s.OtherMs = append(s.GovernorMs, timing.GovernorMs), append(s.OtherMs, timing.OtherMs)
		}
		var diffs []float64
		for i := range s.PairedCtxdMs {
			diffs = append(diffs, s.PairedCtxdMs[i]-s.PairedRawMs[i])
		}
		s.OverheadP50, s.OwnP50 = percentile(diffs, 0.5), percentile(s.OwnMs, 0.5)
		s.BackendLegP50, s.GovernorP50, s.OtherP50 = percentile(s.BackendLegMs, 0.5), percentile(s.GovernorMs, 0.5), percentile(s.OtherMs, 0.5)
		cfg.Log("  stable %d tokens: llama-server cold %.0f ms, warm p50 %.0f ms; Ollama cold %.0f ms, warm p50 %.0f ms; ctxd − raw p50 %.2f ms (backend leg %.2f ms), inside p50 %.2f ms (governor %.2f ms, other %.2f ms)",
			s.StableTokens, s.LlamaColdMs, percentile(s.LlamaWarmMs, 0.5), s.OllamaColdMs, percentile(s.OllamaWarmMs, 0.5), s.OverheadP50, s.BackendLegP50, s.OwnP50, s.GovernorP50, s.OtherP50)
		out = append(out, s)
	}
	return out, server, nil
}

// evaluated is the prompt tokens the backend evaluated: all of them where
// it did not measure its reuse.
func evaluated(sum *ctxd.Summary) int {
	if sum.BackendCachedTokens == nil {
		return sum.PromptTokens
	}
	return sum.PromptTokens - *sum.BackendCachedTokens
}

// llamaPID finds the managed llama-server of a state directory.
func llamaPID(state string) (int, error) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && strings.Contains(string(cmdline), filepath.Join(state, "llamacpp", "slots")) {
			var pid int
			fmt.Sscan(filepath.Base(d), &pid)
			return pid, nil
		}
	}
	return 0, fmt.Errorf("bench: no llama-server of %s", state)
}

// daemonStack is an in-process daemon and its client.
type daemonStack struct {
	ctxd *client.Client
	stop func()
}

// runDaemon runs a daemon with dc until stop, once it is ready.
func runDaemon(ctx context.Context, dc config.Config) (*daemonStack, error) {
	d, err := daemon.New(dc, daemon.Options{Logger: slog.New(slog.DiscardHandler), Version: "bench",
		BackendEnv: []string{"PATH=" + os.Getenv("PATH")}})
	if err != nil {
		return nil, err
	}
	ln, err := daemon.Listen(dc.Daemon.Socket)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Run(dctx, ln, func() { close(ready) }) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
			ln.Close()
		}
	}
	select {
	case <-ready:
	case err := <-done:
		ln.Close()
		return nil, fmt.Errorf("daemon stopped: %w", err)
	case <-time.After(5 * time.Minute):
		stop()
		return nil, fmt.Errorf("daemon not ready within 5 minutes")
	}
	return &daemonStack{ctxd: client.New(dc.Daemon.Socket), stop: stop}, nil
}
