package orchestrator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// TestStuckStoreWriteFailsItsRequest: a store write that does not return
// fails its request once the store timeout passes, with an error that says
// so (KindUnavailable, or KindNotRecorded once the answer streamed),
// instead of holding it for ever.
func TestStuckStoreWriteFailsItsRequest(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		method, what string
		req          ctxd.AskRequest
		kind         ctxd.Kind
	}{
		// A new session's claim is written behind the prompt: the answer
		// streams, and is not recorded.
		{"ClaimSession", "claim the session", ctxd.AskRequest{Session: "stuck", Query: "q"}, ctxd.KindNotRecorded},
		{"ReplaceTurns", "take the client's history", ctxd.AskRequest{Session: "stuck", Query: "q", History: []ctxd.Turn{{Query: "a", Answer: "b"}}}, ctxd.KindUnavailable},
		{"AppendTurn", "write the turn", ctxd.AskRequest{Session: "stuck", Query: "q"}, ctxd.KindNotRecorded},
	} {
		t.Run(c.method, func(t *testing.T) {
			t.Parallel()
			h, gs := newGatedTest(t, 50*time.Millisecond)
			gs.block(c.method, "stuck")
			done := make(chan error, 1)
			go func() {
				_, err := h.o.Ask(t.Context(), c.req, noop)
				done <- err
			}()
			waitFor(t, gs.entered, "the write never reached the store")
			err := waitFor(t, done, "the request with a stuck write did not fail")
			if ctxd.KindOf(err) != c.kind || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did not "+c.what+" within 50ms") {
				t.Fatalf("the request with a stuck %s: %v (kind %q)", c.method, err, ctxd.KindOf(err))
			}
			// The session is not held: its next request runs.
			gs.block("", "")
			h.ask(t, "stuck", "again")
		})
	}
}

// TestRequestsProceedBesideAStuckWrite: while one session's write is
// stuck in the store, another session's request is answered and recorded;
// the stuck one then goes on once its write does.
func TestRequestsProceedBesideAStuckWrite(t *testing.T) {
	t.Parallel()
	h, gs := newGatedTest(t, time.Minute)
	gs.block("AppendTurn", "stuck")
	done := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "stuck", Query: "q"}, noop)
		done <- err
	}()
	waitFor(t, gs.entered, "the write never reached the store")
	if sum := h.ask(t, "free", "meanwhile"); sum.Turn != 1 {
		t.Errorf("the other session's request: %+v", sum)
	}
	if s, _ := gs.Store.Session(t.Context(), "free"); s.Count != 1 {
		t.Errorf("the other session's turn was not recorded: %+v", s)
	}
	select {
	case err := <-done:
		t.Fatalf("the stuck request returned while its write was held: %v", err)
	default:
	}
	close(gs.release)
	if err := waitFor(t, done, "the released request"); err != nil {
		t.Fatal(err)
	}
}

// TestNewSessionsClaimIsWrittenBehindThePrompt: a new session's claim
// does not delay the prompt: the backend has it while the claim's write is
// still held, and the answer is recorded, as the sigil's, once the write
// is made; the session's next request finds the owner in memory.
func TestNewSessionsClaimIsWrittenBehindThePrompt(t *testing.T) {
	t.Parallel()
	h, gs := newGatedTest(t, time.Minute)
	gs.block("ClaimSession", "fresh")
	done := make(chan error, 1)
	go func() {
		_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "fresh", Query: "q"}, noop)
		done <- err
	}()
	waitFor(t, gs.entered, "the claim never reached the store")
	waitFor(t, h.backend.Started(), "the prompt did not reach the backend while the claim's write was held")
	select {
	case err := <-done:
		t.Fatalf("the request returned before its claim was written: %v", err)
	default:
	}
	close(gs.release)
	if err := waitFor(t, done, "the request after its claim was written"); err != nil {
		t.Fatal(err)
	}
	s, err := gs.Store.Session(t.Context(), "fresh")
	if err != nil || s.Count != 1 || s.Owner != "default" {
		t.Fatalf("the new session as stored: %+v %v", s, err)
	}
	claims := gs.count("ClaimSession")
	h.ask(t, "fresh", "again")
	if n := gs.count("ClaimSession"); n != claims {
		t.Errorf("the session's next request claimed it again (%d claims, then %d)", claims, n)
	}
}
