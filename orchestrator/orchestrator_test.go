package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
)

// byteTokenizer makes one token per byte: exact and trivially checkable.
type byteTokenizer struct{}

func (byteTokenizer) Tokenize(s string) ([]int, error) {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out, nil
}

func (b byteTokenizer) TokenizeText(s string) ([]int, error) { return b.Tokenize(s) }

// echoBackend answers with a fixed text in two pieces and remembers prompts.
type echoBackend struct {
	prompts    []string
	fail       error
	incomplete bool // end like a stream without the backend's final message
}

func (b *echoBackend) Generate(_ context.Context, req GenerateRequest, onToken func(string) error) (Generation, error) {
	if b.fail != nil {
		return Generation{}, b.fail
	}
	b.prompts = append(b.prompts, req.Prompt)
	for _, p := range []string{"an ", "answer"} {
		if err := onToken(p); err != nil {
			return Generation{}, err
		}
	}
	if b.incomplete {
		return Generation{Text: "an answer", DoneReason: DoneIncomplete, TTFT: time.Millisecond}, nil
	}
	return Generation{Text: "an answer", DoneReason: "stop", EvalCount: 2, TTFT: time.Millisecond}, nil
}

type fakeEnv struct{ memory string }

func (e *fakeEnv) Environment() (runcontext.Environment, hostenv.Reading) {
	return runcontext.Environment{Memory: e.memory, GPU: "none", Power: "ac", Connectivity: "offline"}, hostenv.Reading{}
}

func newTest(t *testing.T, limits governor.Limits) (*Orchestrator, *echoBackend, *fakeEnv) {
	t.Helper()
	store, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	reg, err := sigils.NewRegistry(map[string][]string{"default": {"ask"}, "mute": {"read"}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	be, env := &echoBackend{}, &fakeEnv{memory: "high"}
	o, err := New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Codex: CodexState{Block: runcontext.Codex{Name: "c", Mode: runcontext.ModeCAG, Body: strings.Repeat("codex line\n", 200),
			Files: []runcontext.CodexRef{{Path: "a.txt", Bytes: 2200, SHA256: strings.Repeat("0", 64)}}}},
		Limits: limits, Sigils: reg, Slot: "m",
	}, be, byteTokenizer{}, store, env)
	if err != nil {
		t.Fatal(err)
	}
	return o, be, env
}

func TestTurnsReuseThePrefix(t *testing.T) {
	o, be, env := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64})
	ctx := t.Context()
	var streamed strings.Builder
	sum, err := o.Ask(ctx, Request{Session: "s1", Query: "first?"}, func(s string) error { streamed.WriteString(s); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if sum.Turn != 1 || sum.CachedTokens != 0 || sum.PrefixNote == "" || streamed.String() != "an answer" {
		t.Fatalf("turn 1 summary %+v streamed %q", sum, streamed.String())
	}
	for turn := 2; turn <= 3; turn++ {
		sum, err = o.Ask(ctx, Request{Session: "s1", Query: "next?"}, func(string) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		prev := be.prompts[len(be.prompts)-2]
		if sum.CachedTokens != len(prev) || sum.PrefixBreak != nil || sum.Turn != turn {
			t.Fatalf("turn %d: summary %+v, want %d cached tokens and no break", turn, sum, len(prev))
		}
		if sum.ReusePercent < 95 {
			t.Errorf("turn %d reuses %.1f%%", turn, sum.ReusePercent)
		}
		if !strings.HasPrefix(be.prompts[len(be.prompts)-1], prev+runcontext.RenderAnswer("an answer")) {
			t.Errorf("turn %d prompt does not extend the previous prompt and answer", turn)
		}
	}

	env.memory = "low"
	sum, err = o.Ask(ctx, Request{Session: "s1", Query: "after a band change"}, func(string) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "environment" {
		t.Errorf("environment change: break %+v", sum.PrefixBreak)
	}
}

func TestRefusals(t *testing.T) {
	o, _, _ := newTest(t, governor.Limits{NumCtx: 3000, AnswerReserve: 64})
	ctx := t.Context()
	noop := func(string) error { return nil }
	cases := []struct {
		name string
		req  Request
		want error
	}{
		{"bad session", Request{Session: "../etc", Query: "q"}, ErrBadRequest},
		{"empty query", Request{Session: "s", Query: "  "}, ErrBadRequest},
		{"unknown sigil", Request{Session: "s", Query: "q", Sigil: "root"}, ErrForbidden},
		{"sigil without ask", Request{Session: "s", Query: "q", Sigil: "mute"}, ErrForbidden},
	}
	for _, c := range cases {
		if _, err := o.Ask(ctx, Request(c.req), noop); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	var le *governor.LimitError
	if _, err := o.Ask(ctx, Request{Session: "s", Query: strings.Repeat("long ", 200)}, noop); !errors.As(err, &le) {
		t.Errorf("over-window query: %v, want a LimitError", err)
	}
}

func TestBackendFailureForgetsSlot(t *testing.T) {
	o, be, _ := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64})
	noop := func(string) error { return nil }
	if _, err := o.Ask(t.Context(), Request{Session: "s", Query: "q"}, noop); err != nil {
		t.Fatal(err)
	}
	be.fail = errors.New("backend down")
	if _, err := o.Ask(t.Context(), Request{Session: "s", Query: "q2"}, noop); err == nil {
		t.Fatal("backend failure not reported")
	}
	be.fail = nil
	sum, err := o.Ask(t.Context(), Request{Session: "s", Query: "q3"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.CachedTokens != 0 || sum.Turn != 2 {
		t.Errorf("after a failure: %+v, want nothing cached and turn 2", sum)
	}
}

func TestIncompleteAnswerIsKeptAndMarked(t *testing.T) {
	o, be, _ := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64})
	be.incomplete = true
	noop := func(string) error { return nil }
	sum, err := o.Ask(t.Context(), Request{Session: "s", Query: "q"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.DoneReason != DoneIncomplete || !strings.Contains(sum.DoneNote, "without its final message") || sum.AnswerTokens != len("an answer") {
		t.Errorf("incomplete answer summary: done %q, note %q, %d answer tokens", sum.DoneReason, sum.DoneNote, sum.AnswerTokens)
	}
	be.incomplete = false
	next, err := o.Ask(t.Context(), Request{Session: "s", Query: "q2"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	// The partial answer is part of the conversation the backend holds.
	if next.Turn != 2 || next.CachedTokens != sum.PromptTokens || !strings.Contains(be.prompts[1], "an answer") || next.DoneNote != "" {
		t.Errorf("turn after an incomplete answer: %+v", next)
	}
}

func TestDepthCompactsInEpochsAndKeepsPinned(t *testing.T) {
	o, be, _ := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64, MaxDepth: 4})
	ctx := t.Context()
	noop := func(string) error { return nil }
	if _, err := o.Ask(ctx, Request{Session: "s", Query: "remember: the key is 42", Pin: true}, noop); err != nil {
		t.Fatal(err)
	}
	var sum *Summary
	var err error
	for i := 2; i <= 6; i++ {
		if sum, err = o.Ask(ctx, Request{Session: "s", Query: fmt.Sprint("filler ", i)}, noop); err != nil {
			t.Fatal(err)
		}
		if i <= 5 && len(sum.Governor) != 0 {
			t.Fatalf("turn %d compacted early: %+v", i, sum.Governor)
		}
	}
	// Turn 6 saw 5 turns of history > max_depth 4: cut to 2 in one step.
	if len(sum.Governor) != 1 || sum.Governor[0].Kind != "compact" || sum.Governor[0].TurnsDropped != 3 || sum.Epoch != 1 {
		t.Fatalf("turn 6 governor %+v epoch %d", sum.Governor, sum.Epoch)
	}
	if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "state" {
		t.Errorf("compaction not reported as a state break: %+v", sum.PrefixBreak)
	}
	last := be.prompts[len(be.prompts)-1]
	if !strings.Contains(last, "the key is 42") || strings.Contains(last, "filler 2\n") || !strings.Contains(last, "filler 5") {
		t.Errorf("after compaction the prompt should keep the pinned turn and the newest, not the oldest filler:\n%s", last[len(last)-400:])
	}
	// The next turn extends the compacted prompt again.
	if sum, err = o.Ask(ctx, Request{Session: "s", Query: "next"}, noop); err != nil || sum.PrefixBreak != nil || len(sum.Governor) != 0 {
		t.Errorf("turn after compaction: %+v %v", sum, err)
	}
}

func TestCondenseWhenTheWindowIsExceeded(t *testing.T) {
	// Byte tokens: the stable blocks are ~2.4k, each turn ~60; the window
	// holds the stable blocks and a few turns only.
	o, be, _ := newTest(t, governor.Limits{NumCtx: 2850, AnswerReserve: 64})
	ctx := t.Context()
	noop := func(string) error { return nil }
	var sum *Summary
	var err error
	for i := range 8 {
		sum, err = o.Ask(ctx, Request{Session: "c", Query: fmt.Sprintf("question number %d, padded a little", i), Pin: i == 0}, noop)
		if err != nil {
			t.Fatalf("turn %d: %v", i+1, err)
		}
		if len(sum.Governor) > 0 {
			break
		}
	}
	if len(sum.Governor) == 0 || sum.Governor[len(sum.Governor)-1].Kind != "condense" {
		t.Fatalf("no condensation within 8 turns: %+v", sum)
	}
	if sum.PromptTokens > 2850-64 {
		t.Errorf("condensed prompt %d tokens still over the budget", sum.PromptTokens)
	}
	last := be.prompts[len(be.prompts)-1]
	condensePrompt := be.prompts[len(be.prompts)-2]
	if !strings.Contains(condensePrompt, condenseInstruction) {
		t.Errorf("the backend was not asked to condense:\n%s", condensePrompt)
	}
	if !strings.Contains(last, "[summary of earlier turns]\nan answer\n") || !strings.Contains(last, "question number 0") {
		t.Errorf("the condensed prompt should hold the summary and the pinned turn:\n%s", last[len(last)-600:])
	}

	// A query that cannot fit even with no history is refused with numbers.
	_, err = o.Ask(ctx, Request{Session: "c", Query: strings.Repeat("z", 3000)}, noop)
	var le *governor.LimitError
	if !errors.As(err, &le) || le.Needed <= le.Allowed || !strings.Contains(err.Error(), "query=") {
		t.Errorf("oversized query: %v", err)
	}
}

type fakeRetriever struct{ queries []string }

func (f *fakeRetriever) Search(_ context.Context, q string, k int) ([]runcontext.Excerpt, error) {
	f.queries = append(f.queries, q)
	var out []runcontext.Excerpt
	for i := range k {
		out = append(out, runcontext.Excerpt{Path: fmt.Sprintf("pkg/f%d.go", i), Lines: "1-9", Text: strings.Repeat("excerpt text ", 20)})
	}
	return out, nil
}

func TestRAGPutsExcerptsInTheVolatileTail(t *testing.T) {
	o, be, _ := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64})
	r := &fakeRetriever{}
	o.SetCodex(CodexState{
		Block:     runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: "map of files\n"},
		Plan:      governor.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"},
		Retriever: r, TopK: 3,
	})
	noop := func(string) error { return nil }
	sum, err := o.Ask(t.Context(), Request{Session: "r", Query: "where is f1?"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Excerpts != 3 || sum.Codex.Mode != "rag" || len(r.queries) != 1 {
		t.Fatalf("summary %+v, queries %v", sum, r.queries)
	}
	p := be.prompts[0]
	conv := strings.Index(p, "### CONVERSATION")
	first := strings.Index(p, "[excerpt \"pkg/f0.go\" lines 1-9]")
	if first < conv || !strings.Contains(p[first:], "where is f1?") {
		t.Errorf("excerpts must sit next to the query, after the stable blocks:\n%s", p)
	}
	if strings.Contains(p, "tool: search_codex") {
		t.Error("search_codex offered to a sigil without the scope")
	}
	// The next turn keeps the excerpts in the history, so it extends the prefix.
	sum, err = o.Ask(t.Context(), Request{Session: "r", Query: "and f2?"}, noop)
	if err != nil || sum.PrefixBreak != nil {
		t.Errorf("second RAG turn: %+v %v", sum.PrefixBreak, err)
	}
}

// mergingTokenizer is a byte tokenizer that merges "\n###" into one token,
// so a prompt split after a blank line tokenizes differently from the whole.
type mergingTokenizer struct{ byteTokenizer }

func (m mergingTokenizer) Tokenize(s string) ([]int, error) {
	var out []int
	for i := 0; i < len(s); i++ {
		if strings.HasPrefix(s[i:], "\n###") {
			out = append(out, 1000)
			i += 3
			continue
		}
		out = append(out, int(s[i]))
	}
	return out, nil
}

func (m mergingTokenizer) TokenizeText(s string) ([]int, error) { return m.Tokenize(s) }

func TestIncrementalTokenizationStaysExact(t *testing.T) {
	for name, tok := range map[string]Tokenizer{"splittable": byteTokenizer{}, "merging": mergingTokenizer{}} {
		t.Run(name, func(t *testing.T) {
			o, be, _ := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64})
			o.tok = tok
			for i := range 2*tailCheckEvery + 1 { // through the periodic whole-tail checks
				sum, err := o.Ask(t.Context(), Request{Session: "tok", Query: fmt.Sprint("q", i)}, func(string) error { return nil })
				if err != nil {
					t.Fatal(err)
				}
				want, _ := tok.Tokenize(be.prompts[len(be.prompts)-1])
				if sum.PromptTokens != len(want) {
					t.Errorf("turn %d: %d prompt tokens, the whole prompt has %d", i+1, sum.PromptTokens, len(want))
				}
			}
			if e := len(o.prefixes); e != 1 {
				t.Errorf("%d cached prefixes, want 1", e)
			}
		})
	}
}
