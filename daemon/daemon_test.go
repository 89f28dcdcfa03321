package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/internal/socktest"
	"github.com/ctxd/ctxd/sqlite"
)

// fixture is a daemon on fakes: a scripted backend, an in-memory store
// (unless the test asks for SQLite) and a settable environment.
type fixture struct {
	cfg     config.Config
	backend *fake.Backend
	store   ctxd.Store
	sensor  *fake.Sensor
	client  *client.Client
	daemon  *Daemon
	cancel  context.CancelFunc
	done    chan error // Run's result
}

type fixtureOptions struct {
	slots  int
	numCtx int
	sqlite bool                 // keep sessions in SQLite in the state dir
	open   bringup.Opener       // replaces the fake opener
	tok    ctxd.Tokenizer       // replaces the byte tokenizer
	config func(*config.Config) // adjusts the configuration
	noWait bool                 // do not wait until ready
	// formatters replaces the shipped formatters
	formatters *formatters.Registry
	reread     func() (config.Config, error) // Options.Reread
	logLevel   *slog.LevelVar                // Options.LogLevel
}

func newFixture(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	if o.slots == 0 {
		o.slots = 1
	}
	if o.numCtx == 0 {
		o.numCtx = 100000
	}
	f := &fixture{backend: fake.NewBackend(), sensor: fake.NewSensor(), done: make(chan error, 1)}
	cfg := daemontest.Config(t)
	if o.config != nil {
		o.config(&cfg)
	}
	f.cfg = cfg
	tok := o.tok
	if tok == nil {
		tok = fake.Tokenizer{}
	}
	open := o.open
	if open == nil {
		open = func(context.Context, func()) (*bringup.Model, error) {
			return daemontest.Model(f.backend, tok, o.numCtx, o.slots), nil
		}
	}
	opts := Options{Open: open, Sensor: f.sensor, Version: "test", Logger: daemontest.Logger(t), Formatters: o.formatters,
		Reread: o.reread, LogLevel: o.logLevel}
	if !o.sqlite {
		f.store = fake.NewStore()
		opts.Store = f.store
	}
	d, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	f.daemon = d
	ln, err := Listen(cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	ready := make(chan struct{})
	go func() { f.done <- d.Run(ctx, ln, func() { close(ready) }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-f.done:
		case <-time.After(30 * time.Second):
			t.Error("daemon did not stop within 30s")
		}
		ln.Close()
	})
	f.client = client.New(cfg.Daemon.Socket)
	if !o.noWait {
		select {
		case <-ready:
		case err := <-f.done:
			t.Fatalf("daemon stopped before ready: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("daemon not ready within 30s")
		}
	}
	return f
}

// do sends a request over the socket and returns status and body.
func (f *fixture) do(t *testing.T, method, path, contentType, body string) (int, string) {
	t.Helper()
	return socktest.Do(t, f.cfg.Daemon.Socket, method, path, contentType, body)
}

func (f *fixture) ask(t *testing.T, session, query string) *ctxd.Summary {
	t.Helper()
	sum, err := f.client.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: query}, nil)
	if err != nil {
		t.Fatalf("ask %q in %s: %v", query, session, err)
	}
	return sum
}

// TestNotReadyYet: while the backend cannot be reached the daemon answers
// every route, says why, and keeps trying.
func TestNotReadyYet(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{noWait: true, open: func(context.Context, func()) (*bringup.Model, error) {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "fake: ollama is not reachable at fake://")
	}})
	daemontest.WaitFor(t, func() bool {
		status, body := f.do(t, "GET", "/v1/health", "", "")
		return status == 503 && strings.Contains(body, "not reachable")
	})
	cases := []struct {
		method, path, body string
		status             int
	}{
		{"POST", "/v1/ask", `{"session":"s","query":"hi"}`, 503},
		{"GET", "/v1/status", "", 200},
		{"GET", "/v1/sessions", "", 200},
		{"GET", "/v1/sessions/s", "", 200},
		{"GET", "/v1/codex", "", 503},
		{"POST", "/v1/codex/load", `{"path":"/tmp"}`, 503},
		{"GET", "/v1/sessions/s/prompt", "", 404},
	}
	for _, c := range cases {
		if status, body := f.do(t, c.method, c.path, "application/json", c.body); status != c.status {
			t.Errorf("%s %s while not ready: %d %s, want %d", c.method, c.path, status, body, c.status)
		}
	}
}

// TestConfigurationThatCannotWorkStopsTheDaemon: an explicit num_ctx that
// does not fit the memory is not retried for ever.
func TestConfigurationThatCannotWorkStopsTheDaemon(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{noWait: true, open: func(context.Context, func()) (*bringup.Model, error) {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "daemon: backend.num_ctx: num_ctx 99999 needs 9 GiB of KV cache; 1 GiB is free")
	}})
	select {
	case err := <-f.done:
		if err == nil || !strings.Contains(err.Error(), "num_ctx 99999") {
			t.Errorf("Run returned %v", err)
		}
		f.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon kept running with a configuration that cannot work")
	}
}

// TestStopDuringAStream: a stop that lets an answer finish within the grace
// period records it; one that must cut an answer tells the client it was
// not recorded. Never a streamed answer silently missing from the session.
func TestStopDuringAStream(t *testing.T) {
	t.Parallel()
	for _, finish := range []bool{true, false} {
		t.Run(fmt.Sprintf("finishes in grace=%v", finish), func(t *testing.T) {
			t.Parallel()
			grace := 300 * time.Millisecond
			if finish {
				grace = 10 * time.Second
			}
			f := newFixture(t, fixtureOptions{sqlite: true, config: func(c *config.Config) {
				c.Daemon.ShutdownGrace = config.Duration{Duration: grace}
			}})
			f.backend.Hold()
			events := make(chan ctxd.Event, 16)
			go func() {
				defer close(events)
				socktest.Stream(t, f.cfg.Daemon.Socket, `{"session":"s","query":"long answer"}`, events)
			}()
			if ev := <-events; ev.Type != ctxd.EventToken {
				t.Fatalf("first event %+v", ev)
			}
			f.cancel() // SIGTERM
			if finish {
				time.Sleep(100 * time.Millisecond) // the daemon is draining
				f.backend.Release()
			}
			var last ctxd.Event
			for ev := range events {
				last = ev
			}
			if err := <-f.done; err != nil {
				t.Errorf("Run: %v", err)
			}
			f.done <- nil
			f.backend.Release()
			store, err := sqlite.Open(context.Background(), filepath.Join(f.cfg.Daemon.StateDir, "ctxd.db"))
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			sess, err := store.Session(context.Background(), "s")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case finish && (last.Type != ctxd.EventSummary || sess.Count != 1):
				t.Errorf("an answer finished within the grace period: last event %+v, %d turns recorded", last, sess.Count)
			case !finish && (last.Type != ctxd.EventError || last.Kind != ctxd.KindInterrupted || !strings.Contains(last.Error, "not recorded") || sess.Count != 0):
				t.Errorf("an answer cut at shutdown: last event %+v, %d turns recorded", last, sess.Count)
			}
		})
	}
}

// serve runs d on ln until the test ends (then stops it and closes ln),
// and returns once it is ready.
func serve(tb testing.TB, d *Daemon, ln net.Listener) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Run(ctx, ln, func() { close(ready) }) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Error("daemon did not stop within 30s")
		}
		ln.Close()
	})
	select {
	case <-ready:
	case err := <-done:
		tb.Fatalf("daemon stopped before ready: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("daemon not ready within 30s")
	}
}

// orderStore notes when an answer is recorded.
type orderStore struct {
	ctxd.Store
	note func(string)
}

func (s orderStore) AppendTurn(ctx context.Context, id string, t ctxd.Turn, summary []byte, now time.Time) (int64, error) {
	n, err := s.Store.AppendTurn(ctx, id, t, summary, now)
	s.note("answer recorded")
	return n, err
}

// TestStopOrder: a stop lets the request in flight finish and record its
// answer, and only then closes the backend; Run returns after both.
func TestStopOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	backend := fake.NewBackend()
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	cfg.Daemon.Socket = filepath.Join(daemontest.ShortDir(t), "ctxd.sock")
	cfg.Daemon.StateDir = t.TempDir()
	cfg.Daemon.ShutdownGrace = config.Duration{Duration: 10 * time.Second}
	open := func(context.Context, func()) (*bringup.Model, error) {
		m := daemontest.Model(backend, fake.Tokenizer{}, 4096, 1)
		m.Close = func() error { note("backend closed"); return nil }
		return m, nil
	}
	d, err := New(cfg, Options{Open: open, Store: orderStore{Store: fake.NewStore(), note: note}, Sensor: fake.NewSensor(), Logger: daemontest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Run(ctx, ln, func() { close(ready) }) }()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("not ready within 30s")
	}
	backend.Hold()
	asked := make(chan error, 1)
	go func() {
		_, err := client.New(cfg.Daemon.Socket).Ask(context.Background(), ctxd.AskRequest{Session: "s", Query: "long"}, nil)
		asked <- err
	}()
	select {
	case <-backend.Started():
	case <-time.After(10 * time.Second):
		t.Fatal("the ask did not reach the backend")
	}
	cancel() // the stop begins with the answer in flight
	daemontest.WaitFor(t, func() bool { _, err := d.Engine(); return err == nil && d.api.Load() != nil && isDraining(d) })
	note("stop begun")
	backend.Release()
	if err := <-asked; err != nil {
		t.Errorf("the answer in flight at the stop: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"stop begun", "answer recorded", "backend closed"}; !slices.Equal(order, want) {
		t.Errorf("stop order %q, want %q", order, want)
	}
}

// isDraining reports whether the daemon's HTTP surface has begun to stop.
func isDraining(d *Daemon) bool {
	select {
	case <-d.api.Load().Stopping():
		return true
	default:
		return false
	}
}
