package pgstore

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/pgtest"
)

var scaleWrite = flag.String("scale-write", "", "run the store's scale simulation and write its table into this file (docs/scale.md)")

// simTurn is what one daemon asks of a shared store for one agent's
// turn, as the orchestrator does with store.kind = "postgres" (nothing
// held in memory between requests): read the session's owner (before the
// request waits for the session), the session and its karma snapshot,
// append the turn, record the answer as a trace. A session's
// first turn also claims it and chooses its karma (the eligible traces,
// a snapshot saved); one turn in ten is judged (a verification).
func simTurn(ctx context.Context, s *Store, session, sigil string, turn int, ops *atomic.Int64, lat *latencies) error {
	op := func(f func() error) error {
		t0 := time.Now()
		err := f()
		lat.add(time.Since(t0))
		ops.Add(1)
		return err
	}
	now := time.Now()
	if turn == 0 {
		if err := op(func() error { _, err := s.ClaimSession(ctx, session, sigil, "", now); return err }); err != nil {
			return err
		}
		if err := op(func() error { _, err := s.Eligible(ctx, sigil); return err }); err != nil {
			return err
		}
		if err := op(func() error {
			return s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: session, Sigil: sigil, KarmaEpoch: 1, Reason: "first turn of the session", At: now})
		}); err != nil {
			return err
		}
	}
	if err := op(func() error { _, err := s.SessionOwner(ctx, session); return err }); err != nil {
		return err
	}
	if err := op(func() error { _, err := s.Session(ctx, session); return err }); err != nil {
		return err
	}
	if err := op(func() error { _, _, err := s.KarmaSnapshot(ctx, session); return err }); err != nil {
		return err
	}
	q := fmt.Sprintf("turn %d: what does Handler%d return?", turn, turn%9)
	a := strings.Repeat("It returns an error naming the kind. ", 8)
	if err := op(func() error {
		_, err := s.AppendTurn(ctx, session, ctxd.Turn{Query: q, Answer: a}, []byte(`{"prompt_tokens":5000,"cached_tokens":4950}`), now)
		return err
	}); err != nil {
		return err
	}
	var id int64
	if err := op(func() error {
		var err error
		id, err = s.RecordTrace(ctx, ctxd.Trace{Session: session, Sigil: sigil, Query: q, Answer: a, Model: "sim", Fingerprint: strings.Repeat("ab", 32), CreatedAt: now})
		return err
	}); err != nil {
		return err
	}
	if turn%10 == 9 {
		return op(func() error {
			_, err := s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Sigil: sigil, At: now})
			return err
		})
	}
	return nil
}

// latencies keeps durations for percentiles.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

func (l *latencies) pct(p float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[min(len(l.d)-1, int(p*float64(len(l.d))))]
}

// simResult is one row of the table.
type simResult struct {
	daemons, agents int
	think           time.Duration
	turns, ops      int64
	secs            float64
	p50, p95, p99   time.Duration // one store operation
	turnP95         time.Duration // a turn's store operations together
	conns           int
	errs            int64
}

// simulate runs daemons × agents for d: each daemon a Store with its own
// pool (the daemon's default, 8 connections), each agent its own session
// on one daemon, turn after turn with think (the engine's answer) between.
func simulate(t *testing.T, url string, daemons, agents int, think, d time.Duration) simResult {
	t.Helper()
	stores := make([]*Store, daemons)
	for i := range stores {
		s, err := OpenWith(t.Context(), url, OpenOptions{MaxConns: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var ops, turns, errs atomic.Int64
	var opLat, turnLat latencies
	var wg sync.WaitGroup
	start := time.Now()
	for i := range daemons * agents {
		s := stores[i%daemons]
		session := fmt.Sprintf("sim-%d-%d-%d-%d", daemons, agents, think.Milliseconds(), i)
		wg.Go(func() {
			// Paced agents start spread over one think time, as agents
			// that did not all begin in the same second would be.
			if think > 0 {
				select {
				case <-ctx.Done():
				case <-time.After(think * time.Duration(i) / time.Duration(daemons*agents)):
				}
			}
			for turn := 0; ctx.Err() == nil; turn++ {
				t0 := time.Now()
				if err := simTurn(ctx, s, session, fmt.Sprintf("agent-%d", i%16), turn, &ops, &opLat); err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
						time.Sleep(100 * time.Millisecond) // as a client backs off
					}
					continue
				}
				turnLat.add(time.Since(t0))
				turns.Add(1)
				select {
				case <-ctx.Done():
				case <-time.After(think):
				}
			}
		})
	}
	var conns int
	probe, err := OpenWith(t.Context(), url, OpenOptions{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	time.Sleep(d / 2)
	if err := probe.pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").Scan(&conns); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	secs := time.Since(start).Seconds()
	return simResult{daemons: daemons, agents: agents, think: think, turns: turns.Load(), ops: ops.Load(), secs: secs,
		p50: opLat.pct(0.5), p95: opLat.pct(0.95), p99: opLat.pct(0.99), turnP95: turnLat.pct(0.95), conns: conns - 1, errs: errs.Load()}
}

// TestScaleSimulation is the simulation docs/scale.md reports (make
// bench-scale): N daemons × M agents against one PostgreSQL on this
// machine. It runs only when asked to write its table.
func TestScaleSimulation(t *testing.T) {
	if *scaleWrite == "" {
		t.Skip("the scale simulation runs with -scale-write FILE (make bench-scale)")
	}
	var rows []simResult
	// Closed loop, no think time: what the store can do.
	for _, c := range []struct{ daemons, agents int }{{1, 8}, {2, 16}, {4, 16}, {8, 16}, {8, 64}, {16, 64}, {24, 16}} {
		r := simulate(t, pgtest.NewDatabase(t), c.daemons, c.agents, 0, 6*time.Second) // each row on a fresh database
		t.Logf("%+v", r)
		rows = append(rows, r)
	}
	// Agents as a cluster engine paces them: one turn each per 2 s.
	for _, c := range []struct{ daemons, agents int }{{4, 64}, {4, 128}, {8, 96}, {8, 128}, {16, 128}, {16, 256}} {
		r := simulate(t, pgtest.NewDatabase(t), c.daemons, c.agents, 2*time.Second, 10*time.Second)
		t.Logf("%+v", r)
		rows = append(rows, r)
	}
	writeScaleTable(t, *scaleWrite, rows)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// writeScaleTable replaces the simulation block of the file at path.
func writeScaleTable(t *testing.T, path string, rows []simResult) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- scale:begin (written by `make bench-scale`) -->\n", "<!-- scale:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no scale block", path)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured %s by `make bench-scale` (`pgstore.TestScaleSimulation`) on this machine (%d CPUs, PostgreSQL %s from Debian on the same cores, fsync on, max_connections 200): each daemon a store with its own pool of 8 connections, each agent its own session, its turns' store operations as the orchestrator makes them on a shared store (read the session's owner, the session and its karma snapshot; append the turn; record the trace; a first turn also claims the session and saves its karma; one turn in ten verified), each row on a fresh database.\n\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), serverVersion(t, path))
	sb.WriteString("| daemons × agents | think time | turns/s | store ops/s | op p50 / p95 / p99 (ms) | a turn's store time p95 (ms) | connections | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		think := "none (closed loop)"
		if r.think > 0 {
			think = fmt.Sprintf("%.0f s", r.think.Seconds())
		}
		fmt.Fprintf(&sb, "| %d × %d | %s | %.0f | %.0f | %s / %s / %s | %s | %d | %d |\n", r.daemons, r.agents, think,
			float64(r.turns)/r.secs, float64(r.ops)/r.secs, ms(r.p50), ms(r.p95), ms(r.p99), ms(r.turnP95), r.conns, r.errs)
	}
	best := slices.MaxFunc(rows, func(a, b simResult) int {
		return int(float64(a.turns)/a.secs - float64(b.turns)/b.secs)
	})
	// The knee: the most paced agents whose turns still spent under 50 ms
	// (p95) in the store, and the fewest that spent more.
	var under, over *simResult
	for k := range rows {
		r := &rows[k]
		if r.think == 0 {
			continue
		}
		if r.turnP95 < 50*time.Millisecond && (under == nil || r.daemons*r.agents > under.daemons*under.agents) {
			under = r
		}
		if r.turnP95 >= 50*time.Millisecond && (over == nil || r.daemons*r.agents < over.daemons*over.agents) {
			over = r
		}
	}
	fmt.Fprintf(&sb, "\nClosed loop, the store here does at most about %.0f turns a second (%d × %d), and adding daemons past that only lengthens the queue. ",
		float64(best.turns)/best.secs, best.daemons, best.agents)
	if under != nil && over != nil {
		fmt.Fprintf(&sb, "Paced as a cluster engine paces them (a turn each per 2 s), %d agents (%.0f turns/s) spent %s ms a turn in the store (p95), and %d agents (%.0f turns/s) %s ms: the store becomes the bottleneck between the two, well under its closed-loop ceiling, because the simulated daemons themselves share this machine's %d cores with PostgreSQL.\n",
			under.daemons*under.agents, float64(under.turns)/under.secs, ms(under.turnP95), over.daemons*over.agents, float64(over.turns)/over.secs, ms(over.turnP95), runtime.NumCPU())
	}
	out := s[:i] + begin + sb.String() + s[j:]
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
}

// serverVersion is the PostgreSQL server's version.
func serverVersion(t *testing.T, _ string) string {
	s := openURL(t, pgtest.NewDatabase(t), OpenOptions{MaxConns: 1})
	var v string
	if err := s.pool.QueryRow(t.Context(), "SHOW server_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return strings.Fields(v)[0]
}
