package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/sigils"
)

// TestStatusLineSaysHowTheDaemonIs: the line systemd shows says why a
// daemon is not ready, and once it is, its backend, window, codex and
// sessions, as they change.
func TestStatusLineSaysHowTheDaemonIs(t *testing.T) {
	t.Parallel()
	down := newFixture(t, fixtureOptions{noWait: true, open: func(context.Context, func()) (*bringup.Model, error) {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "fake: ollama is not reachable at fake://")
	}})
	daemontest.WaitFor(t, func() bool {
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
	// The session count is taken off the request path: a read asks for a
	// fresh one and answers with the last.
	daemontest.WaitFor(t, func() bool {
		line, err = f.daemon.StatusLine(t.Context())
		return err == nil && strings.Contains(line, "1 session, 1 slot warm, 0 busy, 0 queued")
	})
}

// TestStatusShowsTheListeners: status says where the daemon listens and
// how it trusts requests: with a sigil that has a token, by token.
func TestStatusShowsTheListeners(t *testing.T) {
	t.Parallel()
	_, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen = "127.0.0.1:0"
		c.Sigils["coder"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hash}
	}})
	var st httpapi.Status
	if err := f.client.Status(t.Context(), &st); err != nil || st.Listeners.TCP != f.daemon.TCPAddr() || st.Listeners.TCP == "" ||
		st.Listeners.Socket != f.cfg.Daemon.Socket || !strings.Contains(st.Listeners.Trust, "token") {
		t.Errorf("status listeners: %+v %v", st.Listeners, err)
	}
}

// wedgedStore is a store whose session listing hangs until released,
// whatever its context says: a store stuck on a write.
type wedgedStore struct {
	ctxd.Store
	wedged chan struct{} // closed: no longer wedged
}

func (s wedgedStore) Sessions(ctx context.Context) ([]ctxd.SessionInfo, error) {
	<-s.wedged
	return s.Store.Sessions(ctx)
}

// wedgedSensor is a sensor whose reading hangs while wedged: a daemon
// stuck on the hardware probe's lock, which status takes.
type wedgedSensor struct {
	*fake.Sensor
	mu     sync.Mutex
	wedged chan struct{} // nil: not wedged; closed: released
}

func (s *wedgedSensor) Environment() ctxd.Environment {
	s.mu.Lock()
	w := s.wedged
	s.mu.Unlock()
	if w != nil {
		<-w
	}
	return s.Sensor.Environment()
}

func (s *wedgedSensor) wedge() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wedged = make(chan struct{})
	return s.wedged
}

// TestAliveFailsWhileTheRequestPathIsWedged: a daemon whose status cannot
// be read is not alive (the watchdog stops being fed), and is again once
// it can. A session store that hangs is no such thing: status does not
// wait for the store, so the daemon stays alive and status answers.
func TestAliveFailsWhileTheRequestPathIsWedged(t *testing.T) {
	t.Parallel()
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	cfg.Daemon.Socket = filepath.Join(daemontest.ShortDir(t), "ctxd.sock")
	cfg.Daemon.StateDir = t.TempDir()
	store := wedgedStore{Store: fake.NewStore(), wedged: make(chan struct{})}
	sensor := &wedgedSensor{Sensor: fake.NewSensor()}
	open := func(context.Context, func()) (*bringup.Model, error) {
		return daemontest.Model(fake.NewBackend(), fake.Tokenizer{}, 4096, 1), nil
	}
	d, err := New(cfg, Options{Open: open, Store: store, Sensor: sensor, Logger: daemontest.Logger(t)})
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

	// The store hangs: status answers at once, from the last count.
	check, stop := context.WithTimeout(t.Context(), 10*time.Second)
	defer stop()
	if err := d.Alive(check); err != nil {
		t.Errorf("Alive with the store wedged: %v, want alive", err)
	}
	var st httpapi.Status
	if err := client.New(cfg.Daemon.Socket).Status(check, &st); err != nil || !st.Ready {
		t.Errorf("status with the store wedged: %+v %v", st, err)
	}
	close(store.wedged)

	// The probe hangs: the daemon is not alive.
	released := sensor.wedge()
	check, stop = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer stop()
	err = d.Alive(check)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Alive with the probe wedged: %v, want the check's deadline", err)
	}
	close(released)
	daemontest.WaitFor(t, func() bool { return d.Alive(t.Context()) == nil })
	if line, err := d.StatusLine(t.Context()); err != nil || !strings.HasPrefix(line, "ready · fake") || !strings.Contains(line, "no codex") {
		t.Errorf("status line once unwedged: %q %v", line, err)
	}
}
