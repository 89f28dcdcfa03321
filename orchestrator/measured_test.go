package orchestrator

import (
	"context"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
)

// measuring is a backend that measures as llama-server does: it reports
// the prompt tokens it reused, and a generation stopped while its prompt
// was read reports how much it had read.
type measuring struct {
	*fake.Backend
	failRead   int // the next generation fails, having read this much of its prompt
	failCached int // of which it reports having reused this much (-1: it does not say)
	reused     int // what the next generation reports it reused
}

func (m *measuring) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	if m.failRead > 0 {
		n := m.failRead
		m.failRead = 0
		return ctxd.Generation{BackendCached: m.failCached, PromptRead: n}, ctxd.Errorf(ctxd.KindBackend, "stopped while reading the prompt")
	}
	gen, err := m.Backend.Generate(ctx, req, onToken)
	gen.BackendCached, gen.PromptEvalCount = m.reused, len(req.Tokens)
	return gen, err
}

// TestMeasuredFiguresWin: after a generation stopped while its prompt was
// read, ctxd expects the slot to hold what the backend reported reading;
// where the backend measures its reuse, the summary's evaluated tokens
// and reuse are the measured ones, and the note names the stop as the
// cause when the backend kept more than it had reported. What the backend
// read for the stopped request is counted (Spent): what it reported, and
// what it kept beyond that once the next request's reuse shows it.
func TestMeasuredFiguresWin(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	m := &measuring{Backend: h.backend}
	h.o.backend = m
	var spent [][2]int
	h.o.cfg.Spent = func(evaluated, reused int) { spent = append(spent, [2]int{evaluated, reused}) }
	q := "a question " + strings.Repeat("with a long text ", 20)
	m.failRead, m.failCached = 1000, 0 // most of the stable prefix, little of the conversation
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: q}, noop); ctxd.KindOf(err) != ctxd.KindBackend {
		t.Fatalf("the stopped generation: %v", err)
	}
	if len(spent) != 1 || spent[0] != [2]int{1000, 0} {
		t.Errorf("spent on the stopped request: %v; want 1000 evaluated, 0 reused", spent)
	}
	m.reused = 1100 // the backend had read more than it reported
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: q}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.PromptTokens <= 1100 {
		t.Fatalf("the prompt has %d tokens; the test needs more than 1100", sum.PromptTokens)
	}
	if sum.CachedTokens != 1000 {
		t.Errorf("expected reuse %d; want 1000, what the backend reported reading before the stop", sum.CachedTokens)
	}
	if sum.BackendCachedTokens == nil || *sum.BackendCachedTokens != 1100 || sum.EvaluatedTokens != sum.PromptTokens-1100 {
		t.Errorf("measured %v, evaluated %d of %d; want 1100 reused and the rest evaluated", sum.BackendCachedTokens, sum.EvaluatedTokens, sum.PromptTokens)
	}
	if !strings.Contains(sum.ReuseNote, "stopped while its prompt was read") {
		t.Errorf("reuse note %q does not name the stopped request", sum.ReuseNote)
	}
	// The 100 tokens the stopped request read past its last report are
	// its work, counted when the retry's reuse shows them.
	if len(spent) != 2 || spent[1] != [2]int{100, 0} {
		t.Errorf("spent: %v; want the stopped request's 1000, then the 100 it read unreported", spent)
	}
	// The next request on the slot is past the stop: the ordinary note.
	m.reused = sum.PromptTokens + 5
	sum, _ = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "next"}, noop)
	if strings.Contains(sum.ReuseNote, "stopped") {
		t.Errorf("the stop is named a turn later: %q", sum.ReuseNote)
	}
}

// roomRecorder is a Room that records what it was asked and makes none.
type roomRecorder struct{ asked []int }

func (r *roomRecorder) MakeRoom(_ context.Context, n int) (bool, error) {
	r.asked = append(r.asked, n)
	return false, nil
}

// TestRoomOnlyForRequestsItCanFit: the codex is asked to give way to a
// client's prompt only when some share of it would let the prompt fit; a
// prompt too large for the window whatever the codex does is refused
// without shrinking the codex for everyone.
func TestRoomOnlyForRequestsItCanFit(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 3000, AnswerReserve: 64}, 1) // the codex block is about 2,300 tokens
	r := &roomRecorder{}
	h.o.cfg.Room = r
	_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "big", Query: strings.Repeat("x", 1000)}, noop)
	if ctxd.KindOf(err) != ctxd.KindDoesNotFit || len(r.asked) != 1 || r.asked[0] < 1000 {
		t.Fatalf("a prompt that fits beside a smaller codex: %v; room asked %v", err, r.asked)
	}
	_, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "huge", Query: strings.Repeat("x", 4000)}, noop)
	if ctxd.KindOf(err) != ctxd.KindDoesNotFit || len(r.asked) != 1 {
		t.Errorf("a prompt over the window whatever the codex: %v; room asked %v", err, r.asked)
	}
	if !strings.Contains(err.Error(), "The client's own prompt is") {
		t.Errorf("the refusal does not say what the client's part is: %v", err)
	}
}
