package pgstore

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/pgtest"
)

// password is put in the URLs of the outage tests: no error may show it.
const password = "s3cret-pw"

// withPassword is url with the user's password set (the test cluster
// trusts local connections and never asks for it).
func withPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), password)
	return u.String()
}

// wantUnreachable fails t unless err is the store's error for an
// unreachable server: of kind unavailable, naming the store, the password
// hidden.
func wantUnreachable(t *testing.T, err error, s *Store) {
	t.Helper()
	var e *ctxd.Error
	switch {
	case err == nil:
		t.Error("no error while the server was down")
	case ctxd.KindOf(err) != ctxd.KindUnavailable || !errors.As(err, &e) || e.Err == nil:
		t.Errorf("error %v: kind %s, want %s with its cause", err, ctxd.KindOf(err), ctxd.KindUnavailable)
	case !strings.Contains(err.Error(), "the shared store "+s.Name()+" is unreachable: "),
		!strings.Contains(err.Error(), "; ctxd retries at the next request, no restart needed"),
		!strings.HasSuffix(s.Name(), " (password hidden)"):
		t.Errorf("error %q does not name the store %s as unreachable", err, s.Name())
	case strings.Contains(err.Error(), password):
		t.Errorf("error %q shows the password", err)
	}
}

// acked are the writes that returned nil, by the writers of
// TestRestartLosesNoAcknowledgedWrite.
type acked struct {
	mu       sync.Mutex
	turns    map[int64]string // seq: query, of the session "shared"
	traces   map[int64]string // id: query
	verified map[int64]bool
	failed   []error // the writes that did not
}

func (a *acked) fail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failed = append(a.failed, err)
}

// TestRestartLosesNoAcknowledgedWrite: writers append turns to one
// session and record and verify traces while the server restarts twice,
// once fast and once as a crash (immediate shutdown: no checkpoint, the
// next start recovers from the log). Every write that returned nil is
// there afterwards; the writes that failed failed as unreachable, naming
// the store; and the same Store works again once the server is back.
func TestRestartLosesNoAcknowledgedWrite(t *testing.T) {
	ctx := t.Context()
	c := pgtest.New(t)
	s := openURL(t, withPassword(t, c.NewDatabase(t)), OpenOptions{MaxConns: 4})
	a := &acked{turns: map[int64]string{}, traces: map[int64]string{}, verified: map[int64]bool{}}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for i := 0; !stopped(); i++ {
				q := fmt.Sprintf("w%d-%d", w, i)
				seq, err := s.AppendTurn(ctx, "shared", ctxd.Turn{Query: q, Answer: "a"}, nil, time.Now())
				if err != nil {
					a.fail(err)
					time.Sleep(5 * time.Millisecond)
					continue
				}
				a.mu.Lock()
				if prev, dup := a.turns[seq]; dup {
					t.Errorf("seq %d acknowledged to %s and %s", seq, prev, q)
				}
				a.turns[seq] = q
				a.mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for i := 0; !stopped(); i++ {
			q := fmt.Sprint("trace ", i)
			id, err := s.RecordTrace(ctx, ctxd.Trace{Session: "shared", Sigil: "dev", Query: q, Answer: "a", CreatedAt: time.Now()})
			if err != nil {
				a.fail(err)
				time.Sleep(5 * time.Millisecond)
				continue
			}
			a.mu.Lock()
			a.traces[id] = q
			a.mu.Unlock()
			if _, err := s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Sigil: "dev", At: time.Now()}); err != nil {
				a.fail(err)
				continue
			}
			a.mu.Lock()
			a.verified[id] = true
			a.mu.Unlock()
		}
	})

	progress := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.turns) + len(a.verified)
	}
	// waitProgress waits until n more writes are acknowledged.
	waitProgress := func(step string, n int) {
		t.Helper()
		want := progress() + n
		for deadline := time.Now().Add(30 * time.Second); progress() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				close(stop)
				wg.Wait()
				t.Fatalf("%s: fewer than %d writes acknowledged in 30s; failures: %v", step, n, a.failed)
			}
		}
	}
	// backAtOnce: the first request after the server is back succeeds,
	// on the store that met the outage: its dead connections are not the
	// request's failure.
	backAtOnce := func(step string) {
		t.Helper()
		if _, err := s.AppendTurn(ctx, "probe", ctxd.Turn{Query: step}, nil, time.Now()); err != nil {
			t.Errorf("the first request %s: %v", step, err)
		}
	}
	waitProgress("before the restarts", 50)
	c.Restart(t)
	backAtOnce("after a fast restart")
	waitProgress("after a fast restart", 50)
	c.Stop(t, pgtest.Immediate)
	_, err := s.AppendTurn(ctx, "probe", ctxd.Turn{Query: "while down"}, nil, time.Now())
	wantUnreachable(t, err, s)
	t.Logf("while the server was down: %v", err)
	time.Sleep(100 * time.Millisecond) // the writers meet the outage too
	c.Start(t)
	backAtOnce("after a crash")
	waitProgress("after a crash", 50)
	close(stop)
	wg.Wait()

	if _, err := s.AppendTurn(ctx, "after", ctxd.Turn{Query: "q", Answer: "a"}, nil, time.Now()); err != nil {
		t.Fatalf("the same store after the restarts: %v", err)
	}
	sess, err := s.Session(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[int64]string{}
	for i, tr := range sess.Turns {
		stored[sess.Seqs[i]] = tr.Query
	}
	for seq, q := range a.turns {
		if stored[seq] != q {
			t.Errorf("acknowledged turn %q (seq %d): stored %q", q, seq, stored[seq])
		}
	}
	for id, q := range a.traces {
		tr, _, err := s.Trace(ctx, id)
		switch {
		case err != nil || tr.Query != q:
			t.Errorf("acknowledged trace %d (%q): %+v, %v", id, q, tr, err)
		case a.verified[id] && tr.Status != ctxd.TraceVerified:
			t.Errorf("acknowledged verification of trace %d: status %s", id, tr.Status)
		}
	}
	if len(a.failed) == 0 {
		t.Error("no write failed while the server restarted")
	}
	for _, err := range a.failed {
		wantUnreachable(t, err, s)
	}
	t.Logf("%d turns and %d traces (%d verified) acknowledged, %d writes failed as unreachable",
		len(a.turns), len(a.traces), len(a.verified), len(a.failed))
}

// TestOpenWhileDownNamesTheStore: Open, on a server that is down, fails
// as a request does, and no error of a URL shows its password.
func TestOpenWhileDownNamesTheStore(t *testing.T) {
	c := pgtest.New(t)
	raw := withPassword(t, c.NewDatabase(t))
	c.Stop(t, pgtest.Fast)
	_, err := Open(t.Context(), raw)
	if ctxd.KindOf(err) != ctxd.KindUnavailable || !strings.Contains(err.Error(), fmt.Sprintf("the shared store postgres://postgres@127.0.0.1:%d/", c.Port())) ||
		!strings.Contains(err.Error(), "(password hidden) is unreachable: ") || strings.Contains(err.Error(), password) {
		t.Errorf("opening a store that is down: %v", err)
	}
	for _, bad := range []string{
		"postgres://u:" + password + "@host:port/db",
		"postgres://u:" + password + "@ho st/db",
		"host=h password=" + password + " port=x",
	} {
		if _, err := Open(t.Context(), bad); err == nil || strings.Contains(err.Error(), password) {
			t.Errorf("opening %q: %v; want an error without the password", bad, err)
		}
	}
}
