package orchestrator

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// newSharedPair is two orchestrators (two daemons) on one store, as with
// store.kind = "postgres".
func newSharedPair(t *testing.T, shared bool) (a, b *harness) {
	t.Helper()
	store := fake.NewStore()
	mk := func() *harness {
		reg, err := sigils.NewRegistry(map[string][]string{"default": {"ask"}}, "default")
		if err != nil {
			t.Fatal(err)
		}
		h := &harness{backend: fake.NewBackend(), env: fake.NewSensor(), store: store, sched: scheduler.New(scheduler.Options{Slots: 1})}
		h.o, err = New(Config{
			Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
			Limits:   governor.Limits{NumCtx: 8192, AnswerReserve: 64}, Sigils: reg, TopK: 3, SharedStore: shared,
		}, h.backend, tokencount.New(fake.Tokenizer{}, nil), h.store, h.env, h.sched)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	return mk(), mk()
}

// TestSharedStoreSessionMovesBetweenDaemons: with a shared store a
// session goes on at another daemon and back with every turn; a daemon
// that trusted what it held (an unshared store) would lose the other's.
func TestSharedStoreSessionMovesBetweenDaemons(t *testing.T) {
	a, b := newSharedPair(t, true)
	for i, h := range []*harness{a, a, b, a} {
		if sum := h.ask(t, "s", "question "+string(rune('1'+i))); sum.Turn != i+1 {
			t.Fatalf("turn %d: summary says turn %d", i+1, sum.Turn)
		}
	}
	sess, err := a.store.Session(t.Context(), "s")
	if err != nil || len(sess.Turns) != 4 {
		t.Fatalf("stored: %d turns %v, want 4", len(sess.Turns), err)
	}
	// The last prompt at a holds b's turn.
	if ps := a.backend.Prompts(); !strings.Contains(ps[len(ps)-1], "question 3") {
		t.Errorf("a's last prompt lacks the turn asked at b:\n%s", ps[len(ps)-1])
	}
	// The control: a daemon that holds sessions in memory misses it.
	c, d := newSharedPair(t, false)
	c.ask(t, "s", "question 1")
	d.ask(t, "s", "question 2")
	if sum := c.ask(t, "s", "question 3"); sum.Turn != 2 {
		t.Errorf("the control: a daemon holding its sessions in memory counted turn %d, want 2 (it did not see the other's turn): the shared setting is what makes the difference", sum.Turn)
	}
}

// TestRequestsNameTheirSessionToTheBackend: the backend hears each
// request's session (internal id) and its parent, for a cluster's router.
func TestRequestsNameTheirSessionToTheBackend(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 8192, AnswerReserve: 64}, 1)
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "child", Parent: "main", Query: "q"}, noop); err != nil {
		t.Fatal(err)
	}
	reqs := h.backend.Requests()
	req := reqs[len(reqs)-1]
	if req.Session != "child" || req.Parent != "main" {
		t.Errorf("backend heard session %q parent %q, want child and main", req.Session, req.Parent)
	}
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "child", Parent: "not ok!", Query: "q"}, noop); err == nil || !strings.Contains(err.Error(), "parent") {
		t.Errorf("a malformed parent: %v", err)
	}
}
