package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// harness is an orchestrator over fakes.
type harness struct {
	o       *Orchestrator
	backend *fake.Backend
	env     *fake.Sensor
	store   *fake.Store
	sched   *scheduler.Scheduler
}

func newTest(t *testing.T, limits governor.Limits, slots int) *harness {
	t.Helper()
	reg, err := sigils.NewRegistry(map[string][]string{"default": {"ask"}, "mute": {"search_codex"}, "tooler": {"ask", "tool:grep"}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{backend: fake.NewBackend(), env: fake.NewSensor(), store: fake.NewStore(), sched: scheduler.New(scheduler.Options{Slots: slots})}
	h.o, err = New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Limits:   limits, Sigils: reg, TopK: 3,
	}, h.backend, tokencount.New(fake.Tokenizer{}, nil), h.store, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	h.o.SetCodex(runcontext.Codex{Name: "c", Mode: runcontext.ModeCAG, Body: strings.Repeat("codex line\n", 200),
		Files: []runcontext.CodexRef{{Path: "a.txt", Bytes: 2200, SHA256: strings.Repeat("0", 64)}}},
		ctxd.CodexPlan{Mode: runcontext.ModeCAG, Reason: "fits"}, nil, h.o.Limits())
	return h
}

func noop(string) error { return nil }

func (h *harness) ask(t *testing.T, session, query string) *ctxd.Summary {
	t.Helper()
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: query}, noop)
	if err != nil {
		t.Fatalf("ask %q in %s: %v", query, session, err)
	}
	return sum
}

// started waits until a generation whose prompt ends with query starts,
// failing the test after 10 seconds.
func (h *harness) started(t *testing.T, query string) ctxd.GenerateRequest {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-h.backend.Started():
			if strings.HasSuffix(r.Prompt, query+"\n### ASSISTANT\n") {
				return r
			}
		case <-deadline:
			t.Fatalf("no generation of %q started within 10 s", query)
		}
	}
}

// poll waits until cond holds, failing the test after 10 seconds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) lastPrompt() string {
	p := h.backend.Prompts()
	return p[len(p)-1]
}

func TestTurnsReuseThePrefix(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	var streamed strings.Builder
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s1", Query: "first?"}, func(s string) error { streamed.WriteString(s); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if sum.Turn != 1 || sum.CachedTokens != 0 || sum.PrefixNote == "" || streamed.String() != "an answer" {
		t.Fatalf("turn 1 summary %+v streamed %q", sum, streamed.String())
	}
	for turn := 2; turn <= 3; turn++ {
		sum = h.ask(t, "s1", "next?")
		prompts := h.backend.Prompts()
		prev := prompts[len(prompts)-2]
		if sum.CachedTokens != len(prev) || sum.PrefixBreak != nil || sum.Turn != turn {
			t.Fatalf("turn %d: summary %+v, want %d cached tokens and no break", turn, sum, len(prev))
		}
		if sum.ReusePercent < 95 {
			t.Errorf("turn %d reuses %.1f%%", turn, sum.ReusePercent)
		}
		if !strings.HasPrefix(h.lastPrompt(), prev+runcontext.RenderAnswer("an answer")) {
			t.Errorf("turn %d prompt does not extend the previous prompt and answer", turn)
		}
	}

	h.env.SetVRAM("high")
	sum = h.ask(t, "s1", "after a band change")
	if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "environment" {
		t.Errorf("environment change: break %+v", sum.PrefixBreak)
	}
}

func TestSummaryCarriesTheRequestID(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 8192, AnswerReserve: 64}, 1)
	sum, err := h.o.Ask(reqid.With(t.Context(), "req-7"), ctxd.AskRequest{Session: "r", Query: "hello"}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.RequestID != "req-7" {
		t.Errorf("summary's request id %q, want req-7", sum.RequestID)
	}
	if sum.TTFTMillis < sum.Timing.BackendTTFTMs {
		t.Errorf("ttft %.3f ms from arrival is less than the backend's %.3f ms", sum.TTFTMillis, sum.Timing.BackendTTFTMs)
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 3000, AnswerReserve: 64}, 1)
	cases := []struct {
		name string
		req  ctxd.AskRequest
		want ctxd.Kind
	}{
		{"bad session", ctxd.AskRequest{Session: "../etc", Query: "q"}, ctxd.KindInvalid},
		{"empty query", ctxd.AskRequest{Session: "s", Query: "  "}, ctxd.KindInvalid},
		{"unknown sigil", ctxd.AskRequest{Session: "s", Query: "q", Sigil: "root"}, ctxd.KindForbidden},
		{"sigil without ask", ctxd.AskRequest{Session: "s", Query: "q", Sigil: "mute"}, ctxd.KindForbidden},
		{"over the window", ctxd.AskRequest{Session: "s", Query: strings.Repeat("long ", 200)}, ctxd.KindDoesNotFit},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			accepted := false
			c.req.Accepted = func() { accepted = true }
			_, err := h.o.Ask(t.Context(), c.req, noop)
			if got := ctxd.KindOf(err); got != c.want {
				t.Errorf("%v: kind %q, want %q", err, got, c.want)
			}
			if accepted {
				t.Error("a refused request was reported accepted")
			}
		})
	}
	if n := len(h.backend.Requests()); n != 0 {
		t.Errorf("%d refused requests reached the backend", n)
	}
	// One that fits is accepted before the backend sees it.
	var atAccept int
	req := ctxd.AskRequest{Session: "s", Query: "q", Accepted: func() { atAccept = len(h.backend.Requests()) + 1 }}
	if _, err := h.o.Ask(t.Context(), req, noop); err != nil || atAccept != 1 {
		t.Errorf("a request that fits: accepted with %d requests at the backend (want 0), err %v", atAccept-1, err)
	}
}

// TestFailedGenerationKeepsWhatTheSlotHolds: a backend error before any
// token leaves the slot with at least the prefix it shared with the old
// content, so the next turn still expects that much, not nothing.
func TestFailedGenerationKeepsWhatTheSlotHolds(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	first := h.ask(t, "s", "q")
	h.backend.FailNext(fake.ErrScripted)
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q2"}, noop); !errors.Is(err, fake.ErrScripted) {
		t.Fatalf("backend failure reported as %v", err)
	}
	sum := h.ask(t, "s", "q3")
	if sum.Turn != 2 || sum.CachedTokens != first.PromptTokens {
		t.Errorf("after a failure: turn %d with %d cached, want turn 2 with the first prompt's %d", sum.Turn, sum.CachedTokens, first.PromptTokens)
	}
}

// TestCancelledAnswerStopsTheBackend: a client that goes away mid-answer
// stops the generation, nothing is recorded, and the slot is known to hold
// the prompt that was evaluated.
func TestCancelledAnswerStopsTheBackend(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.backend.Hold()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	first := make(chan struct{})
	streamed := sync.OnceFunc(func() { close(first) })
	go func() {
		_, err := h.o.Ask(ctx, ctxd.AskRequest{Session: "s", Query: "long answer please"}, func(string) error { streamed(); return nil })
		done <- err
	}()
	req := h.started(t, "long answer please")
	// The client goes away mid-answer: once its first piece arrived (the
	// held backend streams one, then waits), so the prompt was evaluated.
	<-first
	cancel()
	err := <-done
	// Whether a piece streamed before the cancel depends on timing: either
	// way the error says nothing of the answer was recorded.
	if msg := err.Error(); ctxd.KindOf(err) != ctxd.KindCanceled || !strings.Contains(msg, "nothing was recorded") && !strings.Contains(msg, "partial answer was not recorded") {
		t.Fatalf("cancelled answer: %v (kind %q)", err, ctxd.KindOf(err))
	}
	if h.backend.Stopped() != 1 {
		t.Errorf("backend stopped %d generations, want 1", h.backend.Stopped())
	}
	h.backend.Release()
	if s, _ := h.store.Session(t.Context(), "s"); s.Count != 0 {
		t.Errorf("a cancelled answer was recorded: %+v", s)
	}
	// The same question again: the slot holds its whole prompt.
	sum := h.ask(t, "s", "long answer please")
	if sum.Turn != 1 || sum.CachedTokens != len(req.Prompt) {
		t.Errorf("after the cancel: turn %d, %d cached, want turn 1 with %d cached", sum.Turn, sum.CachedTokens, len(req.Prompt))
	}
}

// TestCancelledWhileWaitingIsNeverSent reproduces a request whose client
// went away while it waited for the backend's only slot.
func TestCancelledWhileWaitingIsNeverSent(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.backend.Hold()
	first := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "a", Query: "first"}, noop)
		first <- err
	}()
	h.started(t, "first")
	ctx, cancel := context.WithCancel(t.Context())
	waiting := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(ctx, ctxd.AskRequest{Session: "b", Query: "never sent"}, noop)
		waiting <- err
	}()
	poll(t, "the second request never waited for the slot", func() bool { return len(h.sched.Status().Waiting) > 0 })
	cancel()
	if err := <-waiting; ctxd.KindOf(err) != ctxd.KindCanceled || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("cancelled waiter: %v", err)
	}
	if st := h.sched.Status(); len(st.Waiting) != 0 {
		t.Errorf("the cancelled request is still queued: %+v", st)
	}
	h.backend.Release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for _, p := range h.backend.Prompts() {
		if strings.Contains(p, "never sent") {
			t.Fatal("a request cancelled while waiting reached the backend")
		}
	}
}

// TestReadsNeverWaitForAGeneration: while an answer is held at the
// backend, the status, prompt and session reads answer, and a delete of
// that session waits for the answer to be recorded, then forgets it.
func TestReadsNeverWaitForAGeneration(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.ask(t, "s", "recorded")
	h.backend.Hold()
	done := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "held"}, noop)
		done <- err
	}()
	h.started(t, "held")
	if h.o.LastSummary() == nil {
		t.Error("no last summary while a request runs")
	}
	if _, _, ok := h.o.LastPrompt("s"); !ok {
		t.Error("no last prompt while a request runs")
	}
	if s, err := h.store.Session(t.Context(), "s"); err != nil || s.Count != 1 {
		t.Errorf("session read while a request runs: %+v %v", s, err)
	}
	if list, err := h.store.Sessions(t.Context()); err != nil || len(list) != 1 {
		t.Errorf("session list while a request runs: %+v %v", list, err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- h.o.DeleteSession(t.Context(), "s") }()
	poll(t, "the delete never waited for the session", func() bool { return h.sched.Status().InSessions > 0 })
	select {
	case err := <-deleted:
		t.Fatalf("delete did not wait for the running answer: %v", err)
	default:
	}
	h.backend.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if s, _ := h.store.Session(t.Context(), "s"); s.Count != 0 {
		t.Errorf("deleted session still stored: %+v", s)
	}
	if sum := h.ask(t, "s", "new start"); sum.Turn != 1 || sum.PrefixNote != "first turn of the session" {
		t.Errorf("after delete: turn %d, note %q", sum.Turn, sum.PrefixNote)
	}
}

// overlapBackend holds each generation until n run at once, and lets
// every later one through: if they do not overlap within 10 seconds, the
// one that waited fails and the others run through. It records the most
// generations that ran at once.
type overlapBackend struct {
	*fake.Backend
	n          int
	mu         sync.Mutex
	running    int
	maxRunning int
	overlapped chan struct{} // closed once n ran at once
}

func newOverlapBackend(n int) *overlapBackend {
	return &overlapBackend{Backend: fake.NewBackend(), n: n, overlapped: make(chan struct{})}
}

func (b *overlapBackend) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	b.mu.Lock()
	b.running++
	b.maxRunning = max(b.maxRunning, b.running)
	if b.running == b.n {
		b.openLocked()
	}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.running--
		b.mu.Unlock()
	}()
	select {
	case <-b.overlapped:
	case <-ctx.Done():
		return ctxd.Generation{}, ctx.Err()
	case <-time.After(10 * time.Second):
		b.mu.Lock()
		b.openLocked()
		b.mu.Unlock()
		return ctxd.Generation{}, fmt.Errorf("overlap backend: %d generations never ran at once", b.n)
	}
	return b.Backend.Generate(ctx, req, onToken)
}

func (b *overlapBackend) openLocked() {
	select {
	case <-b.overlapped:
	default:
		close(b.overlapped)
	}
}

func (b *overlapBackend) most() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.maxRunning
}

// TestSessionsRunConcurrentlyOnSlots: 8 sessions × 3 turns on 2 slots:
// generations do run 2 at once (the backend holds the first until the
// second arrives), never more, and every answer is recorded in order.
func TestSessionsRunConcurrentlyOnSlots(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 2)
	backend := newOverlapBackend(2)
	var err error
	h.o, err = New(h.o.cfg, backend, h.o.count, h.store, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turn := 1; turn <= 3; turn++ {
				sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: fmt.Sprint("agent-", i), Query: fmt.Sprint("q", turn)}, noop)
				if err != nil {
					t.Error(err)
					return
				}
				if sum.Turn != turn || sum.Slot < 0 || sum.Slot > 1 {
					t.Errorf("agent %d turn %d: %+v", i, turn, sum)
				}
			}
		}()
	}
	wg.Wait()
	if m := backend.most(); m != 2 {
		t.Errorf("at most %d generations ran at once on 2 slots; want 2", m)
	}
	list, _ := h.store.Sessions(t.Context())
	for _, s := range list {
		if s.Turns != 3 {
			t.Errorf("session %s has %d turns, want 3", s.ID, s.Turns)
		}
	}
	if len(list) != 8 {
		t.Errorf("%d sessions recorded, want 8", len(list))
	}
}

func TestUnrecordedAnswerIsAnError(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.store.FailNextWrite(errors.New("disk full"))
	_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q"}, noop)
	if ctxd.KindOf(err) != ctxd.KindNotRecorded || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("unrecorded answer: %v", err)
	}
	if sum := h.ask(t, "s", "q"); sum.Turn != 1 {
		t.Errorf("after a failed record the session has %d turns before this one", sum.Turn-1)
	}
}

func TestIncompleteAnswerIsKeptAndMarked(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.backend.SetIncomplete(true)
	sum := h.ask(t, "s", "q")
	if sum.DoneReason != ctxd.DoneIncomplete || !strings.Contains(sum.DoneNote, "without its final message") || sum.AnswerTokens != len("an answer") {
		t.Errorf("incomplete answer summary: done %q, note %q, %d answer tokens", sum.DoneReason, sum.DoneNote, sum.AnswerTokens)
	}
	h.backend.SetIncomplete(false)
	next := h.ask(t, "s", "q2")
	// The partial answer is part of the conversation the backend holds.
	if next.Turn != 2 || next.CachedTokens != sum.PromptTokens || !strings.Contains(h.lastPrompt(), "an answer") || next.DoneNote != "" {
		t.Errorf("turn after an incomplete answer: %+v", next)
	}
}

func TestDepthCompactsInEpochsAndKeepsPinned(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64, MaxDepth: 4}, 1)
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "remember: the key is 42", Pin: true}, noop); err != nil {
		t.Fatal(err)
	}
	var sum *ctxd.Summary
	for i := 2; i <= 6; i++ {
		sum = h.ask(t, "s", fmt.Sprint("filler ", i))
		if i <= 5 && len(sum.Governor) != 0 {
			t.Fatalf("turn %d compacted early: %+v", i, sum.Governor)
		}
	}
	// Turn 6 saw 5 turns of history > max_depth 4: cut to 2 in one step.
	if len(sum.Governor) != 1 || sum.Governor[0].Kind != ctxd.ActionCompact || sum.Governor[0].TurnsDropped != 3 || sum.Epoch != 1 {
		t.Fatalf("turn 6 governor %+v epoch %d", sum.Governor, sum.Epoch)
	}
	if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "state" {
		t.Errorf("compaction not reported as a state break: %+v", sum.PrefixBreak)
	}
	last := h.lastPrompt()
	if !strings.Contains(last, "the key is 42") || strings.Contains(last, "filler 2\n") || !strings.Contains(last, "filler 5") {
		t.Errorf("after compaction the prompt should keep the pinned turn and the newest, not the oldest filler:\n%s", last[len(last)-400:])
	}
	// The next turn extends the compacted prompt again.
	if sum = h.ask(t, "s", "next"); sum.PrefixBreak != nil || len(sum.Governor) != 0 {
		t.Errorf("turn after compaction: %+v", sum)
	}
}

func TestCondenseWhenTheWindowIsExceeded(t *testing.T) {
	t.Parallel()
	// Byte tokens: the stable blocks are ~2.4k, each turn ~60; the window
	// holds the stable blocks and a few turns only.
	h := newTest(t, governor.Limits{NumCtx: 2850, AnswerReserve: 64}, 1)
	var sum *ctxd.Summary
	var err error
	for i := range 8 {
		sum, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "c", Query: fmt.Sprintf("question number %d, padded a little", i), Pin: i == 0}, noop)
		if err != nil {
			t.Fatalf("turn %d: %v", i+1, err)
		}
		if len(sum.Governor) > 0 {
			break
		}
	}
	if len(sum.Governor) == 0 || sum.Governor[len(sum.Governor)-1].Kind != ctxd.ActionCondense {
		t.Fatalf("no condensation within 8 turns: %+v", sum)
	}
	if sum.PromptTokens > 2850-64 {
		t.Errorf("condensed prompt %d tokens still over the budget", sum.PromptTokens)
	}
	// The condensation is part of the governor's time, which is part of
	// the time to first token; the parts add up to it.
	tm := sum.Timing
	if tm.CondenseMs <= 0 || tm.GovernorMs < tm.CondenseMs {
		t.Errorf("condensation not counted in the governor's time: %+v", tm)
	}
	if parts := tm.QueueWaitMs + tm.GovernorMs + tm.RestoreMs + tm.BackendTTFTMs + tm.OtherMs; math.Abs(parts-sum.TTFTMillis) > 0.01 || sum.TTFTMillis < tm.GovernorMs {
		t.Errorf("ttft %.3f ms is not the sum of its parts %+v (%.3f)", sum.TTFTMillis, tm, parts)
	}
	prompts := h.backend.Prompts()
	last, condensePrompt := prompts[len(prompts)-1], prompts[len(prompts)-2]
	if !strings.Contains(condensePrompt, condenseInstruction) {
		t.Errorf("the backend was not asked to condense:\n%s", condensePrompt)
	}
	if !strings.Contains(last, "[summary of earlier turns]\nan answer\n") || !strings.Contains(last, "question number 0") {
		t.Errorf("the condensed prompt should hold the summary and the pinned turn:\n%s", last[len(last)-600:])
	}

	// A query that cannot fit even with no history is refused with numbers.
	_, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "c", Query: strings.Repeat("z", 3000)}, noop)
	var le *governor.LimitError
	if !errors.As(err, &le) || le.Needed <= le.Allowed || !strings.Contains(err.Error(), "query=") {
		t.Errorf("oversized query: %v", err)
	}
}

type fakeRetriever struct {
	mu      sync.Mutex
	queries []string
}

func (f *fakeRetriever) Search(_ context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	f.mu.Lock()
	f.queries = append(f.queries, q)
	f.mu.Unlock()
	var out []ctxd.Excerpt
	for i := range k {
		out = append(out, ctxd.Excerpt{Path: fmt.Sprintf("pkg/f%d.go", i), Lines: "1-9", Text: strings.Repeat("excerpt text ", 20)})
	}
	return out, nil
}

func TestRAGPutsExcerptsInTheVolatileTail(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	r := &fakeRetriever{}
	h.o.SetCodex(runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: "map of files\n"},
		ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, r, h.o.Limits())
	sum := h.ask(t, "r", "where is f1?")
	if sum.Excerpts != 3 || sum.Codex.Mode != "rag" || len(r.queries) != 1 {
		t.Fatalf("summary %+v, queries %v", sum, r.queries)
	}
	p := h.lastPrompt()
	conv := strings.Index(p, "### CONVERSATION")
	first := strings.Index(p, "[excerpt \"pkg/f0.go\" lines 1-9]")
	if first < conv || !strings.Contains(p[first:], "where is f1?") {
		t.Errorf("excerpts must sit next to the query, after the stable blocks:\n%s", p)
	}
	if strings.Contains(p, "tool: search_codex") {
		t.Error("search_codex offered to a sigil without the scope")
	}
	// The next turn keeps the excerpts in the history, so it extends the prefix.
	if sum = h.ask(t, "r", "and f2?"); sum.PrefixBreak != nil {
		t.Errorf("second RAG turn broke the prefix: %+v", sum.PrefixBreak)
	}
}

// fakeSlotStore records saves and restores; restore returns what save
// stored, or fails for names it never saved.
type fakeSlotStore struct {
	mu       sync.Mutex
	saved    map[string]int
	restores int
	fail     bool
}

func (f *fakeSlotStore) SaveSlot(_ context.Context, slot int, name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saved[name] = 1 << 20 // "everything the slot held"
	return f.saved[name], nil
}

func (f *fakeSlotStore) RestoreSlot(_ context.Context, slot int, name string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.restores++
	n, ok := f.saved[name]
	if !ok || f.fail {
		return 0, errors.New("fake: no such file")
	}
	return n, nil
}

// TestWarmRestartRestoresTheSavedPrefix: the first request on a stable
// prefix saves its slot; after the backend restarts (the scheduler forgets
// every slot), the next request gets the prefix restored, not evaluated;
// a failed restore falls back to evaluating.
func TestWarmRestartRestoresTheSavedPrefix(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	store := &fakeSlotStore{saved: map[string]int{}}
	var err error
	h.o, err = New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Limits:   governor.Limits{NumCtx: 100000, AnswerReserve: 64}, Sigils: h.o.cfg.Sigils,
		Warm: &WarmConfig{Store: store, Model: "m"},
	}, h.backend, tokencount.New(fake.Tokenizer{}, nil), h.store, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	first := h.ask(t, "s", "q1")
	if len(store.saved) != 1 || first.CachedTokens != 0 {
		t.Fatalf("after the first request: %d saved slots, %d cached", len(store.saved), first.CachedTokens)
	}
	stable := first.Budget.Blocks[0].Tokens + first.Budget.Blocks[1].Tokens + first.Budget.Blocks[2].Tokens + first.Budget.Blocks[3].Tokens + first.Budget.Blocks[4].Tokens
	h.sched.Forget() // the backend restarted
	sum := h.ask(t, "s", "q2")
	if store.restores != 1 || sum.CachedTokens != stable {
		t.Errorf("after a restart: %d restores, %d cached, want the stable prefix's %d restored", store.restores, sum.CachedTokens, stable)
	}
	if len(store.saved) != 1 {
		t.Errorf("the same prefix was saved again: %d files", len(store.saved))
	}
	h.sched.Forget()
	store.fail = true
	if sum = h.ask(t, "s", "q3"); sum.CachedTokens != 0 {
		t.Errorf("after a failed restore ctxd expects %d cached tokens, want 0", sum.CachedTokens)
	}
}

// freshRetriever finds excerpts of their own for every question.
type freshRetriever struct{}

func (freshRetriever) Search(_ context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	var out []ctxd.Excerpt
	for i := range k {
		out = append(out, ctxd.Excerpt{Path: fmt.Sprintf("%s/f%d.go", strings.Fields(q)[0], i), Lines: "1-9", Text: strings.Repeat("excerpt text ", 18)})
	}
	return out, nil
}

// TestStaleExcerptsGoBeforeFreshOnes: when the history's excerpts of
// earlier questions fill the window, they are left out of it (a new epoch)
// and the new question keeps all of its own: the newest turns' first, as
// few as make room (this retriever keeps nothing in a working set), so the
// first turns keep theirs and the prompt stays the same up to the first
// turn that lost them.
func TestStaleExcerptsGoBeforeFreshOnes(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 3200, AnswerReserve: 64, MaxDepth: 100, CompactTo: 50}, 1)
	h.o.SetCodex(runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: "map of files\n"},
		ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, freshRetriever{}, h.o.Limits())
	staled := 0
	var before ctxd.Session
	for i := range 8 {
		held, _ := h.store.Session(t.Context(), "s")
		sum := h.ask(t, "s", fmt.Sprintf("q%d what is here?", i))
		if sum.Excerpts != 3 {
			t.Errorf("turn %d: %d excerpts, want all 3 (actions %+v)", i+1, sum.Excerpts, sum.Governor)
		}
		for _, a := range sum.Governor {
			switch a.Kind {
			case ctxd.ActionStale:
				staled++
				before = held
				if !strings.Contains(a.Reason, "the newest first and as few as make room") {
					t.Errorf("turn %d: stale excerpts left out: %s; want the newest turns' first", i+1, a.Reason)
				}
			case ctxd.ActionExcerpts, ctxd.ActionCondense:
				t.Errorf("turn %d: %s before the stale excerpts went: %s", i+1, a.Kind, a.Reason)
			}
		}
	}
	if staled == 0 {
		t.Fatal("the history's excerpts were never left out: the window never filled, the test proves nothing")
	}
	sess, _ := h.store.Session(t.Context(), "s")
	if len(sess.Turns) < 3 || len(sess.Turns[0].Excerpts) != 3 || len(sess.Turns[len(sess.Turns)-1].Excerpts) != 3 {
		t.Fatalf("history after: %d turns, first with %d excerpts (want its 3 kept), last with %d", len(sess.Turns), len(sess.Turns[0].Excerpts), len(sess.Turns[len(sess.Turns)-1].Excerpts))
	}
	// The last drop left out the excerpts of the newest turns it held:
	// every turn before the first it stripped is as it was.
	first := -1
	for i, t := range sess.Turns[:len(before.Turns)] {
		if len(t.Excerpts) == 0 && len(before.Turns[i].Excerpts) > 0 {
			first = i
			break
		}
	}
	if first < 1 {
		t.Fatalf("the last drop stripped turn %d first (want a later turn than the first): %d turns held", first+1, len(before.Turns))
	}
	for i := first; i < len(before.Turns); i++ {
		if len(before.Turns[i].Excerpts) > 0 && len(sess.Turns[i].Excerpts) > 0 {
			t.Errorf("turn %d kept its excerpts after turn %d lost them: the newest go first", i+1, first+1)
		}
	}
}

// TestEphemeralAsk: a question outside any conversation (a door's text
// completion) is answered after the stable blocks with no history, and
// nothing is recorded: the session it names, which holds a conversation,
// is left as it was, and no session is created.
func TestEphemeralAsk(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	h.backend.SetAnswer("the first answer")
	h.ask(t, "conv", "the first question")
	before, _ := h.store.Session(t.Context(), "conv")

	h.backend.SetAnswer("a completion")
	for _, session := range []string{"conv", "fresh"} {
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: "complete this", Ephemeral: true,
			History: []ctxd.Turn{{Query: "a history the door never sends", Answer: "x"}}}, noop)
		if err != nil {
			t.Fatal(err)
		}
		p := h.lastPrompt()
		if strings.Contains(p, "the first question") || strings.Contains(p, "a history the door never sends") || !strings.Contains(p, "complete this") {
			t.Errorf("%s: the ephemeral prompt holds a history:\n%s", session, p)
		}
		if sum.Turn != 1 || sum.CachedTokens == 0 || !strings.Contains(sum.PrefixNote, "nothing is recorded") {
			t.Errorf("%s: summary turn %d cached %d note %q", session, sum.Turn, sum.CachedTokens, sum.PrefixNote)
		}
	}
	after, _ := h.store.Session(t.Context(), "conv")
	if after.Count != before.Count || after.Epoch != before.Epoch || len(after.Turns) != 1 {
		t.Errorf("the named session changed: before %+v after %+v", before, after)
	}
	if s, _ := h.store.Session(t.Context(), "fresh"); s.Count != 0 {
		t.Errorf("an ephemeral ask was recorded: %+v", s)
	}
	// The conversation goes on where it was.
	if sum := h.ask(t, "conv", "the second question"); sum.Turn != 2 || sum.PrefixBreak != nil {
		t.Errorf("the conversation after: turn %d break %+v", sum.Turn, sum.PrefixBreak)
	}
}

// TestAnswerCap: a client's cap on the answer under the reserve is what
// the backend is asked for; a larger one (or none) is the reserve; a
// negative one is refused.
func TestAnswerCap(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	for _, c := range []struct{ asked, want int }{{0, 64}, {9, 9}, {64, 64}, {1000, 64}} {
		if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q", MaxTokens: c.asked}, noop); err != nil {
			t.Fatal(err)
		}
		reqs := h.backend.Requests()
		if got := reqs[len(reqs)-1].MaxTokens; got != c.want {
			t.Errorf("max_tokens %d: the backend was asked for %d; want %d", c.asked, got, c.want)
		}
	}
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q", MaxTokens: -1}, noop); ctxd.KindOf(err) != ctxd.KindInvalid {
		t.Errorf("a negative cap: %v", err)
	}
}

// absorbingSet is a working set (over freshRetriever) that keeps, at an
// epoch, the first excerpt it is handed: its block names what it keeps.
type absorbingSet struct {
	freshRetriever
	mu     sync.Mutex
	kept   []ctxd.Excerpt
	calls  [][]ctxd.Excerpt
	budget []int
}

func (a *absorbingSet) block() runcontext.Codex {
	body := "map of files\n"
	for _, e := range a.kept {
		body += "kept " + e.Path + " " + e.Lines + "\n"
	}
	return runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: body}
}

func (a *absorbingSet) holds(e ctxd.Excerpt) bool { return slices.Contains(a.kept, e) }

func (a *absorbingSet) Retrieve(ctx context.Context, q string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ex, _ := a.Search(ctx, q, k)
	out := slices.DeleteFunc(ex, a.holds)
	return a.block(), out, ctxd.WorkingSet{Generation: 1, Hits: k - len(out)}, nil
}

func (a *absorbingSet) Peek(ctx context.Context, q string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error) {
	return a.Retrieve(ctx, q, k)
}

func (a *absorbingSet) Absorb(_ context.Context, ex []ctxd.Excerpt, budget int) (runcontext.Codex, func(ctxd.Excerpt) bool, ctxd.WorkingSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls, a.budget = append(a.calls, ex), append(a.budget, budget)
	a.kept = append(a.kept, ex[0])
	kept := slices.Clone(a.kept)
	return a.block(), func(e ctxd.Excerpt) bool { return slices.Contains(kept, e) }, ctxd.WorkingSet{Generation: len(a.calls) + 1, Moved: "grew", Added: 1}, nil
}

// TestTheWorkingSetAbsorbsAtTheEpoch: when the history's excerpts are left
// out (an epoch), the working set is handed this question's excerpts
// first, then the history's, newest turn first, with at most half of what
// the history frees; what it keeps leaves the query, and the turn says so.
func TestTheWorkingSetAbsorbsAtTheEpoch(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 3200, AnswerReserve: 64, MaxDepth: 100, CompactTo: 50}, 1)
	set := &absorbingSet{}
	h.o.SetCodex(set.block(), ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, set, h.o.Limits())
	var epoch *ctxd.Summary
	for i := range 8 {
		sum := h.ask(t, "s", fmt.Sprintf("q%d what is here?", i))
		for _, a := range sum.Governor {
			if a.Kind == ctxd.ActionStale && epoch == nil {
				epoch = sum
				if !strings.Contains(a.Reason, "the codex working set keeps 1 of them") {
					t.Errorf("the epoch's action does not say what the working set kept: %q", a.Reason)
				}
			}
		}
		if epoch != nil {
			break
		}
	}
	if epoch == nil {
		t.Fatal("the history's excerpts were never left out: the window never filled, the test proves nothing")
	}
	if len(set.calls) != 1 {
		t.Fatalf("absorb was called %d times", len(set.calls))
	}
	got, q := set.calls[0], epoch.Turn-1
	if got[0].Path != fmt.Sprintf("q%d/f0.go", q) || got[3].Path != fmt.Sprintf("q%d/f0.go", q-1) || got[len(got)-1].Path != "q0/f2.go" {
		t.Errorf("absorb was handed %d excerpts, %s first, %s fourth, %s last; want the question's, then the history's newest first", len(got), got[0].Path, got[3].Path, got[len(got)-1].Path)
	}
	if set.budget[0] <= 0 {
		t.Errorf("absorb's budget %d", set.budget[0])
	}
	p := h.lastPrompt()
	if !strings.Contains(p, fmt.Sprintf("kept q%d/f0.go", q)) || epoch.Excerpts != 2 || epoch.WorkingSet == nil || epoch.WorkingSet.Added != 1 ||
		!strings.Contains(epoch.WorkingSet.Moved, "grew") {
		t.Errorf("the epoch's prompt and summary: %d excerpts in the query, working set %+v", epoch.Excerpts, epoch.WorkingSet)
	}
}

// TestNoAbsorbBeforeLargeClientBlocks: a client whose own system text
// (or tools) between the codex and the conversation outweighs what the
// working set would keep gets the epoch alone: growing the codex block
// would have the backend evaluate that text again too.
func TestNoAbsorbBeforeLargeClientBlocks(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 3200, AnswerReserve: 64, MaxDepth: 100, CompactTo: 50}, 1)
	set := &absorbingSet{}
	h.o.SetCodex(set.block(), ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}, set, h.o.Limits())
	system := strings.Repeat("Follow the house rules. ", 40)
	epochs := 0
	for i := range 10 {
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: fmt.Sprintf("q%d what is here?", i), System: system}, noop)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range sum.Governor {
			if a.Kind == ctxd.ActionStale {
				epochs++
				if strings.Contains(a.Reason, "working set keeps") {
					t.Errorf("turn %d: the working set kept excerpts before the client's large system text: %q", i+1, a.Reason)
				}
			}
		}
	}
	if epochs == 0 {
		t.Fatal("the history's excerpts were never left out: the window never filled, the test proves nothing")
	}
	if len(set.calls) != 0 {
		t.Errorf("absorb was called %d times", len(set.calls))
	}
}
