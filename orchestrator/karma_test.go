package orchestrator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// newKarmaTest is a harness whose orchestrator records traces in k and
// chooses karma from it; sigils "reader" and "other" may read karma,
// "blind" may not.
func newKarmaTest(t *testing.T, limits governor.Limits, k *fake.Karma) *harness {
	t.Helper()
	reg, err := sigils.NewRegistry(map[string][]string{
		"reader": {"ask", "karma:read", "karma:write"},
		"other":  {"ask", "karma:read", "karma:write"},
		"blind":  {"ask", "karma:write"},
	}, "reader")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{backend: fake.NewBackend(), env: fake.NewSensor(), store: fake.NewStore(), sched: scheduler.New(scheduler.Options{Slots: 1})}
	h.o, err = New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Limits:   limits, Sigils: reg, TopK: 3,
		Karma: KarmaConfig{Store: k, Model: "fake-model"},
	}, h.backend, tokencount.New(fake.Tokenizer{}, nil), h.store, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func askAs(t *testing.T, h *harness, req ctxd.AskRequest) *ctxd.Summary {
	t.Helper()
	sum, err := h.o.Ask(t.Context(), req, noop)
	if err != nil {
		t.Fatalf("ask %+v: %v", req, err)
	}
	return sum
}

func judge(t *testing.T, k *fake.Karma, trace int64, action, sigil string, other int64) {
	t.Helper()
	if _, err := k.KarmaEvent(context.Background(), ctxd.KarmaEvent{Trace: trace, Action: action, Sigil: sigil, Other: other, At: time.Now()}); err != nil {
		t.Fatalf("%s trace %d: %v", action, trace, err)
	}
}

// karmaSection is the karma block of a prompt.
func karmaSection(prompt string) string {
	i := strings.Index(prompt, "### KARMA")
	j := strings.Index(prompt, "### CONVERSATION")
	if i < 0 || j < i {
		return ""
	}
	return prompt[i:j]
}

// TestKarmaEpochs: every answer is recorded as a trace; a verification
// made mid-session does not change the karma block (the prefix holds)
// until the session's karma epoch ends, here by a refresh, where the new
// karma joins the block and the break is reported with its reason.
func TestKarmaEpochs(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	h.backend.SetAnswer("use make test")
	first := askAs(t, h, ctxd.AskRequest{Session: "s", Query: "how do I run the tests?"})
	if first.Trace == 0 || first.Karma == nil || first.Karma.Epoch != 1 || first.Karma.Began != karmaNewSession || len(first.Karma.Traces) != 0 {
		t.Fatalf("turn 1: trace %d karma %+v", first.Trace, first.Karma)
	}
	tr, _, err := k.Trace(t.Context(), first.Trace)
	if err != nil || tr.Sigil != "reader" || tr.Session != "s" || tr.Answer != "use make test" || tr.Model != "fake-model" || len(tr.Fingerprint) != 64 || tr.Status != ctxd.TraceRecorded {
		t.Fatalf("trace %+v %v", tr, err)
	}
	judge(t, k, first.Trace, ctxd.KarmaVerify, "reader", 0)

	second := askAs(t, h, ctxd.AskRequest{Session: "s", Query: "and the linter?"})
	if second.PrefixBreak != nil || second.Karma.Epoch != 1 || second.Karma.Began != "" || strings.Contains(karmaSection(h.lastPrompt()), "make test") {
		t.Fatalf("turn 2 (verification mid-epoch): break %+v karma %+v block %q", second.PrefixBreak, second.Karma, karmaSection(h.lastPrompt()))
	}
	third := askAs(t, h, ctxd.AskRequest{Session: "s", Query: "again?", RefreshKarma: true})
	if third.Karma.Epoch != 2 || len(third.Karma.Traces) != 1 || third.Karma.Traces[0] != first.Trace {
		t.Fatalf("turn 3 (refresh): karma %+v", third.Karma)
	}
	if third.PrefixBreak == nil || third.PrefixBreak.Block != "karma" || !strings.Contains(third.PrefixBreak.Reason, karmaRefresh) {
		t.Errorf("turn 3: break %+v", third.PrefixBreak)
	}
	if block := karmaSection(h.lastPrompt()); !strings.Contains(block, "Q: how do I run the tests?\nA: use make test") {
		t.Errorf("turn 3 karma block %q", block)
	}
	fourth := askAs(t, h, ctxd.AskRequest{Session: "s", Query: "and now?"})
	if fourth.PrefixBreak != nil || fourth.Karma.Epoch != 2 || fourth.CachedTokens == 0 {
		t.Errorf("turn 4: break %+v karma %+v cached %d", fourth.PrefixBreak, fourth.Karma, fourth.CachedTokens)
	}
	snaps, err := k.KarmaSnapshots(t.Context(), "s")
	if err != nil || len(snaps) != 2 || snaps[0].Reason != karmaNewSession || snaps[1].Reason != karmaRefresh {
		t.Errorf("snapshots %+v %v", snaps, err)
	}
}

// TestKarmaAtCompaction: the governor's compaction begins a new session
// epoch, and with it a karma epoch that takes in verifications since.
func TestKarmaAtCompaction(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64, MaxDepth: 2, CompactTo: 1}, k)
	s1 := askAs(t, h, ctxd.AskRequest{Session: "c", Query: "one"})
	judge(t, k, s1.Trace, ctxd.KarmaVerify, "reader", 0)
	s2 := askAs(t, h, ctxd.AskRequest{Session: "c", Query: "two"})
	if s2.Karma.Epoch != 1 || len(s2.Karma.Traces) != 0 || s2.PrefixBreak != nil {
		t.Fatalf("turn 2: karma %+v break %+v", s2.Karma, s2.PrefixBreak)
	}
	var s3 *ctxd.Summary
	compacted := false
	for turn := 3; !compacted && turn < 6; turn++ {
		s3 = askAs(t, h, ctxd.AskRequest{Session: "c", Query: "more"})
		for _, a := range s3.Governor {
			compacted = compacted || a.Kind == ctxd.ActionCompact
		}
		if !compacted && (s3.Karma.Epoch != 1 || s3.PrefixBreak != nil) {
			t.Fatalf("turn %d before compaction: karma %+v break %+v", turn, s3.Karma, s3.PrefixBreak)
		}
	}
	if !compacted || s3.Karma.Epoch != 2 || !strings.Contains(s3.Karma.Began, "epoch 1") || len(s3.Karma.Traces) != 1 {
		t.Fatalf("compaction: governor %+v karma %+v", s3.Governor, s3.Karma)
	}
}

// TestKarmaIsolation: a sigil's karma block holds its own verified traces
// only, and a sigil without karma:read is shown none.
func TestKarmaIsolation(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	h.backend.SetAnswer("the secret is 42")
	theirs := askAs(t, h, ctxd.AskRequest{Session: "o", Query: "other's question", Sigil: "other"})
	judge(t, k, theirs.Trace, ctxd.KarmaVerify, "other", 0)
	h.backend.SetAnswer("blind answer")
	blind := askAs(t, h, ctxd.AskRequest{Session: "b", Query: "blind question", Sigil: "blind"})
	judge(t, k, blind.Trace, ctxd.KarmaVerify, "blind", 0)

	mine := askAs(t, h, ctxd.AskRequest{Session: "m", Query: "mine"})
	if len(mine.Karma.Traces) != 0 || strings.Contains(h.lastPrompt(), "42") {
		t.Errorf("reader saw another sigil's karma: %+v", mine.Karma)
	}
	again := askAs(t, h, ctxd.AskRequest{Session: "o2", Query: "theirs again", Sigil: "other"})
	if len(again.Karma.Traces) != 1 || !strings.Contains(karmaSection(h.lastPrompt()), "the secret is 42") {
		t.Errorf("other did not see its own karma: %+v", again.Karma)
	}
	b2 := askAs(t, h, ctxd.AskRequest{Session: "b2", Query: "blind again", Sigil: "blind"})
	if b2.Karma != nil || strings.Contains(h.lastPrompt(), "blind answer") {
		t.Errorf("a sigil without karma:read was shown karma: %+v", b2.Karma)
	}
	// Another sigil's id names the asker's own session (ids are per
	// sigil): nothing of other's history or karma reaches it.
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "o2", Query: "reader here"}, noop)
	if err != nil || sum.Turn != 1 || sum.Session != "o2" || strings.Contains(h.lastPrompt(), "theirs again") || strings.Contains(h.lastPrompt(), "the secret is 42") {
		t.Errorf("another sigil's id: %+v, %v; want a first turn of the asker's own session, nothing of other's in it", sum, err)
	}
}

// TestKarmaSupersession: a correction that supersedes a verified trace
// replaces it at the next karma epoch; the superseded one is kept in the
// record, no longer shown.
func TestKarmaSupersession(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	h.backend.SetAnswer("port 8080")
	old := askAs(t, h, ctxd.AskRequest{Session: "p", Query: "which port?"})
	judge(t, k, old.Trace, ctxd.KarmaVerify, "reader", 0)
	h.backend.SetAnswer("port 9090")
	fix := askAs(t, h, ctxd.AskRequest{Session: "p", Query: "which port, really?", RefreshKarma: true})
	if len(fix.Karma.Traces) != 1 || fix.Karma.Traces[0] != old.Trace {
		t.Fatalf("before the correction: %+v", fix.Karma)
	}
	judge(t, k, fix.Trace, ctxd.KarmaVerify, "reader", 0)
	judge(t, k, old.Trace, ctxd.KarmaSupersede, "reader", fix.Trace)
	after := askAs(t, h, ctxd.AskRequest{Session: "p", Query: "port?", RefreshKarma: true})
	block := karmaSection(h.lastPrompt())
	if len(after.Karma.Traces) != 1 || after.Karma.Traces[0] != fix.Trace || strings.Contains(block, "8080") || !strings.Contains(block, "9090") {
		t.Errorf("after the correction: %+v block %q", after.Karma, block)
	}
	tr, events, err := k.Trace(t.Context(), old.Trace)
	if err != nil || tr.SupersededBy != fix.Trace || tr.ValidUntil == nil || len(events) != 2 || tr.Answer != "port 8080" {
		t.Errorf("the superseded trace %+v events %+v %v", tr, events, err)
	}
}

// TestKarmaPrunedByScore: when the window is short the governor leaves
// out the lowest-scoring karma (a new karma epoch); pinned karma stays.
func TestKarmaPrunedByScore(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	roomy := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	var ids []int64
	for i, a := range []string{strings.Repeat("a", 400), strings.Repeat("b", 400), strings.Repeat("c", 400)} {
		roomy.backend.SetAnswer(a)
		s := askAs(t, roomy, ctxd.AskRequest{Session: "fill", Query: "q" + string(rune('0'+i))})
		ids = append(ids, s.Trace)
	}
	for _, id := range ids {
		judge(t, k, id, ctxd.KarmaVerify, "reader", 0)
	}
	judge(t, k, ids[0], ctxd.KarmaPin, "reader", 0) // the oldest: the lowest score but for its pin
	full := askAs(t, roomy, ctxd.AskRequest{Session: "measure", Query: "how big?"})
	if len(full.Karma.Traces) != 3 {
		t.Fatalf("roomy: %+v", full.Karma)
	}
	// A window with room for the prompt less about one and a half entries.
	tight := newKarmaTest(t, governor.Limits{NumCtx: full.PromptTokens + 64 - 600, AnswerReserve: 64}, k)
	sum := askAs(t, tight, ctxd.AskRequest{Session: "tight", Query: "how big?"})
	pruned := 0
	for _, a := range sum.Governor {
		if a.Kind == ctxd.ActionKarma {
			pruned++
		}
	}
	if pruned != 2 || len(sum.Karma.Traces) != 1 || sum.Karma.Traces[0] != ids[0] || !strings.Contains(sum.Karma.Began, "left out karma trace") {
		t.Fatalf("tight: governor %+v karma %+v", sum.Governor, sum.Karma)
	}
	next := askAs(t, tight, ctxd.AskRequest{Session: "tight", Query: "again?"})
	if next.PrefixBreak != nil || next.Karma.Epoch != sum.Karma.Epoch {
		t.Errorf("the turn after pruning: break %+v karma %+v", next.PrefixBreak, next.Karma)
	}
}

// TestKarmaOfADeletedSession: a session deleted and begun again under its
// id begins a karma epoch of its own, taking in the record as it is now
// (a trace rejected since is gone), not the old session's last snapshot.
func TestKarmaOfADeletedSession(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	h.backend.SetAnswer("stale advice")
	first := askAs(t, h, ctxd.AskRequest{Session: "d", Query: "q"})
	judge(t, k, first.Trace, ctxd.KarmaVerify, "reader", 0)
	if s := askAs(t, h, ctxd.AskRequest{Session: "d", Query: "q2", RefreshKarma: true}); len(s.Karma.Traces) != 1 {
		t.Fatalf("refresh: %+v", s.Karma)
	}
	judge(t, k, first.Trace, ctxd.KarmaReject, "reader", 0)
	if err := h.o.DeleteSession(t.Context(), "d"); err != nil {
		t.Fatal(err)
	}
	again := askAs(t, h, ctxd.AskRequest{Session: "d", Query: "q"})
	if again.Karma.Began != karmaNewSession || len(again.Karma.Traces) != 0 || strings.Contains(karmaSection(h.lastPrompt()), "stale advice") {
		t.Errorf("after delete: %+v block %q", again.Karma, karmaSection(h.lastPrompt()))
	}
}

// TestKarmaRefusedRequestStoresNoEpoch: a request refused for its size
// leaves no karma epoch behind that no prompt showed.
func TestKarmaRefusedRequestStoresNoEpoch(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 400, AnswerReserve: 64}, k)
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "big", Query: strings.Repeat("far too long ", 100)}, noop); err == nil {
		t.Fatal("an oversized request was answered")
	}
	if snaps, err := k.KarmaSnapshots(t.Context(), "big"); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots after a refusal: %+v %v", snaps, err)
	}
}
