package reliability

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

var baseline = flag.String("baseline", "", "TestConnections: also measure the daemon as built from this git revision (e.g. one before a fix), side by side")

// flood holds idle and slow-body connections open to the daemon's socket
// until ctx ends: each one the daemon cuts is opened again.
type flood struct {
	idleHeld, slowHeld atomic.Int64 // open now (idle: answered and kept alive; slow: headers sent)
	idleCuts, slowCuts atomic.Int64 // closed by the daemon
	idlePeak           atomic.Int64 // most idle connections answered and open at once
	dialErrs           atomic.Int64
}

// run opens idle and slow connections and keeps them open until ctx
// ends; it returns once every connection is closed.
func (f *flood) run(ctx context.Context, socket string, idle, slow int) {
	var wg sync.WaitGroup
	for range idle {
		wg.Go(func() { f.idleConn(ctx, socket) })
	}
	for range slow {
		wg.Go(func() { f.slowConn(ctx, socket) })
	}
	wg.Wait()
}

// dial connects, retrying while the socket's backlog is full.
func (f *flood) dial(ctx context.Context, socket string) (net.Conn, bool) {
	for {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socket)
		if err == nil {
			return conn, true
		}
		f.dialErrs.Add(1)
		if !sleep(ctx, 100*time.Millisecond) {
			return nil, false
		}
	}
}

// closeOnDone closes conn when ctx ends, so that blocked reads return.
func closeOnDone(ctx context.Context, conn net.Conn) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			conn.Close()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// idleConn sends one request (GET /v1/health), reads its answer and
// leaves the connection idle (kept alive) until the daemon closes it.
func (f *flood) idleConn(ctx context.Context, socket string) {
	for ctx.Err() == nil {
		conn, ok := f.dial(ctx, socket)
		if !ok {
			return
		}
		stop := closeOnDone(ctx, conn)
		answered := false
		if _, err := fmt.Fprint(conn, "GET /v1/health HTTP/1.1\r\nHost: ctxd\r\n\r\n"); err == nil {
			br := bufio.NewReader(conn)
			if resp, err := http.ReadResponse(br, nil); err == nil {
				_, _ = br.Discard(int(max(resp.ContentLength, 0)))
				resp.Body.Close()
				answered = true
				f.idlePeak.Store(max(f.idlePeak.Load(), f.idleHeld.Add(1)))
				_, _ = br.ReadByte() // blocks until the daemon closes it (or ctx ends)
				f.idleHeld.Add(-1)
			}
		}
		stop()
		conn.Close()
		if ctx.Err() == nil && answered {
			f.idleCuts.Add(1)
		}
	}
}

// slowConn sends a request's headers and then its body one byte a
// second, until the daemon cuts it off.
func (f *flood) slowConn(ctx context.Context, socket string) {
	for ctx.Err() == nil {
		conn, ok := f.dial(ctx, socket)
		if !ok {
			return
		}
		stop := closeOnDone(ctx, conn)
		if _, err := fmt.Fprint(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"); err == nil {
			f.slowHeld.Add(1)
			buf := make([]byte, 512)
			for ctx.Err() == nil {
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				_, err := conn.Read(buf)
				var ne net.Error
				if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
					break // an answer (the daemon gave up on the body) or closed
				}
				if _, err := conn.Write([]byte(" ")); err != nil {
					break
				}
			}
			f.slowHeld.Add(-1)
		}
		stop()
		conn.Close()
		if ctx.Err() == nil {
			f.slowCuts.Add(1)
		}
	}
}

// phaseStats is what the agents saw in one phase.
type phaseStats struct {
	ttfts    []float64 // ms, at the client, connection included
	queue    []float64 // ms, the summary's queue_wait_ms: waiting inside the daemon for a slot
	outside  []float64 // ms, the client's TTFT less the summary's (from the request's arrival): waiting to be accepted, mostly
	failures map[string]int
}

// connResult is one daemon's run: without and with the flood.
type connResult struct {
	name           string
	quiet, flooded phaseStats
	peakFDs        int
	f              *flood
}

// countFDs is how many descriptors the process has open.
func countFDs(pid int) int {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(entries)
}

// freshConnections is a client whose every request opens a connection of
// its own and closes it after: an agent that connects for each question
// (as `ctxd ask` does), which is what a full listener makes wait.
func freshConnections(socket string) *client.Client {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return client.New(socket, client.WithTransport(tr))
}

// measureConnections runs agents against daemon d for a quiet phase, then
// for a phase with the flood held open, and returns what they saw.
func measureConnections(t *testing.T, d *daemonProc, agents, idle, slow int, quiet, flooded time.Duration) connResult {
	t.Helper()
	d.start(t)
	defer d.stop(t)
	pid := d.pid()
	const (
		phaseQuiet = iota
		phaseFlood
		phaseAfter // the flood is gone: asks started now are not counted
	)
	var (
		phase atomic.Int32
		mu    sync.Mutex // guards r's phases
		r     = connResult{f: &flood{},
			quiet: phaseStats{failures: map[string]int{}}, flooded: phaseStats{failures: map[string]int{}}}
	)
	// Each agent finishes the ask it has started, so that an ask the
	// flood held up counts with all its wait.
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() {
			c := freshConnections(d.socket)
			for n := 0; ; n++ {
				during := phase.Load()
				if during == phaseAfter {
					return
				}
				actx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
				a := ask(actx, c, fmt.Sprintf("conn-a%d-s%d", i, n/8), fmt.Sprintf("agent %d question %d: what does handler %d do?", i, n, n), 4)
				cancel()
				mu.Lock()
				p := &r.quiet
				if during == phaseFlood {
					p = &r.flooded
				}
				if a.err != nil {
					p.failures[errorClass(a.err)]++
					t.Errorf("agent %d (flood %v): %v", i, during == phaseFlood, a.err)
				} else {
					p.ttfts = append(p.ttfts, ms(a.ttft))
					p.queue = append(p.queue, a.sum.QueueWaitMs)
					p.outside = append(p.outside, max(0, ms(a.ttft)-fromArrival(a.sum)))
				}
				mu.Unlock()
			}
		})
	}
	sleep(t.Context(), quiet)
	fctx, stopFlood := context.WithCancel(t.Context())
	flooding := make(chan struct{})
	go func() { defer close(flooding); r.f.run(fctx, d.socket, idle, slow) }()
	phase.Store(phaseFlood)
	for end := time.Now().Add(flooded); time.Now().Before(end) && t.Context().Err() == nil; sleep(t.Context(), 200*time.Millisecond) {
		r.peakFDs = max(r.peakFDs, countFDs(pid))
	}
	phase.Store(phaseAfter)
	stopFlood()
	<-flooding
	wg.Wait()
	return r
}

// buildRevision builds cmd/ctxd as it was at git revision rev, into dir.
func buildRevision(t *testing.T, rev, dir string) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", rev, err, out)
	}
	bin := filepath.Join(dir, "ctxd-"+rev)
	build := exec.Command("go", "build", "-o", bin, "./cmd/ctxd")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cmd/ctxd at %s: %v\n%s", rev, err, out)
	}
	return bin
}

// TestConnections measures agents asking while the socket is flooded
// with idle (kept-alive) and slow-body connections: every ask must still
// be answered; their time to first token with and without the flood is
// reported.
func TestConnections(t *testing.T) {
	e := setup(t)
	agents, idle, slow := 8, 50, 50
	quiet, flooded := 5*time.Second, 8*time.Second
	// The small version floods past a small cap, so CI goes through the
	// full listener's path too.
	l := limits{maxConnections: 64, bodyTimeout: 2 * time.Second, idleTimeout: 2 * time.Minute}
	if *full {
		idle, slow = 1000, 1000
		quiet, flooded = 30*time.Second, 90*time.Second
		l = defaultLimits
	}
	type run struct {
		name string
		bin  string
	}
	runs := []run{{"this tree", e.ctxd}}
	if *baseline != "" {
		runs = append([]run{{"at " + *baseline, buildRevision(t, *baseline, t.TempDir())}}, runs...)
	}
	var results []connResult
	for _, rn := range runs {
		d := e.newDaemon(t, l)
		d.bin = rn.bin
		r := measureConnections(t, d, agents, idle, slow, quiet, flooded)
		r.name = rn.name
		t.Logf("%s: quiet %d asks p50 %.0f ms; flooded %d asks p50 %.0f max %.0f ms; failures %v %v; idle cuts %d slow cuts %d; peak fds %d",
			rn.name, len(r.quiet.ttfts), quantile(r.quiet.ttfts, 0.5), len(r.flooded.ttfts), quantile(r.flooded.ttfts, 0.5),
			quantile(r.flooded.ttfts, 1), r.quiet.failures, r.flooded.failures, r.f.idleCuts.Load(), r.f.slowCuts.Load(), r.peakFDs)
		if len(r.quiet.ttfts) == 0 {
			t.Errorf("%s: no ask was answered before the flood", rn.name)
		}
		results = append(results, r)
	}

	var sb strings.Builder
	cmd := "go test ./reliability -run TestConnections -timeout 60m -args -full -write ../docs/reliability.md"
	if *baseline != "" {
		cmd += " -baseline " + *baseline
	}
	fmt.Fprintf(&sb, "Measured by `%s` (`make reliability` measures this tree alone), %s, on %s.\n\n",
		cmd, time.Now().UTC().Format("2006-01-02"), e.machine())
	fmt.Fprintf(&sb, "%d agents ask without stopping (answers of at most 4 tokens), each question on a connection of its own as `ctxd ask` opens one, for %s; then, for %s more, %d idle connections (each sent `GET /v1/health`, read the answer and stays kept alive) and %d slow-body connections (headers of a `POST /v1/ask` with `Content-Length: 100000`, then one byte a second) are held open beside them, each reopened when the daemon closes it. The daemon's settings: `daemon.max_connections` = %d, `daemon.body_timeout` = %s, `daemon.idle_timeout` = %s. Time to first token is the agent's, from sending the question (connection included) to the first token; an ask is counted in the phase it started in. Part of an ask's wait is inside the daemon, queued for one of the backend's %d slots behind the other agents (the summary's `queue_wait_ms`) and then waiting for the backend's first token (slower while the flood takes CPU from the model on this 2-core machine); the rest, the agent's time to first token less the summary's `ttft_ms` (counted from the request's arrival), passed before the daemon read the request: mostly the connection's wait to be accepted.\n\n",
		agents, quiet, flooded, idle, slow, l.maxConnections, l.bodyTimeout, l.idleTimeout, slots)
	sb.WriteString("| daemon | flood | asks answered | TTFT p50 | TTFT p95 | TTFT max | queue wait in the daemon p50 / max | before the request reached the daemon p50 / max | errors | idle / slow connections the daemon closed | peak descriptors |\n")
	sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, r := range results {
		for _, ph := range []struct {
			name string
			s    phaseStats
		}{{"none", r.quiet}, {fmt.Sprintf("%d idle + %d slow", idle, slow), r.flooded}} {
			cuts, fds := "", ""
			if ph.name != "none" {
				cuts, fds = fmt.Sprintf("%d / %d", r.f.idleCuts.Load(), r.f.slowCuts.Load()), fmt.Sprint(r.peakFDs)
			}
			fmt.Fprintf(&sb, "| %s | %s | %d | %.0f ms | %.0f ms | %.0f ms | %.0f / %.0f ms | %.0f / %.0f ms | %s | %s | %s |\n", r.name, ph.name, len(ph.s.ttfts),
				quantile(ph.s.ttfts, 0.5), quantile(ph.s.ttfts, 0.95), quantile(ph.s.ttfts, 1), quantile(ph.s.queue, 0.5), quantile(ph.s.queue, 1),
				quantile(ph.s.outside, 0.5), quantile(ph.s.outside, 1), inline(ph.s.failures), cuts, fds)
		}
	}
	if *baseline != "" {
		fmt.Fprintf(&sb, "\nThe rows \"at %s\" are the daemon as committed there, whose listener at the cap only waited for a connection to close: the idle connections held their places for `idle_timeout` and the slow ones for `body_timeout`, and the agents waited behind them. \"This tree\" closes, at the cap, the connection that has waited longest without a request in progress (kept alive between requests for a quarter of a second, or silent for a second since it connected; httpapi/limit.go), so only requests in progress hold places. A flood that reopens every connection the moment it is closed keeps the socket's backlog full of its reconnections, and an agent's new connection waits its turn behind them: that is the remaining wait before the request reached the daemon.\n", *baseline)
	}
	report(t, "connections", sb.String())
}

// fromArrival is the summary's time to first token from the request's
// arrival. A daemon from before the summary had timing (a -baseline
// revision) counted ttft_ms from sending to the backend, after the queue.
func fromArrival(sum *ctxd.Summary) float64 {
	if sum.Timing == (ctxd.Timing{}) {
		return sum.QueueWaitMs + sum.TTFTMillis
	}
	return sum.TTFTMillis
}

// inline is failures on one line.
func inline(f map[string]int) string {
	if len(f) == 0 {
		return "none"
	}
	return strings.ReplaceAll(strings.TrimSpace(strings.ReplaceAll(failureList(f), "- ", "")), "\n", "; ")
}
