package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/hostenv"
)

// The dashboard phase's runs: the open pages of each, in order (a run
// without pages between the others, so that drift shows), and each
// agent's turns per run.
var (
	DashboardRuns  = []int{0, 1, DashboardPages, 0, DashboardPages}
	DashboardPages = 16
	DashboardTurns = 25 // as the many-agents phase
)

// DashboardRun is the dashboard phase: the many-agents workload through a
// daemon of its own process (the ctxd binary), with open dashboard pages
// reading its event stream, run after run with none, one and many pages.
type DashboardRun struct {
	Agents int              `json:"agents"`
	Turns  int              `json:"turns_per_agent"`
	Model  string           `json:"model"`
	Runs   []DashboardPhase `json:"runs"`
	// PerPagePct is the daemon's CPU per open page, as a share of one
	// core: the mean of the many-page runs less the mean of the runs
	// without pages, over the pages.
	PerPagePct float64 `json:"per_page_cpu_pct"`
}

// DashboardPhase is one run.
type DashboardPhase struct {
	Pages    int     `json:"pages"`
	Requests int     `json:"requests"`
	WallS    float64 `json:"wall_s"`
	CPUPct   float64 `json:"daemon_cpu_pct"` // the daemon's user + system time over the run, % of one core
	// Heard is the turn events the pages got (each page hears every
	// turn); Missing the turns a page never heard.
	Heard   int `json:"heard"`
	Missing int `json:"missing"`
	// Delay is from an answer's end at its client to its turn event at a
	// page (negative: the page heard first), over every page and turn.
	DelayP50 float64 `json:"delay_p50_ms"`
	DelayP95 float64 `json:"delay_p95_ms"`
	DelayMax float64 `json:"delay_max_ms"`
	// BytesPerPage is what one page read, on average.
	BytesPerPage int64 `json:"bytes_per_page"`
}

// dashboardPhase runs the phase on the agents' model and one slot.
func dashboardPhase(ctx context.Context, cfg Config) (DashboardRun, error) {
	m := cfg.AgentModel
	run := DashboardRun{Agents: cfg.Agents, Turns: DashboardTurns,
		Model: fmt.Sprintf("%s (%.1fM parameters), num_ctx %d", m.Name, float64(m.Params())/1e6, cfg.NumCtx)}
	st, err := startStack(ctx, cfg, m, cfg.AgentModelPath, cfg.NumCtx, 1)
	if err != nil {
		return run, err
	}
	defer st.stop()
	d, err := startDaemonProcess(ctx, cfg, st)
	if err != nil {
		return run, err
	}
	defer d.stop()
	// Every agent's first turn, cold, before any run: the runs compare
	// warm turns.
	for i := range cfg.Agents {
		if _, _, err := ask(ctx, d.ctxd, fmt.Sprintf("warm-%d", i), question(i)); err != nil {
			return run, err
		}
	}
	var with, without []float64
	for n, pages := range DashboardRuns {
		cfg.Log("dashboard: run %d, %d page(s), %d agents × %d turns", n+1, pages, cfg.Agents, DashboardTurns)
		ph, err := dashboardOnce(ctx, cfg, d, n, pages)
		if err != nil {
			return run, err
		}
		cfg.Log("  daemon CPU %.2f%% of a core; delay p50 %.0f ms, p95 %.0f ms, max %.0f ms; %d heard, %d missing",
			ph.CPUPct, ph.DelayP50, ph.DelayP95, ph.DelayMax, ph.Heard, ph.Missing)
		run.Runs = append(run.Runs, ph)
		switch pages {
		case 0:
			without = append(without, ph.CPUPct)
		case DashboardPages:
			with = append(with, ph.CPUPct)
		}
	}
	run.PerPagePct = (mean(with) - mean(without)) / float64(DashboardPages)
	return run, nil
}

// daemonProcess is the ctxd binary serving the stack's Ollama.
type daemonProcess struct {
	cmd    *exec.Cmd
	socket string
	ctxd   *client.Client
	stop   func()
}

// startDaemonProcess runs `ctxd serve` over the stack's Ollama and codex,
// in a process of its own so that its CPU time is its own.
func startDaemonProcess(ctx context.Context, cfg Config, st *stack) (*daemonProcess, error) {
	dir := filepath.Join(st.work, "dashboard")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "s.sock")
	conf := fmt.Sprintf(`[daemon]
socket = %q
state_dir = %q
log_level = "warn"
max_dashboards_per_sigil = %d

[backend]
mode = "external"
url = %q
model = %q
slots = 1
num_ctx = %d
num_batch = 512

[codex]
path = %q
watch = false

[limits]
answer_reserve = %d
max_depth = 0
`, sock, filepath.Join(dir, "state"), DashboardPages+4, st.srv.URL().String(), cfg.AgentModel.Name, cfg.NumCtx,
		filepath.Join(st.work, "codex-half"), cfg.AnswerToks)
	path := filepath.Join(dir, "ctxd.toml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "ctxd.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, cfg.CtxdBin, "serve", "--config", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", cfg.CtxdBin, err)
	}
	d := &daemonProcess{cmd: cmd, socket: sock, ctxd: client.New(sock)}
	d.stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var s struct {
			Ready bool `json:"ready"`
		}
		if d.ctxd.GetJSON(ctx, "/v1/status", &s) == nil && s.Ready {
			return d, nil
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("the daemon was not ready within 2 minutes (its log: %s)", logf.Name())
		}
	}
}

// dashPageReader is one open page: it reads the event stream and notes
// when each turn event came.
type dashPageReader struct {
	mu    sync.Mutex
	heard map[string]time.Time // session/turn → arrival
	bytes int64
}

// dashboardOnce runs the agents once with pages pages open.
func dashboardOnce(ctx context.Context, cfg Config, d *daemonProcess, n, pages int) (DashboardPhase, error) {
	ph := DashboardPhase{Pages: pages}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.socket)
	}}}
	pctx, cancel := context.WithCancel(ctx)
	var readers []*dashPageReader
	var wg sync.WaitGroup
	defer func() {
		cancel() // the readers' streams end
		wg.Wait()
	}()
	for range pages {
		req, _ := http.NewRequestWithContext(pctx, "GET", "http://ctxd/v1/dashboard/events", nil)
		resp, err := hc.Do(req)
		if err != nil {
			return ph, err
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			return ph, fmt.Errorf("dashboard events: %s", resp.Status)
		}
		pr := &dashPageReader{heard: map[string]time.Time{}}
		readers = append(readers, pr)
		first := make(chan struct{})
		var once sync.Once
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 0, 1<<16), 1<<26)
			event := ""
			for sc.Scan() {
				line := sc.Bytes()
				pr.mu.Lock()
				pr.bytes += int64(len(line) + 1)
				pr.mu.Unlock()
				switch {
				case len(line) > 7 && string(line[:7]) == "event: ":
					event = string(line[7:])
				case len(line) > 6 && string(line[:6]) == "data: ":
					if event == "snapshot" {
						once.Do(func() { close(first) })
					}
					if event != "turn" {
						continue
					}
					var t struct {
						Session string `json:"session"`
						Summary struct {
							Turn int `json:"turn"`
						} `json:"summary"`
					}
					if json.Unmarshal(line[6:], &t) == nil {
						pr.mu.Lock()
						pr.heard[fmt.Sprintf("%s/%d", t.Session, t.Summary.Turn)] = time.Now()
						pr.mu.Unlock()
					}
				}
			}
		}()
		select {
		case <-first:
		case <-time.After(30 * time.Second):
			return ph, fmt.Errorf("a dashboard page got no snapshot in 30s")
		}
	}
	before, err := hostenv.ProcessCPU(d.cmd.Process.Pid)
	if err != nil {
		return ph, err
	}
	start := time.Now()
	var mu sync.Mutex
	ended := map[string]time.Time{}
	errs := make(chan error, cfg.Agents)
	var agents sync.WaitGroup
	for i := range cfg.Agents {
		agents.Add(1)
		go func() {
			defer agents.Done()
			session := fmt.Sprintf("r%d-agent-%d", n, i+1)
			for turn := range DashboardTurns {
				sum, _, err := ask(ctx, d.ctxd, session, question(1000*n+100*i+turn))
				if err != nil {
					errs <- fmt.Errorf("%s turn %d: %w", session, turn+1, err)
					return
				}
				mu.Lock()
				ended[fmt.Sprintf("%s/%d", session, sum.Turn)] = time.Now()
				mu.Unlock()
			}
		}()
	}
	agents.Wait()
	wall := time.Since(start)
	after, err := hostenv.ProcessCPU(d.cmd.Process.Pid)
	if err != nil {
		return ph, err
	}
	close(errs)
	if err := <-errs; err != nil {
		return ph, err
	}
	time.Sleep(2 * time.Second) // the last turns' events on their way
	ph.Requests, ph.WallS = len(ended), wall.Seconds()
	ph.CPUPct = 100 * (after - before).Seconds() / wall.Seconds()
	var delays []float64
	for _, pr := range readers {
		pr.mu.Lock()
		for key, end := range ended {
			at, ok := pr.heard[key]
			if !ok {
				ph.Missing++
				continue
			}
			ph.Heard++
			delays = append(delays, float64(at.Sub(end).Microseconds())/1000)
		}
		ph.BytesPerPage += pr.bytes
		pr.mu.Unlock()
	}
	if len(readers) > 0 {
		ph.BytesPerPage /= int64(len(readers))
	}
	if len(delays) > 0 {
		ph.DelayP50, ph.DelayP95, ph.DelayMax = percentile(delays, 0.5), percentile(delays, 0.95), slices.Max(delays)
		ph.DelayP50 += 0 // no "-0" in the table: a delay under half a millisecond either way is 0
		if math.Abs(ph.DelayP50) < 0.5 {
			ph.DelayP50 = 0
		}
	}
	return ph, nil
}

// dashboardMarkdown writes the dashboard section.
func (r *Report) dashboardMarkdown(b *strings.Builder) {
	g := r.Dashboard
	if g == nil {
		return
	}
	fmt.Fprintf(b, "### The dashboard's cost (issue 30)\n\nMeasured %s: the many-agents workload (%d agents, each its own session, %d turns each back to back, all at once, one slot; %s) through the `ctxd` binary in a process of its own, with dashboard pages reading its event stream (`GET /v1/dashboard/events`, as the page does) run after run: none, one, %d. Daemon CPU is its user and system time over the run, as a share of one core (the machine has 2; the model's runner is Ollama's, not counted). Delay is from an answer's end at its client to its turn event at a page (negative: the page heard first), over every page and turn.\n\n",
		r.ranAt(PhaseDashboard), g.Agents, g.Turns, g.Model, DashboardPages)
	b.WriteString("| run | open pages | requests | wall time | daemon CPU | turn events heard (missing) | delay p50 | delay p95 | delay max | read per page |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for i, p := range g.Runs {
		fmt.Fprintf(b, "| %d | %d | %d | %.1f s | %.2f%% | %d (%d) | %.0f ms | %.0f ms | %.0f ms | %s |\n", i+1, p.Pages, p.Requests, p.WallS, p.CPUPct,
			p.Heard, p.Missing, p.DelayP50, p.DelayP95, p.DelayMax, bytesKiB(p.BytesPerPage))
	}
	fmt.Fprintf(b, "\nEach open page costs the daemon **%.3f%% of a core** (the runs with %d pages less those with none, over %d; target < 1%%).\n\n",
		g.PerPagePct, DashboardPages, DashboardPages)
}

func bytesKiB(n int64) string { return fmt.Sprintf("%.0f KiB", float64(n)/1024) }
