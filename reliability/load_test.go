package reliability

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

// sampler reads the daemon's memory and goroutines on a ticker and keeps
// the peaks.
type sampler struct {
	mu         sync.Mutex // guards the fields below
	hwmKB      int64      // VmHWM: the resident set's peak, as the kernel counts it
	rssKB      int64      // the largest VmRSS read
	threads    int64      // the most OS threads read
	goroutines int        // the most go_goroutines read; 0: no /metrics
	samples    int
	errs       int
}

// run samples every interval until ctx ends.
func (s *sampler) run(ctx context.Context, pid int, c *client.Client, interval time.Duration) {
	for sleep(ctx, interval) {
		st, err := procStatus(pid, "VmHWM", "VmRSS", "Threads")
		g, ok := goroutines(ctx, c)
		s.mu.Lock()
		s.samples++
		if err != nil {
			s.errs++
		}
		s.hwmKB = max(s.hwmKB, st["VmHWM"])
		s.rssKB = max(s.rssKB, st["VmRSS"])
		s.threads = max(s.threads, st["Threads"])
		if ok {
			s.goroutines = max(s.goroutines, g)
		}
		s.mu.Unlock()
	}
}

func (s *sampler) goroutineText() string {
	if s.goroutines == 0 {
		return "n/a (the daemon served no `GET /metrics` when measured)"
	}
	return fmt.Sprint(s.goroutines)
}

// loadResult is one request of the load test.
type loadResult struct {
	agent int
	a     asked
}

// TestLoad runs many agents at once against one daemon, each asking in
// its own sessions. Every request must succeed or be refused by the
// governor (does_not_fit) with a reason; the daemon's peak memory and
// goroutines and each agent's queue wait are reported.
func TestLoad(t *testing.T) {
	e := setup(t)
	agents, requests := 8, 100
	if *full {
		agents, requests = 64, 2048
	}
	perAgent := (requests + agents - 1) / agents
	d := e.newDaemon(t, defaultLimits)
	d.start(t)
	c := client.New(d.socket)
	before, _ := procStatus(d.pid(), "VmRSS")

	var s sampler
	sctx, stopSampler := context.WithCancel(t.Context())
	sampled := make(chan struct{})
	go func() { defer close(sampled); s.run(sctx, d.pid(), c, 100*time.Millisecond) }()

	results := make(chan loadResult, agents*perAgent)
	began := time.Now()
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() {
			ac := client.New(d.socket) // each agent its own connections, as separate processes would
			for n := range perAgent {
				id := fmt.Sprintf("load-a%d-s%d", i, n/8) // sessions of 8 turns
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
				a := ask(ctx, ac, id, fmt.Sprintf("agent %d request %d: which handler returns kind %d?", i, n, n), 8)
				cancel()
				results <- loadResult{agent: i, a: a}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	close(results)
	stopSampler()
	<-sampled
	d.stop(t)

	var (
		ok, refused int
		failures    = map[string]int{}
		waits       = map[int][]float64{} // queue wait per agent, ms
		all, ttfts  []float64
		daemonTTFT  []float64 // the summary's ttft_ms: from the request's arrival
		backend     []float64 // the summary's timing.backend_ttft_ms: from sending to the backend
		totals      []float64 // the summary's total_ms
		prompt      []float64 // prompt tokens
		governed    int
	)
	for r := range results {
		if r.a.err != nil {
			if api := (*client.APIError)(nil); errors.As(r.a.err, &api) && api.Kind == ctxd.KindDoesNotFit {
				refused++
				continue
			}
			failures[errorClass(r.a.err)]++
			t.Errorf("agent %d: %v", r.agent, r.a.err)
			continue
		}
		ok++
		w := r.a.sum.QueueWaitMs
		waits[r.agent] = append(waits[r.agent], w)
		all = append(all, w)
		ttfts = append(ttfts, ms(r.a.ttft))
		daemonTTFT = append(daemonTTFT, r.a.sum.TTFTMillis)
		backend = append(backend, r.a.sum.Timing.BackendTTFTMs)
		totals = append(totals, r.a.sum.TotalMillis)
		prompt = append(prompt, float64(r.a.sum.PromptTokens))
		if len(r.a.sum.Governor) > 0 {
			governed++
		}
	}
	if ok == 0 {
		t.Fatal("no request succeeded")
	}
	// Fairness: each agent's median and worst wait, and how the agents
	// compare with one another.
	var agentMedian, agentMax []float64
	for _, i := range slices.Sorted(maps.Keys(waits)) {
		agentMedian = append(agentMedian, quantile(waits[i], 0.5))
		agentMax = append(agentMax, quantile(waits[i], 1))
	}
	t.Logf("%d agents, %d requests in %s: %d ok, %d refused, failures %v; VmHWM %d kB, goroutines %s; queue wait p50 %.0f max %.0f ms",
		agents, agents*perAgent, elapsed, ok, refused, failures, s.hwmKB, s.goroutineText(), quantile(all, 0.5), quantile(all, 1))

	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured by `go test ./reliability -run TestLoad -timeout 60m -args -full -write ../docs/reliability.md` (or `make reliability`), %s, on %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), e.machine())
	fmt.Fprintf(&sb, "%d agents at once, each with its own connections to the Unix socket, sent %d asks in all (%d each, in sessions of 8 turns, answers of at most 8 tokens) to one daemon over an external `ollama serve` with %d slots. %s of wall time (%.1f requests/s). Memory and goroutines were sampled every 100 ms; the resident set's peak is the kernel's (VmHWM in /proc/PID/status), %d kB after start-up.\n\n",
		agents, agents*perAgent, perAgent, slots, elapsed.Round(time.Second), float64(agents*perAgent)/elapsed.Seconds(), before["VmRSS"])
	sb.WriteString("| requests | succeeded | refused by the governor | other failures | peak RSS (VmHWM) | peak OS threads | peak goroutines |\n")
	sb.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
	fmt.Fprintf(&sb, "| %d | %d | %d | %d | %.1f MiB | %d | %s |\n\n",
		agents*perAgent, ok, refused, agents*perAgent-ok-refused, float64(s.hwmKB)/1024, s.threads, s.goroutineText())
	fmt.Fprintf(&sb, "Queue wait (the summary's `queue_wait_ms`: waiting for the session's earlier request and for a slot), over all requests and per agent. Fairness is how the agents' own medians and worst waits spread: a fair queue keeps the most-waiting agent close to the median agent. %d answers carried a governor action (karma selection on a session's first turn, or fitting the window).\n\n", governed)
	sb.WriteString("| queue wait | p50 | p95 | max |\n|---|---:|---:|---:|\n")
	fmt.Fprintf(&sb, "| all requests | %.0f ms | %.0f ms | %.0f ms |\n", quantile(all, 0.5), quantile(all, 0.95), quantile(all, 1))
	fmt.Fprintf(&sb, "| agents' median waits (max / median agent: %.2f) | %.0f ms | %.0f ms | %.0f ms |\n",
		quantile(agentMedian, 1)/quantile(agentMedian, 0.5), quantile(agentMedian, 0.5), quantile(agentMedian, 0.95), quantile(agentMedian, 1))
	fmt.Fprintf(&sb, "| agents' worst waits (max / median agent: %.2f) | %.0f ms | %.0f ms | %.0f ms |\n",
		quantile(agentMax, 1)/quantile(agentMax, 0.5), quantile(agentMax, 0.5), quantile(agentMax, 0.95), quantile(agentMax, 1))
	fmt.Fprintf(&sb, "| time to first token at the client | %.0f ms | %.0f ms | %.0f ms |\n", quantile(ttfts, 0.5), quantile(ttfts, 0.95), quantile(ttfts, 1))
	fmt.Fprintf(&sb, "| time to first token from the request's arrival (summary `ttft_ms`) | %.0f ms | %.0f ms | %.0f ms |\n", quantile(daemonTTFT, 0.5), quantile(daemonTTFT, 0.95), quantile(daemonTTFT, 1))
	fmt.Fprintf(&sb, "| the backend's part of it (`timing.backend_ttft_ms`) | %.0f ms | %.0f ms | %.0f ms |\n", quantile(backend, 0.5), quantile(backend, 0.95), quantile(backend, 1))
	fmt.Fprintf(&sb, "| the request in the daemon (summary `total_ms`) | %.0f ms | %.0f ms | %.0f ms |\n", quantile(totals, 0.5), quantile(totals, 0.95), quantile(totals, 1))
	fmt.Fprintf(&sb, "| prompt tokens | %.0f | %.0f | %.0f |\n\n", quantile(prompt, 0.5), quantile(prompt, 0.95), quantile(prompt, 1))
	sb.WriteString("Failures other than the governor's refusals:\n\n")
	sb.WriteString(failureList(failures))
	report(t, "load", sb.String())
}
