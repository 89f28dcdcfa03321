package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/persona"
)

// The personas phase: three personas over two trained models on managed
// llama-servers, under a memory budget that holds two at a time, and a
// workload that goes round them. Each persona's first turn is cold (its
// server starts, its prompt of about PersonaTokens is evaluated), its
// second warm; after that every turn returns to a persona that was
// evacuated to make room for another (its slot saved, its server stopped)
// and is restored. Servers' resident memory is sampled throughout. Beside
// it, llama-server's router mode is measured on the same two models:
// start, load and switch times and memory, against a server per model
// (what ctxd runs).

// PersonaTokens is the size of the codex every persona holds whole, in the
// first model's tokens; PersonaRounds the rounds of returns.
const (
	PersonaTokens = 7000
	PersonaRounds = 3
	personaNumCtx = 8192
)

// PersonasRun is the phase's result.
type PersonasRun struct {
	Personas    []PersonaSetup `json:"personas"`
	NumCtx      int            `json:"num_ctx"`
	BudgetBytes int64          `json:"budget_bytes"`
	Turns       []PersonaTurn  `json:"turns"`
	Evacuations int            `json:"evacuations"`
	Restores    int            `json:"restores"`
	Errors      []string       `json:"errors"`    // asks that failed
	Truncated   int            `json:"truncated"` // asks whose prompt the server saw shorter than ctxd sent it
	// Peak resident memory of every llama-server of the run together,
	// sampled every SampleMs, and the peak of what ctxd planned.
	PeakRSS     int64   `json:"peak_rss_bytes"`
	PeakPlanned int64   `json:"peak_planned_bytes"`
	Samples     int     `json:"samples"`
	SampleMs    float64 `json:"sample_ms"`
	// RSSPerPlan is each persona's server's resident memory over its plan,
	// read once it answered its first turn.
	RSSPerPlan map[string]float64 `json:"rss_per_plan"`
	Router     *RouterRun         `json:"router,omitempty"`
}

// PersonaSetup is one persona of the run.
type PersonaSetup struct {
	Name         string `json:"name"`
	Model        string `json:"model"`
	PlannedBytes int64  `json:"planned_bytes"`
}

// PersonaTurn is one ask: cold (the persona's first), warm (it was
// resident) or return (it had been evacuated).
type PersonaTurn struct {
	Persona      string   `json:"persona"`
	Kind         string   `json:"kind"`
	TTFTMs       float64  `json:"ttft_ms"` // from the request to the first token, at the client
	PromptTokens int      `json:"prompt_tokens"`
	Evaluated    int      `json:"evaluated"`
	Progress     []string `json:"progress,omitempty"`
}

// personasPhase runs the phase on the first two real models.
func personasPhase(ctx context.Context, cfg Config) (PersonasRun, error) {
	run := PersonasRun{NumCtx: personaNumCtx, RSSPerPlan: map[string]float64{}}
	if len(cfg.RealModels) < 2 {
		return run, fmt.Errorf("needs two models (RealModels)")
	}
	a, b := cfg.RealModels[0], cfg.RealModels[1]
	var paths [2]string
	for i, m := range []RealModel{a, b} {
		p, err := filepath.Abs(m.Path)
		if err != nil {
			return run, err
		}
		if _, err := os.Stat(p); err != nil {
			return run, fmt.Errorf("the model %s: %w (make models fetches it)", m.Name, err)
		}
		paths[i] = p
	}
	work, err := os.MkdirTemp("", "ctxd-bench-personas-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(work)
	tok, err := llamatok.Open(paths[0])
	if err != nil {
		return run, err
	}
	codexDir := filepath.Join(work, "codex")
	err = writeCodex(tok, codexDir, PersonaTokens)
	tok.Close()
	if err != nil {
		return run, err
	}

	state := filepath.Join(work, "state")
	dc := config.Default(config.Env{UID: os.Getuid(), Home: state})
	dc.Daemon.Socket, dc.Daemon.StateDir, dc.Daemon.LogLevel = filepath.Join(state, "s.sock"), state, "warn"
	dc.Backend.Kind, dc.Backend.Binary, dc.Backend.GGUF, dc.Backend.Model = "llamacpp", cfg.LlamaServerBin, paths[0], "coder"
	dc.Backend.NumCtx = personaNumCtx
	dc.Identity.Persona = "You write Go code for this codebase."
	dc.Limits.AnswerReserve, dc.Limits.MaxDepth = cfg.AnswerToks, 0
	dc.Codex.Path, dc.Codex.Watch, dc.Codex.CAGRatio = codexDir, false, 0.95
	dc.Personas = []config.Persona{
		{Name: "reviewer", Persona: "You review Go code and name what is wrong with it."},
		{Name: "writer", GGUF: paths[1], Persona: "You write the documentation of this codebase."},
	}
	plan := func(gguf string) (int64, error) {
		c := dc.Backend
		c.GGUF = gguf
		probe := hostenv.New(hostenv.Config{})
		defer probe.Close()
		_, n, err := bringup.Config{Backend: c, Limits: dc.Limits, Memory: probe}.Plan()
		return n, err
	}
	pa, err := plan(paths[0])
	if err != nil {
		return run, err
	}
	pb, err := plan(paths[1])
	if err != nil {
		return run, err
	}
	dc.Limits.MemoryBudgetMB = int((pa+max(pa, pb))>>20) + 1 // two at a time, never three
	run.BudgetBytes = int64(dc.Limits.MemoryBudgetMB) << 20
	run.Personas = []PersonaSetup{{"coder", a.Name, pa}, {"reviewer", a.Name, pa}, {"writer", b.Name, pb}}

	st, err := runDaemon(ctx, dc)
	if err != nil {
		return run, err
	}
	defer st.stop()

	// The sampler: every llama-server of this run's state directory.
	sampleEvery := 100 * time.Millisecond
	run.SampleMs = ms(sampleEvery)
	var mu sync.Mutex
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			rss := serversRSS(state)
			mu.Lock()
			run.PeakRSS = max(run.PeakRSS, rss)
			run.Samples++
			mu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	status := func() (*httpapi.PersonasStatus, error) {
		var s httpapi.Status
		if err := st.ctxd.GetJSON(ctx, "/v1/status", &s); err != nil {
			return nil, err
		}
		if s.Personas == nil {
			return nil, fmt.Errorf("status shows no personas")
		}
		run.PeakPlanned = max(run.PeakPlanned, s.Personas.PlannedBytes)
		return s.Personas, nil
	}
	asked := map[string]bool{}
	ask := func(name string, turn int) error {
		before, err := status()
		if err != nil {
			return err
		}
		// A persona's first turn is cold (the default's server is up from
		// the start, its prompt never evaluated); a later one returns if the
		// persona was evacuated, and is warm otherwise.
		kind := "warm"
		if !asked[name] {
			kind = "cold"
		} else if slices.ContainsFunc(before.Personas, func(p httpapi.PersonaStatus) bool { return p.Name == name && p.State == persona.Evacuated }) {
			kind = "return"
		}
		asked[name] = true
		pt := PersonaTurn{Persona: name, Kind: kind}
		start := time.Now()
		var ttft time.Duration
		sum, err := st.ctxd.Ask(ctx, ctxd.AskRequest{Session: "bench-" + name, Persona: name,
			Query: fmt.Sprintf("Question %d: which handler serves kind %d?", turn, 3+turn)}, func(string) {
			if ttft == 0 {
				ttft = time.Since(start)
			}
		})
		if err != nil {
			run.Errors = append(run.Errors, fmt.Sprintf("%s turn %d: %v", name, turn, err))
			cfg.Log("personas: %s turn %d failed: %v", name, turn, err)
			return nil
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		pt.TTFTMs, pt.PromptTokens, pt.Evaluated = ms(ttft), sum.PromptTokens, sum.PromptTokens-sum.CachedTokens
		if sum.BackendPromptN > 0 && sum.BackendPromptN < sum.PromptTokens {
			run.Truncated++
		}
		if sum.BackendCachedTokens != nil {
			pt.Evaluated = sum.BackendPromptN - *sum.BackendCachedTokens
		}
		run.Turns = append(run.Turns, pt)
		cfg.Log("personas: %s %s turn: %d prompt tokens, %d evaluated, first token after %.0f ms", name, kind, pt.PromptTokens, pt.Evaluated, pt.TTFTMs)
		if kind == "cold" {
			after, err := status()
			if err != nil {
				return err
			}
			for _, p := range after.Personas {
				if p.Name == name && p.RSS > 0 && p.PlannedBytes > 0 {
					run.RSSPerPlan[name] = float64(p.RSS) / float64(p.PlannedBytes)
				}
			}
		}
		return nil
	}
	turn := 0
	for _, name := range []string{"coder", "coder", "reviewer", "reviewer", "writer", "writer"} {
		turn++
		if err := ask(name, turn); err != nil {
			stopSampling()
			return run, err
		}
	}
	for range PersonaRounds {
		for _, name := range []string{"coder", "reviewer", "writer"} {
			turn++
			if err := ask(name, turn); err != nil {
				stopSampling()
				return run, err
			}
		}
	}
	final, err := status()
	stopSampling()
	<-sampled
	if err != nil {
		return run, err
	}
	for _, p := range final.Personas {
		run.Evacuations += p.Evacuations
		run.Restores += p.Restores
	}
	st.stop()

	if rr, err := routerPhase(ctx, cfg, paths, work); err != nil {
		cfg.Log("personas: the router measurement failed: %v", err)
	} else {
		run.Router = &rr
	}
	return run, nil
}

// serversRSS is the resident memory of every llama-server whose command
// line names dir.
func serversRSS(dir string) int64 {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var sum int64
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte("llama-server")) || !bytes.Contains(cmd, []byte(dir)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		sum += hostenv.ProcessRSS(pid)
	}
	return sum
}

// RouterRun compares llama-server's router mode (--models-dir,
// --models-max 1: one model loaded at a time, a child process each) with a
// server per model started and stopped, on the same two models, window
// and slot.
type RouterRun struct {
	// Router: the router up; each model loaded through it (first A, then B
	// evicting A, then A again evicting B); resident memory of the router
	// and its child after each load.
	RouterStartMs float64        `json:"router_start_ms"`
	RouterLoads   []ModelLoadRun `json:"router_loads"`
	// A server per model: each started until it answers with its model
	// loaded, and its resident memory.
	DirectStarts []ModelLoadRun `json:"direct_starts"`
}

// ModelLoadRun is one model made ready: how long it took and what
// resident memory the servers then held.
type ModelLoadRun struct {
	Model    string  `json:"model"`
	Ms       float64 `json:"ms"`
	RSSBytes int64   `json:"rss_bytes"`
}

// routerPhase measures the router and a server per model side by side.
func routerPhase(ctx context.Context, cfg Config, paths [2]string, work string) (RouterRun, error) {
	var rr RouterRun
	bin, err := exec.LookPath(cfg.LlamaServerBin)
	if err == nil {
		bin, err = filepath.Abs(bin)
	}
	if err != nil {
		return rr, err
	}
	dir := filepath.Join(work, "router-models")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rr, err
	}
	names := make([]string, 2)
	for i, p := range paths {
		names[i] = strings.TrimSuffix(filepath.Base(p), ".gguf")
		if err := os.Symlink(p, filepath.Join(dir, filepath.Base(p))); err != nil {
			return rr, err
		}
	}
	common := []string{"--host", "127.0.0.1", "-c", strconv.Itoa(personaNumCtx), "-np", "1", "--no-webui", "--cache-ram", "0"}
	// A server per model.
	for i, p := range paths {
		port, err := freePort()
		if err != nil {
			return rr, err
		}
		start := time.Now()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-m", p, "--port", strconv.Itoa(port)}, common...)...)
		if err := cmd.Start(); err != nil {
			return rr, err
		}
		err = waitHealthy(ctx, port)
		took := time.Since(start)
		rss := hostenv.ProcessRSS(cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			return rr, err
		}
		rr.DirectStarts = append(rr.DirectStarts, ModelLoadRun{Model: names[i], Ms: ms(took), RSSBytes: rss})
	}
	// The router.
	port, err := freePort()
	if err != nil {
		return rr, err
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--models-dir", dir, "--models-max", "1", "--port", strconv.Itoa(port)}, common...)...)
	cmd.Dir = work
	if err := cmd.Start(); err != nil {
		return rr, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := waitHealthy(ctx, port); err != nil {
		return rr, err
	}
	rr.RouterStartMs = ms(time.Since(start))
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	for _, name := range []string{names[0], names[1], names[0]} {
		start := time.Now()
		body, _ := json.Marshal(map[string]string{"model": name})
		resp, err := http.Post(base+"/models/load", "application/json", bytes.NewReader(body))
		if err != nil {
			return rr, err
		}
		resp.Body.Close()
		if err := waitLoaded(ctx, base, name); err != nil {
			return rr, err
		}
		took := time.Since(start)
		time.Sleep(200 * time.Millisecond) // the evicted child's exit
		rr.RouterLoads = append(rr.RouterLoads, ModelLoadRun{Model: name, Ms: ms(took), RSSBytes: serversRSS(dir) + hostenv.ProcessRSS(cmd.Process.Pid)})
	}
	return rr, nil
}

// waitHealthy waits until a llama-server answers /health with its model
// loaded.
func waitHealthy(ctx context.Context, port int) error {
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/health"
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("llama-server on port %d did not come up", port)
}

// waitLoaded waits until the router lists the model as loaded.
func waitLoaded(ctx context.Context, base, name string) error {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := http.Get(base + "/models")
		if err != nil {
			continue
		}
		var list struct {
			Data []struct {
				ID     string `json:"id"`
				Status struct {
					Value string `json:"value"`
				} `json:"status"`
			} `json:"data"`
		}
		err = json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, m := range list.Data {
			if m.ID == name && m.Status.Value == "loaded" {
				return nil
			}
		}
	}
	return fmt.Errorf("the router did not load %s", name)
}

// personasMarkdown writes the phase's section.
func (r *Report) personasMarkdown(b *strings.Builder) {
	g := r.Personas
	if g == nil {
		return
	}
	fmt.Fprintf(b, "### Several personas under one memory budget (issue 29)\n\nMeasured %s: three personas over two trained models, each on a managed llama-server (window %d, one slot), every persona holding the same codex whole (about %s tokens of the first model's), under `limits.memory_budget_mb` = %s, which holds two personas at a time and never three. The workload: each persona's first turn (cold: its prompt is evaluated, and for the two other than the default, loaded when the daemon starts, its server starts first) and a second (warm), then %d rounds going round all three, so that every turn returns to the persona evacuated to make room for the one before (its slot saved to disk, its server stopped) and restores it. TTFT is the client's: from the request to the first token, loading and restoring included.\n\n",
		r.ranAt(PhasePersonas), g.NumCtx, thousands(PersonaTokens), bytesMiB(g.BudgetBytes), PersonaRounds)
	b.WriteString("| persona | model | planned | cold first turn | warm turn | return after evacuation (median) | cold ÷ return | evaluated on return (median) |\n|---|---|---|---|---|---|---|---|\n")
	for _, p := range g.Personas {
		var cold, warm float64
		var ret, retEval []float64
		prompt := 0
		for _, t := range g.Turns {
			if t.Persona != p.Name {
				continue
			}
			switch t.Kind {
			case "cold":
				cold, prompt = t.TTFTMs, t.PromptTokens
			case "warm":
				if warm == 0 {
					warm = t.TTFTMs
				}
			case "return":
				ret = append(ret, t.TTFTMs)
				retEval = append(retEval, float64(t.Evaluated))
			}
		}
		mr := percentile(ret, 0.5)
		ratio := "–"
		if mr > 0 {
			ratio = fmt.Sprintf("%.0f×", cold/mr)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.0f ms (%s tokens) | %.0f ms | %.0f ms (%d returns) | %s | %s tokens |\n",
			p.Name, p.Model, bytesMiB(p.PlannedBytes), cold, thousands(prompt), warm, mr, len(ret), ratio, thousands(int(percentile(retEval, 0.5))))
	}
	fmt.Fprintf(b, "\n%d evacuations and %d restores; %d asks failed, %d were truncated. Peak resident memory of every llama-server together, sampled every %.0f ms (%d samples): %s, against the budget of %s; ctxd's plan peaked at %s.",
		g.Evacuations, g.Restores, len(g.Errors), g.Truncated, g.SampleMs, g.Samples, bytesMiB(g.PeakRSS), bytesMiB(g.BudgetBytes), bytesMiB(g.PeakPlanned))
	var names []string
	for n := range g.RSSPerPlan {
		names = append(names, n)
	}
	slices.Sort(names)
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, g.RSSPerPlan[n]))
	}
	if len(parts) > 0 {
		fmt.Fprintf(b, " Each server's resident memory over its plan after its first turn: %s.", strings.Join(parts, ", "))
	}
	b.WriteString("\n\n")
	if rr := g.Router; rr != nil {
		b.WriteString("Router mode against a server per model, on the same models, window and slot (a model made ready: the server answering `/health`, or the router listing the model loaded; resident memory of the servers then):\n\n| how | model | ready after | resident memory |\n|---|---|---|---|\n")
		for _, d := range rr.DirectStarts {
			fmt.Fprintf(b, "| a server per model: start | %s | %.0f ms | %s |\n", d.Model, d.Ms, bytesMiB(d.RSSBytes))
		}
		fmt.Fprintf(b, "| router: start, no model | – | %.0f ms | – |\n", rr.RouterStartMs)
		for i, l := range rr.RouterLoads {
			how := "router: load"
			if i > 0 {
				how = "router: switch (the other evicted)"
			}
			fmt.Fprintf(b, "| %s | %s | %.0f ms | %s |\n", how, l.Model, l.Ms, bytesMiB(l.RSSBytes))
		}
		b.WriteString("\n")
	}
}

func bytesMiB(n int64) string { return fmt.Sprintf("%s MiB", thousands(int(n>>20))) }

// freePort is a loopback port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
