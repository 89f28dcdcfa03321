package orchestrator

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
)

// TestSessionFollowsClientHistory is a door's client resending its whole
// history: while it only grows, every prompt extends the one before and
// nothing is rewritten; an edit, a regenerated turn or another
// conversation under the same session starts a new epoch holding the
// client's turns, and the record keeps the old ones.
func TestSessionFollowsClientHistory(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.backend.SetAnswer("  the answer \n")
	var history []ctxd.Turn
	ask := func(q string, hist []ctxd.Turn, system string) *ctxd.Summary {
		t.Helper()
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "door", Query: q, History: append([]ctxd.Turn{}, hist...), System: system}, noop)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	for i, q := range []string{"q1", "q2", "q3"} {
		sum := ask(q, history, "client rules")
		if i > 0 && (sum.PrefixBreak != nil || sum.CachedTokens == 0 || sum.Epoch != 0) {
			t.Fatalf("turn %d: break %+v cached %d epoch %d", i+1, sum.PrefixBreak, sum.CachedTokens, sum.Epoch)
		}
		// The client sends back the answer as it got it (trimmed, as some do).
		history = append(history, ctxd.Turn{Query: q, Answer: "the answer"})
	}
	if p := h.lastPrompt(); !strings.Contains(p, "### INSTRUCTIONS\nclient rules\n") {
		t.Errorf("the client's system text is not in the prompt:\n%s", p[:min(300, len(p))])
	}

	// The client edits its first question: a new epoch with its turns.
	edited := append([]ctxd.Turn{{Query: "q1 edited", Answer: "the answer"}}, history[1:]...)
	sum := ask("q4", edited, "client rules")
	if sum.Epoch != 1 || sum.PrefixBreak == nil || sum.PrefixBreak.Block != "state" || !strings.Contains(sum.PrefixNote, "client's history") {
		t.Errorf("edit: epoch %d break %+v note %q", sum.Epoch, sum.PrefixBreak, sum.PrefixNote)
	}
	if p := h.lastPrompt(); !strings.Contains(p, "q1 edited") || strings.Count(p, "### USER\nq1\n") != 0 {
		t.Errorf("the prompt does not hold the client's edited history")
	}
	s, _ := h.store.Session(t.Context(), "door")
	if len(s.Turns) != 4 || s.Count != 3+3+1 {
		t.Errorf("store: %d turns in the epoch, %d in all; want 4 and 7 (nothing deleted)", len(s.Turns), s.Count)
	}

	// Regenerate: the client drops the last answer and asks again.
	edited = append(edited, ctxd.Turn{Query: "q4", Answer: "the answer"})
	sum = ask("q5", edited, "client rules")
	if sum.Epoch != 1 || sum.PrefixBreak != nil {
		t.Errorf("extending after the edit: epoch %d break %+v", sum.Epoch, sum.PrefixBreak)
	}
	sum = ask("q5 again", edited, "client rules")
	if sum.Epoch != 2 {
		t.Errorf("regenerate: epoch %d, want 2", sum.Epoch)
	}
	// Another conversation with no history under the same session.
	if sum = ask("fresh", []ctxd.Turn{}, "client rules"); sum.Epoch != 3 {
		t.Errorf("fresh conversation: epoch %d, want 3", sum.Epoch)
	}
	if s, _ := h.store.Session(t.Context(), "door"); len(s.Turns) != 1 {
		t.Errorf("fresh conversation: %d turns held, want 1", len(s.Turns))
	}
}

// TestFollowAfterCompaction: once the governor compacted the session, the
// client's longer history still extends it.
func TestFollowAfterCompaction(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64, MaxDepth: 4, CompactTo: 2}, 1)
	h.backend.SetAnswer("a")
	var history []ctxd.Turn
	compacted := false
	for i := range 8 {
		q := "question " + string(rune('a'+i))
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "c", Query: q, History: append([]ctxd.Turn{}, history...)}, noop)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range sum.Governor {
			if a.Kind == ctxd.ActionCompact {
				compacted = true
			}
		}
		if sum.PrefixNote != "" && i > 0 {
			t.Fatalf("turn %d: the session took the client's history after compaction: %q", i+1, sum.PrefixNote)
		}
		history = append(history, ctxd.Turn{Query: q, Answer: "a"})
	}
	if !compacted {
		t.Fatal("the governor never compacted: the test proves nothing")
	}
}

// TestSideRequestsShareTheFloor: an agent's side request (a title, a
// compaction, a memory extraction) carries a system text of its own in a
// session of its own; the prompt it sends shares ctxd's identity, the
// codex and the environment with the main conversation's, so the backend
// evaluates only what follows them.
func TestSideRequestsShareTheFloor(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	main := ctxd.AskRequest{Session: "main", Query: "where is main?", System: "You are a coding agent.", History: []ctxd.Turn{},
		Tools: []ctxd.Tool{{Name: "grep", Parameters: []byte(`{"type":"object"}`)}}, Sigil: "tooler"}
	if _, err := h.o.Ask(t.Context(), main, noop); err != nil {
		t.Fatal(err)
	}
	side := ctxd.AskRequest{Session: "side", Query: "Title this conversation.", System: "You write titles.", History: []ctxd.Turn{}, Sigil: "tooler"}
	if _, err := h.o.Ask(t.Context(), side, noop); err != nil {
		t.Fatal(err)
	}
	p := h.backend.Prompts()
	a, b := p[len(p)-2], p[len(p)-1]
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	floor := strings.Index(a, "### SIGIL ")
	if floor < 0 || !strings.Contains(a[:floor], "### CODEX") || !strings.Contains(a[:floor], "### ENVIRONMENT") {
		t.Fatalf("the prompt's sigil block does not follow the codex and the environment:\n%s", a[:min(400, len(a))])
	}
	if n < floor {
		t.Errorf("the side request's prompt parts from the main one at byte %d, before the sigil block (%d): its system text sits in the shared floor", n, floor)
	}
	if i := strings.Index(a, "### INSTRUCTIONS\nYou are a coding agent."); i < floor || i < strings.Index(a, "grep") {
		t.Errorf("the client's system text does not follow the sigil's tools")
	}
}

// TestRewrittenTurnKeepsItsExcerpts: an agent that resends its first
// message with a reminder taken off its end (Qwen Code on --continue)
// starts a new epoch, but the turns keep the codex excerpts retrieved for
// them, so the prompt is the one before up to the first changed byte; a
// history that is another conversation keeps none of them.
func TestRewrittenTurnKeepsItsExcerpts(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.o.SetCodex(runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: "map of files\n"},
		ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, freshRetriever{}, h.o.Limits())
	h.backend.SetAnswer("the answer")
	ask := func(q string, hist []ctxd.Turn) *ctxd.Summary {
		t.Helper()
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "agent", Query: q, History: hist}, noop)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	first := "how does the reader parse a quoted field? explain it step by step"
	reminder := "\n<reminder>the date is today</reminder>"
	ask(first+reminder, []ctxd.Turn{})
	ask("and the writer?", []ctxd.Turn{{Query: first + reminder, Answer: "the answer"}})
	before := h.lastPrompt()
	sum := ask("and the tests?", []ctxd.Turn{{Query: first, Answer: "the answer"}, {Query: "and the writer?", Answer: "the answer"}})
	if !strings.Contains(sum.PrefixNote, "client's history") {
		t.Fatalf("the rewritten history did not start a new epoch: %q", sum.PrefixNote)
	}
	// The plain format names the epoch in the state's header (a chat
	// template has no such line); the rest must not change.
	after := strings.Replace(h.lastPrompt(), "### CONVERSATION epoch=1\n", "### CONVERSATION epoch=0\n", 1)
	cut := strings.Index(before, reminder)
	if cut < 0 || !strings.HasPrefix(after, before[:cut]) {
		t.Errorf("the new epoch's prompt differs before the reminder that was taken off:\nbefore %q\nafter  %q", before[:min(len(before), cut+40)], after[:min(len(after), cut+40)])
	}
	s, _ := h.store.Session(t.Context(), "agent")
	if len(s.Turns) != 3 || len(s.Turns[0].Excerpts) != 3 || len(s.Turns[1].Excerpts) != 0 {
		t.Errorf("held: %d turns; want 3, the edited first with its 3 excerpts and the second (rewritten after the edit) with none: %+v", len(s.Turns), s.Turns)
	}

	ask("something else", []ctxd.Turn{{Query: "a question of another conversation", Answer: "the answer"}})
	if s, _ := h.store.Session(t.Context(), "agent"); len(s.Turns) != 2 || len(s.Turns[0].Excerpts) != 0 {
		t.Errorf("another conversation's history took excerpts retrieved for this one: %+v", s.Turns[0])
	}
}
