package codexsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/tokencount"
)

// sink records what the service publishes.
type sink struct {
	mu    sync.Mutex
	block runcontext.Codex
	plan  ctxd.CodexPlan
	r     ctxd.Retriever
	n     int
}

func (s *sink) SetCodex(b runcontext.Codex, p ctxd.CodexPlan, r ctxd.Retriever, _ governor.Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.block, s.plan, s.r = b, p, r
	s.n++
}

func (s *sink) published() (runcontext.Codex, ctxd.CodexPlan, ctxd.Retriever, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.block, s.plan, s.r, s.n
}

func newService(t *testing.T, numCtx int, watch bool) (*Service, *sink) {
	t.Helper()
	return newServiceWith(t, numCtx, watch, nil)
}

// newServiceWith is newService with its configuration changed by edit
// (nil: as it is) before the service is made.
func newServiceWith(t *testing.T, numCtx int, watch bool, edit func(*Config)) (*Service, *sink) {
	t.Helper()
	cc := config.Default(config.Env{Home: t.TempDir()}).Codex
	cc.Watch = watch
	snk := &sink{}
	cfg := Config{
		Settings: codexSettings(cc), StateDir: t.TempDir(),
		Limits:    governor.Limits{NumCtx: numCtx, AnswerReserve: 64},
		Tokenizer: fake.Tokenizer{}, TokenizerID: "bytes", Counter: tokencount.New(fake.Tokenizer{}, nil),
		Stable: func(c runcontext.Codex) (runcontext.Rendered, error) {
			return runcontext.Plain{}.Render(&runcontext.RunContext{
				Identity: runcontext.Identity{Name: "t", Persona: "p"}, Codex: c,
				Environment: fake.NewSensor().Environment(), Sigil: runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
			})
		},
		Sink: snk,
	}
	if edit != nil {
		edit(&cfg)
	}
	s := New(cfg)
	t.Cleanup(func() { s.Close() })
	return s, snk
}

// eventually polls cond until it holds, failing the test if it does not
// within d: every poll in these tests has a deadline.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tree writes n Go files of about size bytes each.
func tree(t *testing.T, n, size int) string {
	t.Helper()
	dir := t.TempDir()
	for i := range n {
		var sb strings.Builder
		for j := 0; sb.Len() < size; j++ {
			fmt.Fprintf(&sb, "// Handler%d_%d serves kind %d.\nfunc Handler%d_%d() error { return nil }\n\n", i, j, j, i, j)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("h%02d.go", i)), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSmallTreeLoadsWhole(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 100000, false)
	if _, ok := s.Stats(); ok {
		t.Fatal("stats before any load")
	}
	st, err := s.Load(t.Context(), tree(t, 3, 500), nil)
	if err != nil {
		t.Fatal(err)
	}
	block, plan, r, n := snk.published()
	if st.Files != 3 || plan.Mode != runcontext.ModeCAG || block.Mode != runcontext.ModeCAG || r != nil || n != 1 {
		t.Fatalf("stats %+v, published %s/%s, retriever %v, %d times", st, plan.Mode, block.Mode, r, n)
	}
	if !block.Prerendered() {
		t.Error("the published block is not prerendered: every request would render it")
	}
	if plan.StableTokens <= int(st.Tokens) {
		t.Errorf("the plan weighs %d stable tokens, less than the codex's own %d", plan.StableTokens, st.Tokens)
	}
	if _, err := s.Search(t.Context(), "Handler1", 3); ctxd.KindOf(err) != ctxd.KindConflict {
		t.Errorf("search of a whole codex: %v", err)
	}
}

func TestLargeTreeIsRetrieved(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 4000, false)
	st, err := s.Load(t.Context(), tree(t, 8, 2000), nil)
	if err != nil {
		t.Fatal(err)
	}
	block, plan, r, _ := snk.published()
	if plan.Mode != runcontext.ModeRAG || block.Mode != runcontext.ModeRAG || r == nil || st.Plan.Mode != runcontext.ModeRAG {
		t.Fatalf("plan %+v, block %s, retriever %v", plan, block.Mode, r)
	}
	if !strings.Contains(block.Body, "too large to show whole") {
		t.Errorf("the RAG block is not a map:\n%.300s", block.Body)
	}
	ex, err := s.Search(t.Context(), "Handler3_2", 2)
	if err != nil || len(ex) == 0 || !strings.Contains(ex[0].Text, "Handler3_2") {
		t.Errorf("search: %+v %v", ex, err)
	}
}

func TestFailedOrCancelledLoadKeepsTheCurrentCodex(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 100000, false)
	first, err := s.Load(t.Context(), tree(t, 2, 300), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(t.Context(), "/no/such/tree", nil); ctxd.KindOf(err) != ctxd.KindInvalid {
		t.Errorf("missing tree: %v (kind %q)", err, ctxd.KindOf(err))
	}
	ctx, cancel := context.WithCancel(t.Context())
	_, err = s.Load(ctx, tree(t, 40, 300), func(ctxd.CodexProgress) { cancel() })
	if ctxd.KindOf(err) != ctxd.KindCanceled || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled load: %v (kind %q)", err, ctxd.KindOf(err))
	}
	if st, _ := s.Stats(); st.Files != first.Files || st.Root != first.Root {
		t.Errorf("after failed loads the codex is %+v, want the first", st)
	}
	if _, _, _, n := snk.published(); n != 1 {
		t.Errorf("published %d times, want once", n)
	}
}

func TestWatchReloadsAndCloseStopsIt(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 100000, true)
	dir := tree(t, 2, 300)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new.go"), []byte("package x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the change reloaded", func() bool { st, _ := s.Stats(); return st.Files == 3 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, _, before := snk.published()
	if err := os.WriteFile(filepath.Join(dir, "later.go"), []byte("package x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * debounce)
	if _, _, _, after := snk.published(); after != before {
		t.Error("a change after Close was reloaded")
	}
	if _, err := s.Load(t.Context(), dir, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("load after Close: %v", err)
	}
}

// TestWatchIgnoresTheDaemonsOwnState: with the state directory inside the
// codex tree (make run's layout), named directly or through a symlink, the
// daemon's own writes there (the codex cache, the sessions database, saved
// slots) reload nothing, while a change to the codex still does.
func TestWatchIgnoresTheDaemonsOwnState(t *testing.T) {
	t.Parallel()
	for _, link := range []bool{false, true} {
		t.Run(fmt.Sprintf("symlink=%v", link), func(t *testing.T) {
			t.Parallel()
			s, snk := newService(t, 100000, true)
			dir := tree(t, 2, 300)
			state := filepath.Join(dir, "var", "state")
			if err := os.MkdirAll(state, 0o755); err != nil {
				t.Fatal(err)
			}
			s.cfg.StateDir = state
			if link {
				s.cfg.StateDir = filepath.Join(t.TempDir(), "state")
				if err := os.Symlink(state, s.cfg.StateDir); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Load(t.Context(), dir, nil); err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if err := os.WriteFile(filepath.Join(s.cfg.StateDir, fmt.Sprintf("slot-%d.bin", i)), []byte("state"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(s.cfg.StateDir, "llamacpp", "slots"), 0o755); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * debounce)
			if _, _, _, n := snk.published(); n != 1 {
				t.Fatalf("published %d times after writes to the state directory only, want once (the load)", n)
			}
			if err := os.WriteFile(filepath.Join(dir, "new.go"), []byte("package x\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "a codex change reloaded", func() bool { _, _, _, n := snk.published(); return n == 2 })
		})
	}
}

// boundedTok is the fake one-token-a-byte tokenizer with a stated longest
// token, counting its calls.
type boundedTok struct {
	fake.Tokenizer
	longest int
	calls   atomic.Int64
}

func (b *boundedTok) MaxTokenBytes() int { return b.longest }

func (b *boundedTok) CountText(s string) (int, error) {
	b.calls.Add(1)
	return b.Tokenizer.CountText(s)
}

func newBoundedService(t *testing.T, numCtx int, tok *boundedTok) *Service {
	t.Helper()
	cc := config.Default(config.Env{Home: t.TempDir()}).Codex
	cc.Watch = false
	s := New(Config{
		Settings: codexSettings(cc), StateDir: t.TempDir(),
		Limits:    governor.Limits{NumCtx: numCtx, AnswerReserve: 64},
		Tokenizer: tok, TokenizerID: "bytes", Counter: tokencount.New(tok, nil),
		Stable: func(c runcontext.Codex) (runcontext.Rendered, error) {
			return runcontext.Plain{}.Render(&runcontext.RunContext{Identity: runcontext.Identity{Name: "t", Persona: "p"}, Codex: c})
		},
		Sink: &sink{},
	})
	t.Cleanup(func() { s.Close() })
	return s
}

// exactStats waits for the background count to finish.
func exactStats(t *testing.T, s *Service) ctxd.CodexStats {
	t.Helper()
	var st ctxd.CodexStats
	eventually(t, 30*time.Second, "the background count finished", func() bool { st, _ = s.Stats(); return st.TokensExact })
	return st
}

// TestBoundsDecideWithoutCounting: a tree whose bytes alone prove it over
// the threshold is retrieved without a token counted to decide it; the
// whole-tree total is counted in the background, and the stats say how
// far until it is exact.
func TestBoundsDecideWithoutCounting(t *testing.T) {
	t.Parallel()
	tok := &boundedTok{longest: 4}
	s := newBoundedService(t, 4000, tok)
	dir := tree(t, 8, 2000)
	time.Sleep(50 * time.Millisecond) // past the timestamps' granularity: not racily clean
	st, err := s.Load(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Plan.Mode != runcontext.ModeRAG || !strings.Contains(st.Plan.Reason, "0 of 8 files counted exactly") {
		t.Fatalf("plan %+v", st.Plan)
	}
	if st.TokensExact || st.Lines == 0 {
		t.Errorf("stats right after the load: exact %t, %d lines", st.TokensExact, st.Lines)
	}
	if cur, _ := s.Stats(); !cur.TokensExact && cur.Counting == nil {
		t.Error("stats neither exact nor counting")
	}
	final := exactStats(t, s)
	if final.Tokens != final.Bytes || len(final.Largest) == 0 || final.Counting != nil {
		t.Errorf("counted %d tokens of %d bytes (one a byte), largest %v, counting %+v", final.Tokens, final.Bytes, final.Largest, final.Counting)
	}
	// A restart counts nothing again: the counts are in the cache.
	calls := tok.calls.Load()
	s.Close()
	s2 := New(s.cfg)
	defer s2.Close()
	if st, err := s2.Load(t.Context(), dir, nil); err != nil || st.Read != 0 || !st.TokensExact {
		t.Errorf("restart: %v, %d files read, exact %t", err, st.Read, st.TokensExact)
	}
	if tok.calls.Load() != calls {
		t.Errorf("restart counted %d files again", tok.calls.Load()-calls)
	}
}

// TestCountingStopsPastTheThreshold: when the bound cannot decide, files
// are counted exactly only until the running count passes the threshold.
func TestCountingStopsPastTheThreshold(t *testing.T) {
	t.Parallel()
	s := newBoundedService(t, 4000, &boundedTok{longest: 100})
	st, err := s.Load(t.Context(), tree(t, 8, 2000), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Threshold 0.7 × 3936 = 2755: the second file's ~2000 tokens pass it.
	if st.Plan.Mode != runcontext.ModeRAG || !strings.Contains(st.Plan.Reason, "2 of 8 files counted exactly") {
		t.Errorf("plan %+v", st.Plan)
	}
}

// packages writes a tree of Go packages: dirs directories of files files,
// each file declaring functions named after its package.
func packages(t *testing.T, dirs, files, size int) string {
	t.Helper()
	root := t.TempDir()
	for d := range dirs {
		pkg := fmt.Sprintf("pkg%c", 'a'+d)
		must := os.MkdirAll(filepath.Join(root, pkg), 0o755)
		if must != nil {
			t.Fatal(must)
		}
		for f := range files {
			var sb strings.Builder
			fmt.Fprintf(&sb, "package %s\n\n", pkg)
			for j := 0; sb.Len() < size; j++ {
				fmt.Fprintf(&sb, "// %sWidget%d_%d turns %s frobs into %s gizmos.\nfunc %sWidget%d_%d() error { return nil }\n\n", pkg, f, j, pkg, pkg, pkg, f, j)
			}
			if err := os.WriteFile(filepath.Join(root, pkg, fmt.Sprintf("f%d.go", f)), []byte(sb.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// TestWorkingSetKeepsFollowUpsInThePrefix: the first question chooses a
// working set of its package's files, filling its room;
// follow-ups about the same package find their excerpts in it (the codex
// block is the same bytes, nothing joins the query); a question elsewhere
// leaves it as it is, its excerpts outside it. At an epoch the working set
// absorbs excerpts at its end, so the block before the new pieces is the
// same bytes; once the room is full, it drops pieces from the end first,
// never from before them, and the stable blocks stay under the threshold.
func TestWorkingSetKeepsFollowUpsInThePrefix(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 6000, false)
	if _, err := s.Load(t.Context(), packages(t, 8, 4, 1500), nil); err != nil {
		t.Fatal(err)
	}
	_, plan, r, _ := snk.published()
	ws, ok := r.(*workingSet)
	if plan.Mode != runcontext.ModeRAG || !ok {
		t.Fatalf("plan %s, retriever %T", plan.Mode, r)
	}
	check := func(b runcontext.Codex, rep ctxd.WorkingSet) {
		t.Helper()
		if !b.Prerendered() {
			t.Fatal("the working set's block is not prerendered")
		}
		if rep.Tokens > plan.Threshold {
			t.Fatalf("the working set's stable blocks are %d tokens, over the threshold %d", rep.Tokens, plan.Threshold)
		}
	}
	ask := func(q string) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet) {
		t.Helper()
		b, ex, rep, err := ws.Retrieve(t.Context(), q, 3)
		if err != nil {
			t.Fatal(err)
		}
		check(b, rep)
		return b, ex, rep
	}
	first, _, rep := ask("what do pkgc frobs turn into")
	if rep.Moved == "" || rep.Generation != 1 || rep.Files == 0 || rep.Added == 0 {
		t.Fatalf("first question: %+v (threshold %d)", rep, plan.Threshold)
	}
	if !strings.Contains(first.Body, `file "pkgc/`) || strings.Contains(first.Body, `file "pkgf/`) {
		t.Errorf("the working set does not hold pkgc alone:\n%.600s", first.Body[strings.Index(first.Body, "Working set"):])
	}
	second, ex, rep := ask("pkgc gizmos widget")
	if rep.Moved != "" || second.Body != first.Body || rep.Hits != 3 || len(ex) != 0 {
		t.Errorf("follow-up: %+v, %d excerpts outside, block unchanged %t", rep, len(ex), second.Body == first.Body)
	}
	prev, prevRep := first, rep
	grew, dropped := 0, 0
	for i, pkg := range []string{"pkgf", "pkgb", "pkgh", "pkgd", "pkge", "pkga", "pkgg"} {
		b, ex, rep, err := ws.Retrieve(t.Context(), fmt.Sprintf("what do %s frobs turn into", pkg), 10)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Moved != "" || b.Body != prev.Body || len(ex) < 2 {
			t.Fatalf("a question about %s moved the working set, or found it held its excerpts: %+v, %d outside", pkg, rep, len(ex))
		}
		b, holds, rep, err := ws.Absorb(t.Context(), ex, 1000)
		if err != nil {
			t.Fatal(err)
		}
		check(b, rep)
		if rep.Moved == "" {
			t.Errorf("question %d (%s): its excerpts were not absorbed: %+v", i, pkg, rep)
			continue
		}
		grew++
		if rep.Added == 0 || rep.Generation != prevRep.Generation+1 || !strings.Contains(rep.Moved, "grew at its end") ||
			!strings.Contains(b.Body, `file "`+pkg+`/`) || !holds(ex[0]) {
			t.Errorf("question %d (%s) absorbed: %+v, holds its best excerpt %t", i, pkg, rep, holds(ex[0]))
		}
		before, after := pieceFences(prev.Body), pieceFences(b.Body)
		kept := len(before) - rep.Dropped
		if kept < 0 || len(after) != kept+rep.Added || !slices.Equal(after[:kept], before[:kept]) {
			t.Errorf("question %d (%s): %d pieces before, %d after, %d dropped, %d added; the kept ones are not the first ones", i, pkg, len(before), len(after), rep.Dropped, rep.Added)
		}
		cut := strings.LastIndex(prev.Body, "\n~") + 1 // the last piece's closing fence
		if kept < len(before) {
			cut = strings.Index(prev.Body, before[kept])
		}
		if !strings.HasPrefix(b.Body, prev.Body[:cut]) {
			t.Errorf("question %d (%s): the block before the new pieces changed", i, pkg)
		}
		if rep.Dropped > 0 {
			dropped++
			if !strings.Contains(rep.Moved, "dropped its last") {
				t.Errorf("question %d: a drop the report does not name: %q", i, rep.Moved)
			}
		}
		// Absorbed again: nothing to add, nothing changes.
		if again, _, rep2, err := ws.Absorb(t.Context(), ex[:1], 400); err != nil || rep2.Moved != "" || again.Body != b.Body {
			t.Errorf("question %d: absorbing what it holds changed it: %+v, %v", i, rep2, err)
		}
		prev, prevRep = b, rep
	}
	if grew < 5 || dropped == 0 {
		t.Errorf("seven absorptions grew the working set %d times and dropped from it %d times; want most of them to grow it, and the room to fill", grew, dropped)
	}
}

// pieceFences are a codex block's pieces' opening lines, in order.
func pieceFences(body string) []string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "~") && strings.Contains(l, " file \"") {
			out = append(out, l)
		}
	}
	return out
}

// TestOldWorkingSetAfterAReload: a request that took the working set of
// the codex before a reload finds its hits from the new codex left out
// (their file indexes are the new codex's), rather than ranking the
// wrong files or indexing past its own.
func TestOldWorkingSetAfterAReload(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 6000, false)
	dir := packages(t, 4, 3, 1500)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ := snk.published()
	old := r.(*workingSet)
	if _, _, _, err := old.Retrieve(t.Context(), "pkgb gizmos", 3); err != nil {
		t.Fatal(err)
	}
	for i := range 40 { // more files, sorted first: every index shifts
		if err := os.WriteFile(filepath.Join(dir, "pkga", fmt.Sprintf("a%02d.go", i)), []byte("package pkga\n\n// pkgb gizmos too.\nfunc X() {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, ex, rep, err := old.Retrieve(t.Context(), "pkgb gizmos", 3)
	if err != nil || rep.Moved != "" || len(ex) != 0 {
		t.Errorf("the old working set after a reload: %+v, %d excerpts, %v", rep, len(ex), err)
	}
}

// TestPeekNeitherLearnsNorMoves: questions outside any conversation (a
// door's text completions) read the working set as it is: however many
// there are, and however far from it, it is not chosen or moved by them,
// and a conversation's next question finds it where it was.
func TestPeekNeitherLearnsNorMoves(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 6000, false)
	if _, err := s.Load(t.Context(), packages(t, 8, 4, 1500), nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ := snk.published()
	ws := r.(*workingSet)
	// Before any conversation: the map alone, nothing chosen.
	b, ex, rep, err := ws.Peek(t.Context(), "pkgc frobs", 3)
	if err != nil || rep.Moved != "" || rep.Generation != 0 || b.Body != ws.base.Body || len(ex) == 0 {
		t.Fatalf("peek before any conversation: %+v, %d excerpts, %v", rep, len(ex), err)
	}
	first, _, rep, err := ws.Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	if err != nil || rep.Generation != 1 {
		t.Fatalf("the conversation's first question: %+v %v", rep, err)
	}
	for range 6 {
		b, ex, rep, err := ws.Peek(t.Context(), "pkgf gizmos widget", 3)
		if err != nil || rep.Moved != "" || rep.Generation != 1 || b.Body != first.Body || len(ex) == 0 {
			t.Fatalf("a peek far from the working set: %+v, %d excerpts, block unchanged %t, %v", rep, len(ex), b.Body == first.Body, err)
		}
	}
	// The peeks counted for nothing: the conversation's next question
	// finds the working set as its first left it.
	b, _, rep, err = ws.Retrieve(t.Context(), "pkgc gizmos widget", 3)
	if err != nil || rep.Moved != "" || b.Body != first.Body {
		t.Errorf("the conversation's next question: %+v, block unchanged %t, %v", rep, b.Body == first.Body, err)
	}
	if len(ws.recent) != 2 {
		t.Errorf("recent questions %q; want the conversation's two", ws.recent)
	}
}

// codexSettings are the service's settings from a [codex] section.
func codexSettings(cc config.Codex) Settings {
	return Settings{Walk: cc.WalkOptions(), CAGRatio: cc.CAGRatio, Watch: cc.Watch, AllowRedactOff: cc.AllowCodexRedactOff}
}

// TestEditsSettle: a burst of edits (a formatter over the tree) is one
// reload once the tree is quiet, and a tree that never goes quiet still
// reloads within the bound, with the changed files moved last.
func TestEditsSettle(t *testing.T) {
	t.Parallel()
	s, snk := newServiceWith(t, 100000, true, func(c *Config) { c.SettleMax = 2 * time.Second })
	dir := tree(t, 30, 300)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, _, n0 := snk.published()
	// A formatter over 30 files, a file each 10 ms: one reload.
	for i := range 30 {
		p := filepath.Join(dir, fmt.Sprintf("h%02d.go", i))
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the tree's layout changed: %v", err)
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("package x // formatted %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	eventually(t, 20*time.Second, "the burst reloaded", func() bool { _, _, _, n := snk.published(); return n > n0 })
	time.Sleep(3 * debounce)
	if _, _, _, n := snk.published(); n != n0+1 {
		t.Errorf("a burst of 30 edits made %d reloads, want 1", n-n0)
	}
	st, _ := s.Stats()
	if !st.Order.Kept || len(st.Order.Changed) != 30 {
		t.Errorf("order after the burst: %+v; want the 30 changed files named", st.Order)
	}
	// A tree that never goes quiet: an edit every 300 ms for 4 s reloads
	// within the 2 s bound, not only after the writes stop.
	_, _, _, n1 := snk.published()
	stop := time.Now().Add(4 * time.Second)
	reloadedWhileBusy := false
	for i := 0; time.Now().Before(stop); i++ {
		if err := os.WriteFile(filepath.Join(dir, "h00.go"), []byte(fmt.Sprintf("package x // busy %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, _, _, n := snk.published(); n > n1 {
			reloadedWhileBusy = true
		}
	}
	if !reloadedWhileBusy {
		t.Error("a tree edited every 300 ms for 4 s was not reloaded while the edits went on (bound 2 s)")
	}
}

// TestReloadKeepsTheWorkingSet: after a reload (an edit), the first
// question finds the same pieces in the same order, read again from the
// new codex: the block is the same bytes up to the edited file's piece,
// which holds the edit; a file deleted since is left out.
func TestReloadKeepsTheWorkingSet(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 6000, false)
	dir := packages(t, 8, 4, 1500)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ := snk.published()
	ws := r.(*workingSet)
	if _, _, _, err := ws.Retrieve(t.Context(), "what do pkgc frobs turn into", 3); err != nil {
		t.Fatal(err)
	}
	_, ex, _, err := ws.Retrieve(t.Context(), "pkgf frobs widget0", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := ws.Absorb(t.Context(), ex, 1000); err != nil {
		t.Fatal(err)
	}
	before, _, rep, err := ws.Retrieve(t.Context(), "pkgc gizmos widget", 3)
	if err != nil || rep.Generation != 2 || !strings.Contains(before.Body, `file "pkgf/`) {
		t.Fatalf("the working set before the edit: %+v, %v", rep, err)
	}
	// The first line of the first pkgf piece, edited.
	var piece string // its fence line from " file" on
	for _, f := range pieceFences(before.Body) {
		if strings.Contains(f, `file "pkgf/`) && strings.Contains(f, " lines ") {
			piece = f[strings.Index(f, " file"):]
			break
		}
	}
	path, lines, _ := strings.Cut(strings.TrimPrefix(piece, " file "), " lines ")
	edited := filepath.Join(dir, filepath.FromSlash(strings.Trim(path, `"`)))
	data, err := os.ReadFile(edited)
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.SplitAfter(string(data), "\n")
	first := lineStart(lines) - 1
	ls[first] = strings.TrimSuffix(ls[first], "\n") + " // pkgf edited here\n"
	if err := os.WriteFile(edited, []byte(strings.Join(ls, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	// A file of the working set's first choice, deleted.
	gone := pieceFences(before.Body)[0]
	gonePath := strings.Trim(gone[strings.Index(gone, `"`):strings.LastIndex(gone, `"`)+1], `"`)
	if err := os.Remove(filepath.Join(dir, gonePath)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ = snk.published()
	after, _, rep, err := r.(*workingSet).Retrieve(t.Context(), "pkgc gizmos widget", 3)
	if err != nil || !strings.Contains(rep.Moved, "kept from the codex before") || rep.Generation != 1 {
		t.Fatalf("the first question after the reload: %+v, %v", rep, err)
	}
	want := slices.DeleteFunc(pieceFences(before.Body), func(f string) bool { return f == gone })
	if got := pieceFences(after.Body); !slices.Equal(got, want) {
		t.Errorf("the pieces after the reload:\n%q\nwant those before without the deleted file:\n%q", got, want)
	}
	if !strings.Contains(after.Body, "pkgf edited here") {
		t.Error("the edited file's piece was not read again")
	}
	// From the working set's start to the edited piece the block is the
	// one before, without the deleted file's piece (the map before it
	// lists the files: it lost one).
	cut := func(body string) string {
		return body[strings.Index(body, "\nWorking set:"):strings.Index(body, piece)]
	}
	fence := "\n" + gone[:strings.Index(gone, " ")] + "\n"
	start := strings.Index(before.Body, gone)
	end := start + strings.Index(before.Body[start:], fence) + len(fence)
	if cut(after.Body) != cut(before.Body[:start]+before.Body[end:]) {
		t.Errorf("the block before the edited piece changed beyond the deleted file's piece")
	}
}

// TestEditsLastMovesTheEditedPiece: with EditsLast (backend.cache_reuse)
// the working set carried over a reload puts the piece whose file was
// edited at its end and keeps the others in their order, so a backend
// that shifts cached chunks reuses the pieces after the edit; the map
// before them is the same.
func TestEditsLastMovesTheEditedPiece(t *testing.T) {
	t.Parallel()
	s, snk := newServiceWith(t, 6000, false, func(c *Config) { c.Settings.Walk.EditsLast = true })
	dir := packages(t, 8, 4, 1500)
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ := snk.published()
	before, _, _, err := r.(*workingSet).Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	if err != nil {
		t.Fatal(err)
	}
	fences := pieceFences(before.Body)
	if len(fences) < 3 {
		t.Fatalf("a working set of %d pieces; the test needs 3 or more:\n%s", len(fences), before.Body)
	}
	// The first piece's file, edited where the piece starts.
	first := fences[0][strings.Index(fences[0], " file ")+len(" file "):]
	path, lines, _ := strings.Cut(first, " lines ")
	edited := filepath.Join(dir, filepath.FromSlash(strings.Trim(path, `"`)))
	data, err := os.ReadFile(edited)
	if err != nil {
		t.Fatal(err)
	}
	ls := strings.SplitAfter(string(data), "\n")
	at := 0
	if lines != "" {
		at = lineStart(lines) - 1
	}
	ls[at] = strings.TrimSuffix(ls[at], "\n") + " // edited here\n"
	if err := os.WriteFile(edited, []byte(strings.Join(ls, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(t.Context(), dir, nil); err != nil {
		t.Fatal(err)
	}
	_, _, r, _ = snk.published()
	after, _, _, err := r.(*workingSet).Retrieve(t.Context(), "what do pkgc frobs turn into", 3)
	if err != nil {
		t.Fatal(err)
	}
	// A fence's tildes depend on the content; compare from " file " on.
	names := func(fs []string) []string {
		out := make([]string, len(fs))
		for i, f := range fs {
			out[i] = f[strings.Index(f, " file "):]
		}
		return out
	}
	want := append(names(fences[1:]), names(fences[:1])...)
	if got := names(pieceFences(after.Body)); !slices.Equal(got, want) {
		t.Errorf("the pieces after the edit:\n%q\nwant the edited one last:\n%q", got, want)
	}
	if !strings.Contains(after.Body, "// edited here") {
		t.Error("the edited piece was not read again")
	}
	mapOf := func(body string) string { return body[:strings.Index(body, "\nWorking set:")] }
	if mapOf(after.Body) != mapOf(before.Body) {
		t.Errorf("the edit changed the map before the working set")
	}
}
