package orchestrator

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// gatedStore is a session store that counts its calls by method, and
// whose calls of one method for one session can be made to block until
// released (or until their context ends, as the real store's do).
type gatedStore struct {
	*fake.Store
	mu      sync.Mutex
	calls   map[string]int
	method  string        // the method that blocks ("" for none)
	session string        // for this session
	entered chan string   // a session's id each time a call blocks
	release chan struct{} // closed: blocked calls go on
}

func newGatedStore() *gatedStore {
	return &gatedStore{Store: fake.NewStore(), calls: map[string]int{}, entered: make(chan string, 16), release: make(chan struct{})}
}

// block makes calls of method for session block until release.
func (s *gatedStore) block(method, session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.method, s.session = method, session
}

// count is how many calls of method were made.
func (s *gatedStore) count(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

func (s *gatedStore) gate(ctx context.Context, method, id string) error {
	s.mu.Lock()
	s.calls[method]++
	blocked := method == s.method && id == s.session
	s.mu.Unlock()
	if !blocked {
		return nil
	}
	s.entered <- id
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *gatedStore) Session(ctx context.Context, id string) (ctxd.Session, error) {
	if err := s.gate(ctx, "Session", id); err != nil {
		return ctxd.Session{}, err
	}
	return s.Store.Session(ctx, id)
}

func (s *gatedStore) ClaimSession(ctx context.Context, id, sigil, legacy string, now time.Time) (string, error) {
	if err := s.gate(ctx, "ClaimSession", id); err != nil {
		return "", err
	}
	return s.Store.ClaimSession(ctx, id, sigil, legacy, now)
}

func (s *gatedStore) ReplaceTurns(ctx context.Context, id string, turns []ctxd.Turn, now time.Time) (int, []int64, error) {
	if err := s.gate(ctx, "ReplaceTurns", id); err != nil {
		return 0, nil, err
	}
	return s.Store.ReplaceTurns(ctx, id, turns, now)
}

func (s *gatedStore) AppendTurn(ctx context.Context, id string, t ctxd.Turn, summary []byte, now time.Time) (int64, error) {
	if err := s.gate(ctx, "AppendTurn", id); err != nil {
		return 0, err
	}
	return s.Store.AppendTurn(ctx, id, t, summary, now)
}

// newGatedTest is a harness over a gated store, with storeTimeout.
func newGatedTest(t *testing.T, storeTimeout time.Duration) (*harness, *gatedStore) {
	t.Helper()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 2)
	gs := newGatedStore()
	var err error
	h.o, err = New(Config{
		Identity: runcontext.Identity{Name: "t", Persona: "Be brief."},
		Limits:   governor.Limits{NumCtx: 100000, AnswerReserve: 64}, Sigils: h.o.cfg.Sigils, TopK: 3,
		StoreTimeout: storeTimeout,
	}, h.backend, h.o.count, gs, h.env, h.sched)
	if err != nil {
		t.Fatal(err)
	}
	return h, gs
}

// waitFor waits for a value of ch, failing the test after 10 seconds.
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
	var zero T
	return zero
}

// TestSessionIsFetchedOncePerRequest: a request reads its session from
// the store once at most, and the session held in memory keeps its owner
// whatever the request did to it (here: took its client's history), so
// the session's next requests neither read nor claim it again.
func TestSessionIsFetchedOncePerRequest(t *testing.T) {
	t.Parallel()
	h, gs := newGatedTest(t, 0)
	history := []ctxd.Turn{{Query: "earlier", Answer: "an answer"}}
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q1", History: history}, noop); err != nil {
		t.Fatal(err)
	}
	if n, c, r := gs.count("Session"), gs.count("ClaimSession"), gs.count("ReplaceTurns"); n != 1 || c != 1 || r != 1 {
		t.Fatalf("first request: %d session reads, %d claims, %d history replacements; want 1 each", n, c, r)
	}
	// A history that does not extend the session's: a new epoch again.
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q2", History: []ctxd.Turn{{Query: "other", Answer: "x"}}}, noop); err != nil {
		t.Fatal(err)
	}
	h.ask(t, "s", "q3")
	if n, c, r := gs.count("Session"), gs.count("ClaimSession"), gs.count("ReplaceTurns"); n != 1 || c != 1 || r != 2 {
		t.Errorf("after three requests: %d session reads, %d claims, %d history replacements; want 1, 1, 2", n, c, r)
	}
	o := h.o
	o.sessions.mu.Lock()
	s := o.sessions.held["s"]
	o.sessions.mu.Unlock()
	if s.Owner != "default" || s.Count != 5 || len(s.Turns) != 3 {
		t.Errorf("the session held in memory: %+v; want owner default, 5 turns in all, 3 in its epoch", s)
	}
	// Another sigil's "s" is its own session, whatever the default's
	// holds.
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "mine?", Sigil: "tooler"}, noop)
	if err != nil || sum.Turn != 1 || sum.Session != "s" {
		t.Errorf("another sigil's request under the same id: %+v, %v; want the first turn of its own session", sum, err)
	}
	o.sessions.mu.Lock()
	s = o.sessions.held["s"]
	o.sessions.mu.Unlock()
	if s.Owner != "default" || s.Count != 5 {
		t.Errorf("the default sigil's session after another's request under its id: %+v", s)
	}
}

// TestAskAsTakesTheSigilAsGiven: AskAs answers as the sigil it is handed
// (already resolved and narrowed at the edge), reads neither the sigil nor
// the scopes the request names, and still requires the ask scope.
func TestAskAsTakesTheSigilAsGiven(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	tooler, err := h.o.cfg.Sigils.Resolve("tooler")
	if err != nil {
		t.Fatal(err)
	}
	// The request names a sigil that does not exist and a scope tooler
	// lacks: AskAs reads neither.
	req := ctxd.AskRequest{Session: "as", Query: "q", Sigil: "nobody", Scopes: []string{"karma:read"},
		Tools: []ctxd.Tool{{Name: "grep", Description: "search"}}}
	sum, err := h.o.AskAs(t.Context(), tooler, req, noop)
	if err != nil {
		t.Fatal(err)
	}
	if _, sigil, _ := h.o.LastPrompt("as" + ctxd.SessionScope + "tooler"); sigil != "tooler" || len(sum.ToolsRefused) != 0 || !strings.Contains(h.lastPrompt(), "### SIGIL tooler\n") {
		t.Errorf("answered as %q, tools refused %v", sigil, sum.ToolsRefused)
	}
	narrowed, err := sigils.Narrow(tooler, []string{"tool:grep"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.o.AskAs(t.Context(), narrowed, ctxd.AskRequest{Session: "as2", Query: "q"}, noop); ctxd.KindOf(err) != ctxd.KindForbidden || !strings.Contains(err.Error(), `lacks the "ask" scope`) {
		t.Errorf("a sigil narrowed without ask: %v", err)
	}
	if _, err := h.o.AskAs(t.Context(), tooler, ctxd.AskRequest{Session: "../x", Query: "q"}, noop); ctxd.KindOf(err) != ctxd.KindInvalid {
		t.Errorf("a bad session id: %v", err)
	}
}

// TestBoundsPerSigil (issue 27): a sigil's requests in flight and its
// sessions are bounded (daemon.max_asks_per_sigil,
// daemon.max_sessions_per_sigil); past either its next request is
// refused with the key's name, and another sigil's are not.
func TestBoundsPerSigil(t *testing.T) {
	t.Parallel()
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 2)
	h.o.cfg.MaxAsksPerSigil = 1
	h.backend.Hold()
	done := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "a", Query: "held"}, noop)
		done <- err
	}()
	<-h.backend.Started() // the first request is answering
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "b", Query: "second"}, noop); ctxd.KindOf(err) != ctxd.KindTooMany || !strings.Contains(err.Error(), "daemon.max_asks_per_sigil") {
		t.Errorf("a second request in flight of one sigil: %v, want too many naming daemon.max_asks_per_sigil", err)
	}
	other := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "another sigil's", Sigil: "tooler"}, noop)
		other <- err
	}()
	<-h.backend.Started()
	h.backend.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-other; err != nil {
		t.Errorf("another sigil's request beside it: %v", err)
	}

	h.o.cfg.MaxAsksPerSigil = 0
	h.o.sessions.perSigil = 2 // the default sigil holds "a" already
	h.ask(t, "c", "a second session")
	if _, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "d", Query: "a third"}, noop); ctxd.KindOf(err) != ctxd.KindTooMany || !strings.Contains(err.Error(), "daemon.max_sessions_per_sigil") {
		t.Errorf("a third session: %v, want too many naming daemon.max_sessions_per_sigil", err)
	}
	h.ask(t, "c", "its own sessions go on")
}
