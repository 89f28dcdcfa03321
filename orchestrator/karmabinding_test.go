package orchestrator

import (
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

func codexOf(mode string, files map[string]string) *codexState {
	var refs []runcontext.CodexRef
	for p, sum := range files {
		refs = append(refs, runcontext.CodexRef{Path: p, SHA256: sum})
	}
	slices.SortFunc(refs, func(a, b runcontext.CodexRef) int { return strings.Compare(a.Path, b.Path) })
	c := runcontext.Codex{Name: "c", Mode: mode, Files: refs}
	return &codexState{block: c, fingerprint: codexFingerprint(c)}
}

func TestCitedFiles(t *testing.T) {
	refs := []runcontext.CodexRef{{Path: "csv/reader.go"}, {Path: "csv/writer.go"}, {Path: "json/reader.go"}, {Path: "a.go"}, {Path: "README"}}
	got := cited("See csv/writer.go and data.go; the reader.go files differ. README explains.", refs)
	// csv/writer.go and README by path; a.go is inside data.go (not a
	// name of its own); reader.go is two files' base name.
	if want := []string{"csv/writer.go", "README"}; !slices.Equal(got, want) {
		t.Errorf("cited %v, want %v", got, want)
	}
	if got := cited("the writer.go file", refs); !slices.Equal(got, []string{"csv/writer.go"}) {
		t.Errorf("by a unique base name: %v", got)
	}
}

// TestStaleTraceLeavesTheKarmaBlock: at the next karma epoch a verified
// trace whose file changed is left out; one whose files did not change
// stays; verified again against the current code, the first comes back.
func TestStaleTraceLeavesTheKarmaBlock(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	ctx := t.Context()
	sum := func(c string) string { return strings.Repeat(c, 64) }
	store := fake.NewKarma()
	k := newKarmaBook(KarmaConfig{Store: store}, storeDeadline{timeout: time.Second}, func() time.Time { return t0 }, slog.New(slog.DiscardHandler))
	v1 := codexOf(runcontext.ModeRAG, map[string]string{"a.go": sum("a"), "b.go": sum("b")})
	ws := &ctxd.WorkingSet{Held: []string{"b.go"}}
	rcA := &runcontext.RunContext{Codex: v1.block, Sigil: runcontext.Sigil{Name: "dev"}}
	bindA := bindingOf(rcA, "It is in a.go.", v1, nil)
	bindB := bindingOf(rcA, "From the working set.", v1, ws)
	if len(bindA.Files) != 1 || !bindA.Files[0].Cited || len(bindB.Files) != 1 || bindB.Files[0].Path != "b.go" || bindA.Whole {
		t.Fatalf("bindings %+v and %+v", bindA, bindB)
	}
	for _, b := range []ctxd.TraceBinding{bindA, bindB} {
		id, err := store.RecordTrace(ctx, ctxd.Trace{Session: "old", Sigil: "dev", Query: "q", Answer: "a", Codex: v1.fingerprint, CreatedAt: t0, Binding: b})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: t0}); err != nil {
			t.Fatal(err)
		}
	}
	sigil := runcontext.Sigil{Name: "dev", Scopes: []string{sigils.ScopeKarmaRead}}
	traces := func(c *codexState) []int64 {
		t.Helper()
		snap, chosen, err := k.choose(ctx, ctxd.AskRequest{Session: "s" + c.fingerprint[:6]}, sigil, 0, true, false, c)
		if err != nil || !chosen {
			t.Fatalf("choose: %v, %v", chosen, err)
		}
		var ids []int64
		for _, e := range snap.Entries {
			ids = append(ids, e.Trace)
		}
		slices.Sort(ids)
		return ids
	}
	if got := traces(v1); !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("on the code they were verified against: %v, want both", got)
	}
	v2 := codexOf(runcontext.ModeRAG, map[string]string{"a.go": sum("c"), "b.go": sum("b")})
	if got := traces(v2); !slices.Equal(got, []int64{2}) {
		t.Errorf("after a.go changed: %v, want only trace 2", got)
	}
	rcA2 := &runcontext.RunContext{Codex: v2.block, Sigil: runcontext.Sigil{Name: "dev"}}
	rebound := bindingOf(rcA2, "It is in a.go.", v2, nil)
	if _, err := store.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaVerify, At: t0.Add(time.Hour), Binding: &rebound}); err != nil {
		t.Fatal(err)
	}
	if got := traces(v2); !slices.Equal(got, []int64{1, 2}) {
		t.Errorf("after verifying trace 1 again: %v, want both", got)
	}
}

// TestARequestInFlightKeepsItsCodex: a codex reload while an answer is
// being generated changes nothing of that request (its trace holds for the
// codex it was answered from); the next request takes the new codex.
func TestARequestInFlightKeepsItsCodex(t *testing.T) {
	t.Parallel()
	k := fake.NewKarma()
	h := newKarmaTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, k)
	lim := h.o.Limits()
	v1 := runcontext.Codex{Name: "c", Mode: runcontext.ModeCAG, Files: []runcontext.CodexRef{{Path: "a.go", SHA256: strings.Repeat("a", 64)}},
		Body: "~~~ file \"a.go\"\npackage a // version one\n~~~\n"}
	v2 := v1
	v2.Files = []runcontext.CodexRef{{Path: "a.go", SHA256: strings.Repeat("b", 64)}}
	v2.Body = "~~~ file \"a.go\"\npackage a // version two\n~~~\n"
	h.o.SetCodex(v1, ctxd.CodexPlan{Mode: runcontext.ModeCAG}, nil, lim)
	h.backend.Hold()
	done := make(chan *ctxd.Summary, 1)
	go func() {
		sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "what is a?"}, noop)
		if err != nil {
			t.Error(err)
		}
		done <- sum
	}()
	req := h.started(t, "what is a?")
	h.o.SetCodex(v2, ctxd.CodexPlan{Mode: runcontext.ModeCAG}, nil, lim) // the watcher's reload, mid-answer
	h.backend.Release()
	sum := <-done
	if !strings.Contains(req.Prompt, "version one") || strings.Contains(req.Prompt, "version two") {
		t.Fatalf("the request in flight was sent with the wrong codex:\n%s", req.Prompt)
	}
	tr, _, err := k.Trace(t.Context(), sum.Trace)
	if err != nil || tr.Codex != codexFingerprint(v1) || tr.Binding.Codex != codexFingerprint(v1) || !tr.Binding.Whole {
		t.Errorf("its trace %+v (%v): want it bound to the codex it was answered from", tr, err)
	}
	next := h.ask(t, "s", "and now?")
	if p := h.backend.Prompts(); !strings.Contains(p[len(p)-1], "version two") || next.PrefixBreak == nil || next.PrefixBreak.Block != "codex" ||
		!strings.Contains(next.PrefixBreak.Reason, "1 changed (a.go)") {
		t.Errorf("the next request: break %+v; want the new codex, the break naming a.go", next.PrefixBreak)
	}
}
