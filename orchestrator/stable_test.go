package orchestrator

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// TestStableBlocksAreWhatARequestSends: the stable blocks the codex plan
// weighs are, byte for byte, the identity, codex, environment and sigil
// blocks a request of the default sigil sends, in CAG and in RAG mode
// (where the sigil block offers the search_codex tool).
func TestStableBlocksAreWhatARequestSends(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{runcontext.ModeCAG, runcontext.ModeRAG} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			reg, err := sigils.NewRegistry(map[string][]string{"default": {"ask", "search_codex"}}, "default")
			if err != nil {
				t.Fatal(err)
			}
			lim := governor.Limits{NumCtx: 100000, AnswerReserve: 64}
			o, err := New(Config{Identity: runcontext.Identity{Name: "t", Persona: "Be brief."}, Limits: lim, Sigils: reg, TopK: 3},
				fake.NewBackend(), tokencount.New(fake.Tokenizer{}, nil), fake.NewStore(), fake.NewSensor(), scheduler.New(scheduler.Options{Slots: 1}))
			if err != nil {
				t.Fatal(err)
			}
			block := runcontext.Codex{Name: "c", Mode: mode, Body: strings.Repeat("codex line\n", 50),
				Files: []runcontext.CodexRef{{Path: "a.txt", Bytes: 550, SHA256: strings.Repeat("0", 64)}}}
			o.SetCodex(block, ctxd.CodexPlan{Mode: mode, Reason: "test"}, nil, lim)
			if _, err := o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "What is in a.txt?"}, noop); err != nil {
				t.Fatal(err)
			}
			sent, _, ok := o.LastPrompt("s")
			if !ok {
				t.Fatal("no prompt sent")
			}
			planned, err := o.StableBlocks(block)
			if err != nil {
				t.Fatal(err)
			}
			for k := runcontext.BlockIdentity; k <= runcontext.BlockSigil; k++ {
				if sent.Blocks[k] != planned.Blocks[k] {
					t.Errorf("block %s: the request sent\n%q\nthe plan weighed\n%q", runcontext.BlockNames[k], sent.Blocks[k], planned.Blocks[k])
				}
			}
			// The scopes line names it in both modes; the tool is offered in RAG only.
			if tool := strings.Count(sent.Blocks[runcontext.BlockSigil], sigils.ScopeSearchCodex) > 1; tool != (mode == runcontext.ModeRAG) {
				t.Errorf("%s: the sigil block offers search_codex: %v\n%s", mode, tool, sent.Blocks[runcontext.BlockSigil])
			}
		})
	}
}

// TestCodexAndLimitsSwapTogether: a codex handed over with the limits it
// was planned under is seen with them and no others, by every reader, and
// limits that do not fit the window are refused, leaving those in force.
func TestCodexAndLimitsSwapTogether(t *testing.T) {
	t.Parallel()
	l1 := governor.Limits{NumCtx: 100000, AnswerReserve: 64}
	h := newTest(t, l1, 1)
	l2 := l1
	l2.AnswerReserve = 128
	a := runcontext.Codex{Name: "a", Mode: runcontext.ModeCAG, Body: "a\n"}
	b := runcontext.Codex{Name: "b", Mode: runcontext.ModeCAG, Body: "b\n"}
	want := map[string]governor.Limits{"a": l1, "b": l2}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				v := h.o.view.Load()
				if l, ok := want[v.codex.block.Name]; ok && v.limits != l {
					t.Errorf("codex %q seen with limits %+v, planned under %+v", v.codex.block.Name, v.limits, l)
					return
				}
			}
		})
	}
	for i := range 2000 {
		if i%2 == 0 {
			h.o.SetCodex(a, ctxd.CodexPlan{Mode: runcontext.ModeCAG}, nil, l1)
		} else {
			h.o.SetCodex(b, ctxd.CodexPlan{Mode: runcontext.ModeCAG}, nil, l2)
		}
	}
	close(stop)
	wg.Wait()
	if got := h.o.Limits(); got != l2 {
		t.Errorf("limits %+v after the last codex, planned under %+v", got, l2)
	}
	wrong := l2
	wrong.NumCtx = 4096
	if err := h.o.SetLimits(wrong); err == nil {
		t.Error("limits of another window were taken")
	}
	h.o.SetCodex(a, ctxd.CodexPlan{Mode: runcontext.ModeCAG}, nil, wrong)
	if got := h.o.Limits(); got != l2 {
		t.Errorf("a codex planned for another window changed the limits to %+v", got)
	}
}

// TestWarmFingerprint: a stable prefix's fingerprint (the saved slot's
// file name) is the SHA-256 of the model's name, a zero byte and the ids
// as 32-bit little-endian words, whether computed or remembered; another
// prefix or model has another.
func TestWarmFingerprint(t *testing.T) {
	t.Parallel()
	want := func(model string, ids []int) string {
		b := append([]byte(model), 0)
		for _, id := range ids {
			b = append(b, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		}
		sum := sha256.Sum256(b)
		return hex.EncodeToString(sum[:12])
	}
	w := newWarmer(WarmConfig{Model: "m.gguf@llama-server 1"}, nil)
	a, b := []int{1, 2, 70000, 4}, []int{1, 2, 70000, 5}
	for range 2 { // computed, then remembered
		if got := w.fingerprint(a); got != want(w.cfg.Model, a) {
			t.Errorf("fingerprint %s, want %s", got, want(w.cfg.Model, a))
		}
	}
	if w.fingerprint(b) == w.fingerprint(a) {
		t.Error("two prefixes share a fingerprint")
	}
	other := newWarmer(WarmConfig{Model: "other.gguf"}, nil)
	if other.fingerprint(a) == w.fingerprint(a) {
		t.Error("two models share a prefix's fingerprint")
	}
}
