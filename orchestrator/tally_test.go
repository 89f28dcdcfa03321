package orchestrator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

func TestChangedLines(t *testing.T) {
	for _, c := range []struct{ old, new, removed, added string }{
		// The last excerpt left out of a query block.
		{"### USER\n[e1]\nx\n[e2]\ny\nq?\n### A\n", "### USER\n[e1]\nx\nq?\n### A\n", "[e2]\ny\n", ""},
		// The first of several left out.
		{"U\n[e1]\nx\n[e2]\ny\nq\n", "U\n[e2]\ny\nq\n", "[e1]\nx\n", ""},
		// The last karma entry: "(none)" takes its place.
		{"### KARMA\n- [k1] a\n\n", "### KARMA\n(none)\n\n", "- [k1] a\n", "(none)\n"},
		// Entries left out here and there: one span, whole lines.
		{"K\n- a1\n- b\n- a2\n\n", "K\n- b\n\n", "- a1\n- b\n- a2\n", "- b\n"},
		// A change within a line takes the whole line.
		{"H\nabc def\nT\n", "H\nabc xyz def\nT\n", "abc def\n", "abc xyz def\n"},
		// A block with no newline at all.
		{"abc", "abd", "abc", "abd"},
		{"", "x\n", "", "x\n"},
	} {
		removed, added := changedLines(c.old, c.new)
		if removed != c.removed || added != c.added {
			t.Errorf("changedLines(%q, %q) = %q, %q; want %q, %q", c.old, c.new, removed, added, c.removed, c.added)
		}
		// What is left around the change is the same in both.
		if i := strings.Index(c.old, removed); i < 0 || c.old[:i]+added+c.old[i+len(removed):] != c.new {
			t.Errorf("changedLines(%q, %q): %q → %q does not turn one into the other", c.old, c.new, removed, added)
		}
	}
}

// pieceTokenizer is a byte tokenizer that counts 10 tokens more for a
// text that does not start a block ("###"): a piece of a block counted on
// its own costs more than it does within the prompt, as a SentencePiece
// vocabulary's leading space does, but by more than the governor's slack.
type pieceTokenizer struct{ fake.Tokenizer }

func (p pieceTokenizer) Tokenize(s string) ([]int, error) {
	ids, _ := p.Tokenizer.Tokenize(s)
	if s != "" && !strings.HasPrefix(s, "###") {
		ids = append(make([]int, 10), ids...)
	}
	return ids, nil
}

func (p pieceTokenizer) TokenizeText(s string) ([]int, error) { return p.Tokenize(s) }

// markedTokenizer counts the texts it tokenizes that hold a marker.
type markedTokenizer struct {
	ctxd.Tokenizer
	mu      sync.Mutex
	markers map[string]int
}

func (m *markedTokenizer) Tokenize(s string) ([]int, error) {
	m.mu.Lock()
	for marker := range m.markers {
		if strings.Contains(s, marker) {
			m.markers[marker]++
		}
	}
	m.mu.Unlock()
	return m.Tokenizer.Tokenize(s)
}

func (m *markedTokenizer) TokenizeText(s string) ([]int, error) { return m.Tokenize(s) }

func (m *markedTokenizer) reset() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.markers {
		out[k], m.markers[k] = v, 0
	}
	return out
}

// rankedRetriever finds k excerpts of lengths that differ.
type rankedRetriever struct{}

func (rankedRetriever) Search(_ context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	out := make([]ctxd.Excerpt, k)
	for i := range out {
		out[i] = ctxd.Excerpt{Path: fmt.Sprintf("pkg/f%d.go", i), Lines: "1-9", Text: strings.Repeat(fmt.Sprintf("line %d of the file\n", i), 3+i%4)}
	}
	return out, nil
}

// eligibleKarma is a karma store with 12 verified traces of equal length,
// their scores by age, whose texts are new at every choice (each request
// has a karma block of its own).
type eligibleKarma struct {
	*fake.Karma
	choices *atomic.Int64
}

func (k eligibleKarma) Eligible(_ context.Context, sigil string) ([]ctxd.Trace, error) {
	n := k.choices.Add(1)
	out := make([]ctxd.Trace, 12)
	for i := range out {
		out[i] = ctxd.Trace{ID: int64(10 + i), Sigil: sigil, Status: ctxd.TraceVerified, CreatedAt: time.Date(2026, 1, 1, i, 0, 0, 0, time.UTC),
			Query: fmt.Sprintf("karma question %02d of choice %06d", i, n), Answer: strings.Repeat("karma answer ", 8)}
	}
	return out, nil
}

// newGovernorTest is an orchestrator in RAG mode with karma over tok.
func newGovernorTest(t *testing.T, lim governor.Limits, tok ctxd.Tokenizer) *harness {
	t.Helper()
	reg, err := sigils.NewRegistry(map[string][]string{"reader": {"ask", "karma:read"}}, "reader")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{backend: fake.NewBackend(), env: fake.NewSensor(), store: fake.NewStore(), sched: scheduler.New(scheduler.Options{Slots: 1})}
	h.o, err = New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Limits:   lim, Sigils: reg, TopK: 12,
		Karma: KarmaConfig{Store: eligibleKarma{fake.NewKarma(), &atomic.Int64{}}, Options: karma.Options{TopK: 12}},
	}, h.backend, tokencount.New(tok, nil), h.store, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	h.o.SetCodex(runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: strings.Repeat("THE-CODEX map of files\n", 40)},
		ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, rankedRetriever{}, h.o.Limits())
	return h
}

// TestGovernorLeavesOutNoMoreThanNeeded: for every window from roomy to
// too small, the prompt sent fits, and the governor kept every excerpt and
// karma entry it could: one more (the next it left out) would not have
// fitted. So it stops where a governor that counted every step exactly
// stops, with a tokenizer whose pieces count as they do in the prompt,
// and with one whose pieces count more on their own than the slack allows
// for (its adjusted counts are short, and the exact count catches it).
func TestGovernorLeavesOutNoMoreThanNeeded(t *testing.T) {
	t.Parallel()
	for name, tok := range map[string]ctxd.Tokenizer{"additive": fake.Tokenizer{}, "pieces count more": pieceTokenizer{}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			roomy := newGovernorTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, tok)
			full := roomy.ask(t, "roomy", "where?")
			excerpts := make([]string, 12)
			ex, _ := rankedRetriever{}.Search(t.Context(), "where?", 12)
			for i, e := range ex {
				excerpts[i] = runcontext.RenderExcerpt(e)
			}
			entry := (full.Budget.Blocks[runcontext.BlockKarma].Tokens - len("### KARMA\n\n")) / 12 // each, in the prompt
			pruned := 0
			for numCtx := full.PromptTokens + 64; numCtx > full.PromptTokens+64-3000; numCtx -= 97 {
				lim := governor.Limits{NumCtx: numCtx, AnswerReserve: 64}
				h := newGovernorTest(t, lim, tok)
				sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "where?"}, noop)
				if err != nil { // every window has room for the stable blocks and the question
					t.Errorf("window %d: refused: %v", numCtx, err)
					continue
				}
				if sum.PromptTokens > lim.PromptBudget() || len(h.backend.Requests()[0].Tokens) != sum.PromptTokens {
					t.Fatalf("window %d: %d prompt tokens sent, budget %d", numCtx, sum.PromptTokens, lim.PromptBudget())
				}
				room := lim.PromptBudget() - sum.PromptTokens
				k := len(sum.Karma.Traces)
				if n := sum.Excerpts; k == 12 && n < 12 && len(excerpts[n]) <= room {
					t.Errorf("window %d: %d excerpts kept, but the next (%d tokens) fits in the %d left", numCtx, n, len(excerpts[n]), room)
				}
				if k == 12 {
					continue
				}
				pruned++
				if sum.Excerpts > 0 {
					t.Errorf("window %d: karma pruned while %d excerpts stayed", numCtx, sum.Excerpts)
				}
				// The first pruning leaves out half the entries; each one
				// after it, one entry.
				back := entry
				if k == 0 {
					back -= len("(none)\n")
				}
				if k < 6 && back <= room {
					t.Errorf("window %d: %d karma entries kept, but another (%d tokens) fits in the %d left (%+v)", numCtx, k, back, room, sum.Governor)
				}
			}
			if pruned == 0 {
				t.Error("no window pruned karma: the windows do not cover what the test is for")
			}
		})
	}
}

// TestGovernorCountsTheWholePromptOnce: on a turn that leaves out every
// excerpt and prunes karma step by step, the question's text (the tail of
// every prompt) and the codex (the stable prefix) are tokenized a few
// times, however many steps the governor takes: the steps count only what
// they change.
func TestGovernorCountsTheWholePromptOnce(t *testing.T) {
	t.Parallel()
	tok := &markedTokenizer{Tokenizer: fake.Tokenizer{}, markers: map[string]int{"THE-CODEX": 0, "THE-QUESTION": 0}}
	roomy := newGovernorTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, tok)
	full := roomy.ask(t, "roomy", "THE-QUESTION?")
	entry := (full.Budget.Blocks[runcontext.BlockKarma].Tokens - len("### KARMA\n\n")) / 12
	excerpts := full.Budget.Blocks[runcontext.BlockQuery].Tokens - len(runcontext.RenderQuery("THE-QUESTION?", nil))
	// Room for no excerpt and 3½ karma entries: every excerpt is left
	// out, then 6 entries, then 3 one at a time.
	lim := governor.Limits{NumCtx: full.PromptTokens - excerpts - 9*entry + entry/2 + 64, AnswerReserve: 64}
	h := newGovernorTest(t, lim, tok)
	h.ask(t, "warm", "a question that fits?") // the codex block, counted once as at load
	tok.reset()
	sum := h.ask(t, "s", "THE-QUESTION?")
	steps := 0
	for _, a := range sum.Governor {
		if a.Kind == ctxd.ActionKarma {
			steps++
		}
	}
	if sum.Excerpts != 0 || steps != 4 || len(sum.Karma.Traces) != 3 {
		t.Fatalf("the turn kept %d excerpts and pruned karma %d times: not the overflow the test is for (%+v)", sum.Excerpts, steps, sum.Governor)
	}
	steps += 12
	// An exact count tokenizes the codex twice (a new prefix, and the
	// whole prompt once to check the split) and the question three times
	// (that whole prompt, the tail, the query block on its own). There
	// are two, the first and the last, and a third where an adjusted
	// count comes within its slack of the limit.
	got := tok.reset()
	t.Logf("%d governor steps tokenized the codex %d times and the question %d times", steps, got["THE-CODEX"], got["THE-QUESTION"])
	if got["THE-CODEX"] > 3*2 || got["THE-QUESTION"] > 3*3 {
		t.Errorf("%d governor steps tokenized the codex %d times and the question %d times; want at most 6 and 9", steps, got["THE-CODEX"], got["THE-QUESTION"])
	}
}
