package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
)

// TestStatusLineSaysHowTheDaemonIs: the line systemd shows says why a
// daemon is not ready, and once it is, its backend, window, codex and
// sessions, as they change.
func TestStatusLineSaysHowTheDaemonIs(t *testing.T) {
	t.Parallel()
	down := newFixture(t, fixtureOptions{noWait: true, open: func(context.Context, func()) (*Model, error) {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "fake: ollama is not reachable at fake://")
	}})
	waitFor(t, func() bool {
		line, err := down.daemon.StatusLine(t.Context())
		return err == nil && line == "starting: backend not ready: fake: ollama is not reachable at fake://"
	})
	if err := down.daemon.Alive(t.Context()); err != nil {
		t.Errorf("a daemon waiting for its backend is alive: %v", err)
	}

	f := newFixture(t, fixtureOptions{slots: 2, numCtx: 8192})
	line, err := f.daemon.StatusLine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ready · ", "num_ctx 8192 × 2 slots", " files cag", "0 sessions, 0 slots warm, 0 busy, 0 queued"} {
		if !strings.Contains(line, want) {
			t.Errorf("status line %q lacks %q", line, want)
		}
	}
	f.ask(t, "a", "What does Serve return?")
	line, err = f.daemon.StatusLine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "1 session, 1 slot warm, 0 busy, 0 queued") {
		t.Errorf("after one ask, status line %q does not count the session and its warm slot", line)
	}
}

// wedgedStore is a store whose session listing hangs until released,
// whatever its context says: a daemon stuck on a lock.
type wedgedStore struct {
	ctxd.Store
	wedged chan struct{} // closed: no longer wedged
}

func (s wedgedStore) Sessions(ctx context.Context) ([]ctxd.SessionInfo, error) {
	<-s.wedged
	return s.Store.Sessions(ctx)
}

// TestAliveFailsWhileTheRequestPathIsWedged: a daemon whose status handler
// cannot finish is not alive (the watchdog stops being fed), and is again
// once it can.
func TestAliveFailsWhileTheRequestPathIsWedged(t *testing.T) {
	t.Parallel()
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	cfg.Daemon.Socket = filepath.Join(shortDir(t), "ctxd.sock")
	cfg.Daemon.StateDir = t.TempDir()
	store := wedgedStore{Store: fake.NewStore(), wedged: make(chan struct{})}
	open := func(context.Context, func()) (*Model, error) {
		return &Model{Backend: fake.NewBackend(), Tokenizer: fake.Tokenizer{}, TokenizerID: "fake",
			Info:   BackendInfo{Kind: "fake", Model: "fake", NumCtx: 4096, Slots: 1},
			Window: governor.WindowPlan{NumCtx: 4096, Slots: 1, CacheType: governor.CacheF16},
			Close:  func() error { return nil }}, nil
	}
	d, err := New(cfg, Options{Open: open, Store: store, Sensor: fake.NewSensor(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Alive(t.Context()); err != nil {
		t.Errorf("before Run has opened anything: %v, want alive (starting)", err)
	}
	ln, err := Listen(cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d, ln)

	check, stop := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer stop()
	err = d.Alive(check)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Alive with the store wedged: %v, want the check's deadline", err)
	}
	close(store.wedged)
	waitFor(t, func() bool { return d.Alive(t.Context()) == nil })
	if line, err := d.StatusLine(t.Context()); err != nil || !strings.HasPrefix(line, "ready · fake") || !strings.Contains(line, "no codex") {
		t.Errorf("status line once unwedged: %q %v", line, err)
	}
}
