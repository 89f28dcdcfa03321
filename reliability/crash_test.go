package reliability

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the store's driver, for integrity_check

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

// ackAsk is an ask whose summary came back: its turn and its trace are
// acknowledged.
type ackAsk struct {
	session, query, answer string
	trace                  int64
}

// ackJudge is a karma judgement the API answered.
type ackJudge struct {
	trace        int64
	action, note string
}

// ledger is what the agents were told was written, and what failed.
type ledger struct {
	mu       sync.Mutex // guards asks, judges and failures
	asks     []ackAsk
	judges   []ackJudge
	failures map[string]int // by errorClass

	inflight atomic.Int32 // requests sent and not yet answered
}

func (l *ledger) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failures == nil {
		l.failures = map[string]int{}
	}
	l.failures[errorClass(err)]++
}

func (l *ledger) snapshot() ([]ackAsk, []ackJudge) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.asks), slices.Clone(l.judges)
}

func (l *ledger) failed() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failures)
}

func (l *ledger) writes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.asks) + len(l.judges)
}

// crashAgent asks in sessions of a few turns and judges every answer's
// trace (verify or reject, and every other one pinned), recording what
// was acknowledged, until ctx ends. Requests cut by a kill fail; it
// retries after a moment.
func crashAgent(ctx context.Context, socket string, agent int, led *ledger) {
	const turnsPerSession = 6 // well below limits.max_depth: the session's turns stay as written
	c := client.New(socket)
	session, turns := 0, 0
	for n := 0; ctx.Err() == nil; n++ {
		if turns == turnsPerSession {
			session, turns = session+1, 0
		}
		id := fmt.Sprintf("a%d-s%d", agent, session)
		q := fmt.Sprintf("agent %d question %d: what does handler %d return?", agent, n, n)
		led.inflight.Add(1)
		a := ask(ctx, c, id, q, 4)
		led.inflight.Add(-1)
		if a.err != nil {
			if ctx.Err() == nil {
				led.fail(a.err)
				sleep(ctx, 50*time.Millisecond)
			}
			continue
		}
		turns++
		led.mu.Lock()
		led.asks = append(led.asks, ackAsk{session: id, query: q, answer: a.answer, trace: a.sum.Trace})
		led.mu.Unlock()
		actions := []string{ctxd.KarmaVerify, ctxd.KarmaPin, ctxd.KarmaUnpin}
		if n%2 == 1 {
			actions[0] = ctxd.KarmaReject
		}
		for _, action := range actions {
			note := fmt.Sprintf("agent %d judgement %d %s", agent, n, action)
			led.inflight.Add(1)
			_, err := c.Judge(ctx, a.sum.Trace, action, ctxd.KarmaJudgement{Note: note})
			led.inflight.Add(-1)
			if err != nil {
				if ctx.Err() == nil {
					led.fail(err)
				}
				break
			}
			led.mu.Lock()
			led.judges = append(led.judges, ackJudge{trace: a.sum.Trace, action: action, note: note})
			led.mu.Unlock()
		}
	}
}

// verifyAcknowledged returns what of the acknowledged writes the daemon
// does not have: each ask's turn in its session and its trace, and each
// judgement among its trace's events.
func verifyAcknowledged(ctx context.Context, c *client.Client, asks []ackAsk, judges []ackJudge) []string {
	var missing []string
	bySession := map[string][]ackAsk{}
	for _, a := range asks {
		bySession[a.session] = append(bySession[a.session], a)
	}
	for _, id := range slices.Sorted(maps.Keys(bySession)) {
		st, err := c.Session(ctx, id)
		if err != nil {
			missing = append(missing, fmt.Sprintf("session %s: %v", id, err))
			continue
		}
		traces, err := c.Karma(ctx, client.KarmaFilter{Session: id, Limit: 1000})
		if err != nil {
			missing = append(missing, fmt.Sprintf("traces of session %s: %v", id, err))
			continue
		}
		byID := map[int64]ctxd.Trace{}
		for _, tr := range traces {
			byID[tr.ID] = tr
		}
		for _, a := range bySession[id] {
			if !slices.ContainsFunc(st.Turns, func(t ctxd.Turn) bool { return t.Query == a.query && t.Answer == a.answer }) {
				missing = append(missing, fmt.Sprintf("session %s: turn %q (answer %q)", id, a.query, a.answer))
			}
			if tr, ok := byID[a.trace]; !ok || tr.Query != a.query || tr.Answer != a.answer {
				missing = append(missing, fmt.Sprintf("session %s: trace %d of %q", id, a.trace, a.query))
			}
		}
	}
	byTrace := map[int64][]ackJudge{}
	for _, j := range judges {
		byTrace[j.trace] = append(byTrace[j.trace], j)
	}
	for _, id := range slices.Sorted(maps.Keys(byTrace)) {
		h, err := c.Trace(ctx, id)
		if err != nil {
			missing = append(missing, fmt.Sprintf("trace %d: %v", id, err))
			continue
		}
		for _, j := range byTrace[id] {
			if !slices.ContainsFunc(h.Events, func(e ctxd.KarmaEvent) bool { return e.Action == j.action && e.Note == j.note }) {
				missing = append(missing, fmt.Sprintf("trace %d: %s event %q", id, j.action, j.note))
			}
		}
	}
	return missing
}

// integrityCheck runs PRAGMA integrity_check on a copy of the store as the
// kill left it (the database and its write-ahead log), so the check sees
// exactly what the next daemon will recover from.
func integrityCheck(stateDir string) (string, error) {
	dir, err := os.MkdirTemp("", "ctxd-rel-db-")
	if err != nil {
		return "", fmt.Errorf("integrity check: %w", err)
	}
	defer os.RemoveAll(dir)
	for _, name := range []string{"ctxd.db", "ctxd.db-wal"} {
		if err := copyFile(filepath.Join(stateDir, name), filepath.Join(dir, name)); err != nil {
			if name == "ctxd.db-wal" && os.IsNotExist(err) {
				continue
			}
			return "", fmt.Errorf("integrity check: %w", err)
		}
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "ctxd.db"))
	if err != nil {
		return "", fmt.Errorf("integrity check: %w", err)
	}
	defer db.Close()
	rows, err := db.Query("PRAGMA integrity_check")
	if err != nil {
		return "", fmt.Errorf("integrity check: %w", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return "", fmt.Errorf("integrity check: %w", err)
		}
		lines = append(lines, s)
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("integrity check: %w", err)
	}
	return strings.Join(lines, "; "), nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// TestCrash kills the daemon with SIGKILL at random moments while agents
// ask and judge karma. After every kill the store passes integrity_check,
// and once the daemon is back every write it had acknowledged is there.
func TestCrash(t *testing.T) {
	e := setup(t)
	kills, minWrites, agents := 3, 50, 2
	if *full {
		kills, minWrites, agents = 20, 1000, 4
	}
	d := e.newDaemon(t, defaultLimits)
	d.start(t)
	c := client.New(d.socket)

	var led ledger
	ctx, stopAgents := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() { crashAgent(ctx, d.socket, i, &led) })
	}
	defer func() { stopAgents(); wg.Wait() }()

	var (
		restarts      []float64 // ms to ready after a kill
		inFlight      int       // kills that caught requests in flight
		checked, lost int
		began         = time.Now()
	)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 14))
	killed := 0
	for ; killed < kills || led.writes() < minWrites; killed++ {
		if killed >= 10*kills {
			t.Fatalf("after %d kills only %d acknowledged writes (want %d): the agents are not getting through; failures %v", killed, led.writes(), minWrites, led.failed())
		}
		// A random point in the agents' traffic: 0.5 s to 5 s after ready.
		if !sleep(t.Context(), time.Duration(500+rng.IntN(4500))*time.Millisecond) {
			t.Fatal(t.Context().Err())
		}
		if led.inflight.Load() > 0 {
			inFlight++
		}
		d.kill9(t)
		if res, err := integrityCheck(d.stateDir); err != nil || res != "ok" {
			t.Fatalf("kill %d: integrity_check: %q %v", killed+1, res, err)
		}
		restarts = append(restarts, ms(d.start(t)))
		asks, judges := led.snapshot()
		vctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		missing := verifyAcknowledged(vctx, c, asks, judges)
		cancel()
		checked, lost = len(asks)+len(judges), lost+len(missing)
		for _, m := range missing {
			t.Errorf("kill %d: acknowledged but missing: %s", killed+1, m)
		}
	}
	stopAgents()
	wg.Wait()
	// Last: a clean stop, the check, a start, and everything once more.
	d.stop(t)
	if res, err := integrityCheck(d.stateDir); err != nil || res != "ok" {
		t.Fatalf("after the clean stop: integrity_check: %q %v", res, err)
	}
	d.start(t)
	asks, judges := led.snapshot()
	missing := verifyAcknowledged(t.Context(), c, asks, judges)
	for _, m := range missing {
		t.Errorf("after the clean stop: acknowledged but missing: %s", m)
	}
	// The check itself must see a loss: a write never made is missing.
	if len(asks) > 0 && len(verifyAcknowledged(t.Context(), c, []ackAsk{{session: asks[0].session, query: "never asked", trace: asks[0].trace}},
		[]ackJudge{{trace: asks[0].trace, action: ctxd.KarmaVerify, note: "never judged"}})) != 3 { // the turn, the trace, the event
		t.Error("the check does not report a turn and a judgement that were never written")
	}
	d.stop(t)
	if len(asks) == 0 || len(judges) == 0 {
		t.Fatalf("nothing was acknowledged (%d asks, %d judgements): failures %v", len(asks), len(judges), led.failed())
	}
	t.Logf("%d kills, %d asks and %d judgements acknowledged (%d checked after the last kill), %d missing; restart p50 %.0f ms; failures %v",
		killed, len(asks), len(judges), checked, lost+len(missing), quantile(restarts, 0.5), led.failed())

	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured by `go test ./reliability -run TestCrash -timeout 60m -args -full -write ../docs/reliability.md` (or `make reliability`), %s, on %s.\n\n",
		time.Now().UTC().Format("2006-01-02"), e.machine())
	fmt.Fprintf(&sb, "The daemon (cmd/ctxd, a separate process, over an external `ollama serve`) was killed with SIGKILL %d times at random moments (0.5 s to 5 s after it was ready) while %d agents asked (answers of at most 4 tokens, sessions of 6 turns) and judged each answer's trace through the API (verify or reject, then pin and unpin). After each kill the store (SQLite, WAL, synchronous FULL) was copied as the kill left it and checked with `PRAGMA integrity_check`; after each restart every write acknowledged so far was looked up: each ask whose summary came back (its turn in the session, its trace with query and answer) and each judgement the API answered (the event on its trace). %s of wall time.\n\n",
		killed, agents, time.Since(began).Round(time.Second))
	sb.WriteString("| kills | kills with requests in flight | acknowledged asks (turn + trace) | acknowledged judgements | acknowledged writes | missing after restart | integrity_check | restart to ready p50 / max |\n")
	sb.WriteString("|---:|---:|---:|---:|---:|---:|---|---:|\n")
	fmt.Fprintf(&sb, "| %d | %d | %d | %d | %d | %d | ok after all %d kills and the clean stop | %.0f / %.0f ms |\n\n",
		killed, inFlight, len(asks), len(judges), len(asks)+len(judges), lost+len(missing), killed, quantile(restarts, 0.5), quantile(restarts, 1))
	sb.WriteString("Errors the agents saw (requests cut by a kill, or sent while the daemon was down or starting; none of them had been acknowledged):\n\n")
	sb.WriteString(failureList(led.failed()))
	report(t, "crash", sb.String())
}

// failureList is a Markdown list of failures by class, most first.
func failureList(f map[string]int) string {
	if len(f) == 0 {
		return "- none\n"
	}
	keys := slices.Collect(maps.Keys(f))
	slices.SortFunc(keys, func(a, b string) int {
		if f[a] != f[b] {
			return f[b] - f[a]
		}
		return strings.Compare(a, b)
	})
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "- %s: %d\n", k, f[k])
	}
	return sb.String()
}
