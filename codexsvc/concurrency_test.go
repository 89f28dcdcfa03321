package codexsvc

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/tokencount"
)

// wait is how long a test waits for what must happen; it fails, rather
// than hangs, when it does not.
const wait = 10 * time.Second

// gate holds the calls that pass it while it is shut, until it opens:
// a fake that can actually block. It says when the first call arrived.
type gate struct {
	shut    atomic.Bool
	arrived chan struct{} // closed when the first call is held
	opened  chan struct{} // closed when it opens
	arrive  sync.Once
	open    sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{arrived: make(chan struct{}), opened: make(chan struct{})}
	t.Cleanup(g.release) // a failed test does not leave calls held
	return g
}

// close shuts the gate: calls from now on are held.
func (g *gate) close() { g.shut.Store(true) }

// release opens the gate for good: the calls held go on.
func (g *gate) release() { g.open.Do(func() { close(g.opened) }) }

// pass holds the caller while the gate is shut.
func (g *gate) pass() {
	if !g.shut.Load() {
		return
	}
	g.arrive.Do(func() { close(g.arrived) })
	<-g.opened
}

// gatedTokenizer is the one-token-a-byte tokenizer, held at its gate.
type gatedTokenizer struct {
	fake.Tokenizer
	g *gate
}

func (t gatedTokenizer) Tokenize(s string) ([]int, error) {
	t.g.pass()
	return t.Tokenizer.Tokenize(s)
}

func (t gatedTokenizer) TokenizeText(s string) ([]int, error) {
	t.g.pass()
	return t.Tokenizer.TokenizeText(s)
}

func (t gatedTokenizer) CountText(s string) (int, error) {
	t.g.pass()
	return t.Tokenizer.CountText(s)
}

// within returns what ch brings, or fails the test if nothing comes
// within wait.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("%s: not within %s", what, wait)
		panic("unreachable")
	}
}

// retrieval is what one Retrieve or Peek returned.
type retrieval struct {
	block  runcontext.Codex
	ex     []ctxd.Excerpt
	report ctxd.WorkingSet
	err    error
}

// retrieveAsync runs f on a goroutine; its result comes on the channel.
func retrieveAsync(f func() (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error)) <-chan retrieval {
	ch := make(chan retrieval, 1)
	go func() {
		var r retrieval
		r.block, r.ex, r.report, r.err = f()
		ch <- r
	}()
	return ch
}

// TestWorkingSetMoveHoldsUpNoRetrieval: while one session's question moves
// the working set, held in the middle of its token counts, another
// session's questions, a peek, the search tool and a reload's read of the
// recent questions all complete, from the working set as it was; then the
// move completes and is committed, not lost.
func TestWorkingSetMoveHoldsUpNoRetrieval(t *testing.T) {
	t.Parallel()
	var g *gate
	s, snk := newServiceWith(t, 6000, false, func(c *Config) {
		g = newGate(t) // released before the service closes
		tok := gatedTokenizer{g: g}
		c.Tokenizer, c.Counter = tok, tokencount.New(tok, nil)
	})
	if _, err := s.Load(t.Context(), packages(t, 8, 4, 1500), nil); err != nil {
		t.Fatal(err)
	}
	_, plan, r, _ := snk.published()
	ws, ok := r.(*workingSet)
	if plan.Mode != runcontext.ModeRAG || !ok {
		t.Fatalf("plan %s, retriever %T", plan.Mode, r)
	}
	exactStats(t, s) // the background count is done: only the move counts from here
	g.close()

	moving := retrieveAsync(func() (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
		return ws.Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	})
	within(t, "the moving question reaching the tokenizer", g.arrived)

	// Another session's first question would move it too: it answers from
	// the map alone, with every hit as an excerpt, rather than wait.
	other := within(t, "another session's question while the working set moves", retrieveAsync(func() (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
		return ws.Retrieve(t.Context(), "pkgf gizmos widget", 3)
	}))
	if other.err != nil || other.report.Moved != "" || other.report.Generation != 0 || other.block.Body != ws.base.Body || len(other.ex) == 0 {
		t.Errorf("another session's question beside the move: %+v, %d excerpts, the map alone %t, %v",
			other.report, len(other.ex), other.block.Body == ws.base.Body, other.err)
	}
	peek := within(t, "a peek while the working set moves", retrieveAsync(func() (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
		return ws.Peek(t.Context(), "pkgc frobs", 3)
	}))
	if peek.err != nil || peek.report.Generation != 0 || len(peek.ex) == 0 {
		t.Errorf("a peek beside the move: %+v, %d excerpts, %v", peek.report, len(peek.ex), peek.err)
	}
	searched := make(chan error, 1)
	go func() {
		_, err := s.Search(t.Context(), "pkgb widget", 3)
		searched <- err
	}()
	if err := within(t, "the search tool while the working set moves", searched); err != nil {
		t.Errorf("search beside the move: %v", err)
	}
	recent := make(chan []string, 1)
	go func() { recent <- ws.recentQueries() }()
	if q := within(t, "a reload's read of the recent questions while the working set moves", recent); len(q) != 2 {
		t.Errorf("recent questions %q, want both sessions'", q)
	}
	select {
	case r := <-moving:
		t.Fatalf("the move finished while its token count was held: %+v, %v", r.report, r.err)
	default:
	}

	g.release()
	moved := within(t, "the move once its token count goes on", moving)
	if moved.err != nil || moved.report.Moved != "chosen for the first question" || moved.report.Generation != 1 || !strings.Contains(moved.block.Body, `file "pkgc/`) {
		t.Fatalf("the move: %+v, %v", moved.report, moved.err)
	}
	next, _, rep, err := ws.Retrieve(t.Context(), "pkgc gizmos widget", 3)
	if err != nil || rep.Moved != "" || rep.Generation != 1 || next.Body != moved.block.Body {
		t.Errorf("the next question after the move: %+v, same block %t, %v", rep, next.Body == moved.block.Body, err)
	}
}

// TestWorkingSetMoveCommitsOnlyOntoItsGeneration: a move whose working set
// was chosen while another move committed first is dropped whole (the
// first stays, not mixed with it); a failed move changes nothing; either
// way the move is over, so the next may start.
func TestWorkingSetMoveCommitsOnlyOntoItsGeneration(t *testing.T) {
	t.Parallel()
	first, late, next := &wsChoice{tokens: 1}, &wsChoice{tokens: 2}, &wsChoice{tokens: 3}
	w := &workingSet{cur: first, gen: 1, moving: true}
	v, err := w.commit(&wsMove{reason: "late", gen: 0}, wsResult{choice: late, baseTokens: 500}, nil)
	if err != nil || v.cur != first || v.gen != 1 || v.moved != "" || w.cur != first || w.gen != 1 || w.moving || w.baseTokens != 500 {
		t.Fatalf("a move onto an old generation: view %+v, working set %+v gen %d moving %t base %d, %v", v, w.cur, w.gen, w.moving, w.baseTokens, err)
	}
	w.moving = true
	if _, err := w.commit(&wsMove{reason: "failed", gen: 1}, wsResult{}, errors.New("no")); err == nil || w.cur != first || w.gen != 1 || w.moving || w.baseTokens != 500 {
		t.Fatalf("a failed move: %v, working set %+v gen %d moving %t", err, w.cur, w.gen, w.moving)
	}
	w.moving = true
	if v, err := w.commit(&wsMove{kind: moveGrow, reason: "nothing to add", gen: 1, cur: first}, wsResult{choice: first}, nil); err != nil || v.cur != first || v.gen != 1 || v.moved != "" || w.moving {
		t.Fatalf("a growth that added nothing: view %+v, moving %t, %v", v, w.moving, err)
	}
	w.moving = true
	v, err = w.commit(&wsMove{kind: moveGrow, reason: "elsewhere", gen: 1, cur: first}, wsResult{choice: next, added: 2, dropped: 1}, nil)
	if err != nil || v.cur != next || v.gen != 2 || v.added != 2 || v.dropd != 1 || !strings.Contains(v.moved, "grew at its end by 2 pieces, elsewhere") ||
		!strings.Contains(v.moved, "dropped its last 1") || w.cur != next || w.moving {
		t.Fatalf("a move onto its generation: view %+v, working set %+v moving %t, %v", v, w.cur, w.moving, err)
	}
}

// planFor reports whether plan was made under limits: its threshold is
// its ratio of their prompt budget.
func planFor(limits governor.Limits, plan ctxd.CodexPlan) bool {
	return plan.Threshold == int(plan.Ratio*float64(limits.PromptBudget()))
}

// TestReplanSwapsLimitsAndPlanTogether: readers racing with re-plans never
// see new limits with the old plan; while a re-plan is held (its render of
// the stable blocks blocks), readers do not wait for it and see the old
// pair; a re-plan that fails leaves the old pair.
func TestReplanSwapsLimitsAndPlanTogether(t *testing.T) {
	t.Parallel()
	var g *gate
	var fail atomic.Bool
	s, _ := newServiceWith(t, 100000, false, func(c *Config) {
		g = newGate(t)
		stable := c.Stable
		c.Stable = func(b runcontext.Codex) (runcontext.Rendered, error) {
			g.pass()
			if fail.Load() {
				return runcontext.Rendered{}, errors.New("the stable blocks did not render")
			}
			return stable(b)
		}
	})
	dir := tree(t, 3, 500)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	a, b := s.cfg.Limits, s.cfg.Limits
	b.AnswerReserve = 20000
	if l, p, ok := s.Plan(); !ok || l != a || !planFor(l, p) || p.Mode != runcontext.ModeCAG {
		t.Fatalf("after the load: limits %+v, plan %+v, %t", l, p, ok)
	}

	// Readers race with re-plans: every pair they see belongs together.
	stop := make(chan struct{})
	var readers sync.WaitGroup
	var reads, mismatched atomic.Int64
	for range 4 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, p, ok := s.Plan()
				if !ok || !planFor(l, p) {
					mismatched.Add(1)
				}
				reads.Add(1)
			}
		}()
	}
	for i := range 10 {
		if err := s.SetLimits(t.Context(), []governor.Limits{b, a}[i%2]); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, wait, "readers reading beside the re-plans", func() bool { return reads.Load() > 100 })
	close(stop)
	readers.Wait()
	if n := mismatched.Load(); n > 0 {
		t.Errorf("%d of %d reads saw limits with a plan not made under them", n, reads.Load())
	}

	// A re-plan held in the middle: readers see the old pair at once.
	g.close()
	replanned := make(chan error, 1)
	go func() { replanned <- s.SetLimits(t.Context(), b) }()
	within(t, "the re-plan reaching its render of the stable blocks", g.arrived)
	type read struct {
		limits governor.Limits
		plan   ctxd.CodexPlan
		stats  ctxd.CodexStats
		files  int
		err    error
	}
	got := make(chan read, 1)
	go func() {
		var r read
		r.limits, r.plan, _ = s.Plan()
		r.stats, _ = s.Stats()
		fs, _ := s.Files()
		r.files = len(fs)
		_, r.err = s.File(fs[0].Path)
		got <- r
	}()
	r := within(t, "readers while a re-plan is held", got)
	if r.limits != a || !planFor(r.limits, r.plan) || r.stats.Plan != r.plan || r.files != 3 || r.err != nil {
		t.Errorf("read during a re-plan: limits %+v, plan %+v, stats' plan %+v, %d files, %v", r.limits, r.plan, r.stats.Plan, r.files, r.err)
	}
	select {
	case err := <-replanned:
		t.Fatalf("the re-plan finished while its render was held: %v", err)
	default:
	}
	g.release()
	if err := within(t, "the re-plan once its render goes on", replanned); err != nil {
		t.Fatal(err)
	}
	if l, p, _ := s.Plan(); l != b || !planFor(l, p) {
		t.Errorf("after the re-plan: limits %+v, plan %+v", l, p)
	}

	// A re-plan that fails leaves the pair as it was.
	fail.Store(true)
	if err := s.SetLimits(t.Context(), a); err == nil {
		t.Fatal("a re-plan whose render failed succeeded")
	}
	if l, p, _ := s.Plan(); l != b || !planFor(l, p) {
		t.Errorf("after a failed re-plan: limits %+v, plan %+v; want the pair before it", l, p)
	}
}

// panicTokenizer panics at its first count while armed.
type panicTokenizer struct {
	fake.Tokenizer
	armed *atomic.Bool
}

func (t panicTokenizer) CountText(s string) (int, error) {
	if t.armed.CompareAndSwap(true, false) {
		panic("tokenizer failed")
	}
	return t.Tokenizer.CountText(s)
}

// TestWorkingSetMoveThatPanicsEnds: a move that panics (a request handler's
// panic, which net/http recovers) is ended, so the next question moves the
// working set rather than finding a move forever in progress.
func TestWorkingSetMoveThatPanicsEnds(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	s, snk := newServiceWith(t, 6000, false, func(c *Config) {
		tok := panicTokenizer{armed: &armed}
		c.Tokenizer, c.Counter = tok, tokencount.New(tok, nil)
	})
	if _, err := s.Load(t.Context(), packages(t, 8, 4, 1500), nil); err != nil {
		t.Fatal(err)
	}
	exactStats(t, s)
	_, _, r, _ := snk.published()
	ws := r.(*workingSet)
	armed.Store(true)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the tokenizer's panic did not reach the caller")
			}
		}()
		ws.Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	}()
	_, _, rep, err := ws.Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	if err != nil || rep.Moved == "" || rep.Generation != 1 {
		t.Errorf("the question after a move that panicked: %+v, %v", rep, err)
	}
}
