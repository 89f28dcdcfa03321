package httpapi

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/internal/socktest"
	"github.com/ctxd/ctxd/metrics"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
)

// fixture is the HTTP surface on a request path of fakes, with no daemon:
// a scripted backend, an in-memory store (unless the test asks for
// SQLite), a settable environment, and a Core that hands out the engine.
type fixture struct {
	cfg     config.Config
	backend *fake.Backend
	store   ctxd.Store
	sensor  *fake.Sensor
	client  *client.Client
	srv     *Server
	core    *testCore
	eng     *engine.Engine
	feed    *dashboard.Feed
	stopped chan struct{} // closed when a stop (cancel) has returned
}

type fixtureOptions struct {
	slots  int
	numCtx int
	sqlite bool                 // keep sessions in SQLite in the state dir
	tok    ctxd.Tokenizer       // replaces the byte tokenizer
	model  ctxd.Backend         // replaces the scripted backend
	config func(*config.Config) // adjusts the configuration
	// formatters replaces the shipped formatters
	formatters *formatters.Registry
	quiet      bool                          // log nothing (fuzz targets send many requests)
	reread     func() (config.Config, error) // what the Core's Reload reads; nil: reloads are refused
}

// testCore is the Core of the fixture: the engine, a log level, and a
// reload that re-reads the fixture's configuration function.
type testCore struct {
	eng    *engine.Engine
	sigils *sigils.Registry
	level  slog.LevelVar

	mu     sync.Mutex
	reread func() (config.Config, error) // nil: reloads are refused
}

func (c *testCore) Engine() (*engine.Engine, error) {
	if c.eng == nil {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "backend is starting")
	}
	return c.eng, nil
}

func (c *testCore) Status(context.Context) Status {
	st := Status{Version: "test"}
	if c.eng != nil {
		st.FillEngine(c.eng)
	}
	return st
}

// Reload puts the sigils of the configuration reread returns in force.
func (c *testCore) Reload(context.Context) ReloadStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := ReloadStatus{At: time.Now()}
	if c.reread == nil {
		st.Error = "reloads are refused"
		return st
	}
	cfg, err := c.reread()
	var reg *sigils.Registry
	if err == nil {
		reg, err = cfg.SigilRegistry()
	}
	if err != nil {
		st.Error = err.Error()
		return st
	}
	c.sigils.Replace(reg)
	st.OK, st.Applied = true, []string{"sigils"}
	return st
}

func (c *testCore) SetLogLevel(l slog.Level) { c.level.Set(l) }
func (c *testCore) LogLevel() slog.Level     { return c.level.Level() }

func newFixture(t testing.TB, o fixtureOptions) *fixture {
	t.Helper()
	if o.slots == 0 {
		o.slots = 1
	}
	if o.numCtx == 0 {
		o.numCtx = 100000
	}
	f := &fixture{backend: fake.NewBackend(), sensor: fake.NewSensor(), stopped: make(chan struct{})}
	cfg := daemontest.Config(t)
	if o.config != nil {
		o.config(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	f.cfg = cfg
	log := slog.New(slog.DiscardHandler)
	if tt, ok := t.(*testing.T); ok && !o.quiet {
		log = daemontest.Logger(tt)
	}
	reg, err := cfg.SigilRegistry()
	if err != nil {
		t.Fatal(err)
	}
	if o.sqlite {
		s, err := sqlite.Open(context.Background(), filepath.Join(cfg.Daemon.StateDir, "ctxd.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		f.store = s
	} else {
		f.store = fake.NewStore()
	}
	var karma ctxd.KarmaStore
	if k, ok := f.store.(ctxd.KarmaStore); ok && cfg.Karma.Enabled {
		karma = k
	}
	tok := o.tok
	if tok == nil {
		tok = fake.Tokenizer{}
	}
	var backend ctxd.Backend = f.backend
	if o.model != nil {
		backend = o.model
	}
	model := daemontest.Model(backend, tok, o.numCtx, o.slots)
	met := metrics.New(func() metrics.Snapshot {
		var v metrics.Snapshot
		if f.eng != nil {
			f.eng.FillMetrics(&v)
		}
		return v
	})
	f.core = &testCore{sigils: reg, reread: o.reread}
	f.feed = dashboard.NewFeed(0)
	var roots []string
	if cfg.Codex.Path != "" {
		roots = append(roots, cfg.Codex.Path)
	}
	f.srv = New(Config{Daemon: cfg.Daemon, LoadRoots: append(roots, cfg.Codex.LoadRoots...), Version: "test", Sigils: reg,
		Store: f.store, Karma: karma, KarmaBounds: cfg.Karma, Sensor: f.sensor, Metrics: met, Feed: f.feed, Logger: log}, f.core)
	lim := governor.Limits{MaxChars: cfg.Limits.MaxChars, NumCtx: o.numCtx, AnswerReserve: cfg.Limits.AnswerReserve,
		MaxDepth: cfg.Limits.MaxDepth, CompactTo: cfg.Limits.CompactTo}
	eng, err := engine.New(t.Context(), engine.Config{
		Identity: runcontext.Identity{Name: cfg.Identity.Name, Persona: cfg.Identity.Persona},
		Codex:    cfg.Codex, Karma: cfg.Karma, StateDir: cfg.Daemon.StateDir, Limits: lim,
		LeaveOutTools: cfg.Daemon.DisallowedTools == "leave_out",
		Sigils:        reg, Formatters: o.formatters, Store: f.store, KarmaStore: karma, Sensor: f.sensor,
		Observe: func(_ context.Context, sigil string, sum *ctxd.Summary) {
			met.Answer(sum)
			f.feed.Record(sigil, "", *sum, time.Now())
		},
		OnCodex: f.srv.PublishCodex, Logger: log,
	}, model)
	if err != nil {
		t.Fatal(err)
	}
	f.eng, f.core.eng = eng, eng
	ln, err := net.Listen("unix", cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.Serve(ln); err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.stop()
		if err := eng.Close(); err != nil {
			t.Error(err)
		}
	})
	f.client = client.New(cfg.Daemon.Socket)
	return f
}

// stop shuts the server down (once; the cleanup calls it again).
func (f *fixture) stop() { f.srv.Shutdown(f.cfg.Daemon.ShutdownGrace.Duration) }

// cancel begins a stop, as a daemon does when it is told to: runReturns
// waits for it.
func (f *fixture) cancel() {
	go func() {
		f.stop()
		close(f.stopped)
	}()
}

// runReturns waits (up to wsGuard) for the stop begun by cancel.
func (f *fixture) runReturns(t *testing.T) {
	t.Helper()
	select {
	case <-f.stopped:
	case <-time.After(wsGuard):
		t.Fatal("the stop did not return: it waited for something")
	}
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
