package codexsvc

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

// TestMakeRoomShrinksTheCodexForAClient: a client's prompt that needs more
// of the window than a whole codex leaves makes the codex switch to
// retrieval, with its working set kept under what the client leaves; room
// the codex already leaves changes nothing, and the room never shrinks.
func TestMakeRoomShrinksTheCodexForAClient(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 20000, false) // budget 19,936; 70%: 13,955
	if _, err := s.Load(t.Context(), tree(t, 6, 1500), nil); err != nil {
		t.Fatal(err)
	}
	_, plan, _, n := snk.published()
	if plan.Mode != runcontext.ModeCAG {
		t.Fatalf("the tree does not load whole: %+v", plan)
	}
	// Room the ratio leaves already: no new plan.
	if made, err := s.MakeRoom(t.Context(), 3000); err != nil || made {
		t.Fatalf("room the codex already leaves: made %v, %v", made, err)
	}
	if _, _, _, m := snk.published(); m != n {
		t.Errorf("the codex was published again for room it already left")
	}
	// A client that needs 15,000 tokens: the codex may take 4,936.
	made, err := s.MakeRoom(t.Context(), 15000)
	if err != nil || !made {
		t.Fatalf("room for a large client: made %v, %v", made, err)
	}
	block, plan, r, _ := snk.published()
	if plan.Mode != runcontext.ModeRAG || block.Mode != runcontext.ModeRAG || r == nil || plan.Threshold != 19936-15000 || plan.ClientRoom != 15000 ||
		!strings.Contains(plan.Reason, "clients' own prompts") {
		t.Fatalf("after making room: %s block, plan %+v", block.Mode, plan)
	}
	ws := r.(*workingSet)
	codexBlock, _, _, err := ws.Retrieve(t.Context(), "Handler3_1 serves", 3)
	if err != nil {
		t.Fatal(err)
	}
	// The threshold bounds the stable blocks (identity to karma), as the
	// counter weighs them, not the empty conversation rendered after them.
	got, err := s.cfg.Stable(codexBlock)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.cfg.Counter.Stable(got); err != nil || n > plan.Threshold {
		t.Errorf("the working set's stable blocks are %d tokens (%v), over the %d the client leaves", n, err, plan.Threshold)
	}
	// Less room than before: nothing changes (the room only grows).
	if made, err := s.MakeRoom(t.Context(), 9000); err != nil || made {
		t.Errorf("a smaller room: made %v, %v", made, err)
	}
	if _, p, _, _ := snk.published(); p.ClientRoom != 15000 {
		t.Errorf("the room shrank to %d", p.ClientRoom)
	}
}
