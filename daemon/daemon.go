package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/standard"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/metrics"
	"github.com/ctxd/ctxd/pgstore"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
)

// Options are the daemon's inputs besides its configuration. Every field
// may be left zero; tests set the ones they fake.
type Options struct {
	Logger  *slog.Logger
	Version string
	// BackendEnv is the environment (KEY=VALUE) a managed backend inherits,
	// e.g. PATH; main passes it so nothing below main reads the environment.
	BackendEnv []string
	// Open brings the backend up; nil means Ollama as the configuration says.
	Open bringup.Opener
	// Store keeps sessions; nil means SQLite in the state directory.
	Store ctxd.Store
	// Sensor reads the environment bands; nil means the hardware probe.
	Sensor ctxd.Sensor
	// Formatters are the formatters and prompt formats the daemon renders
	// with; nil: formatters/standard's. A program embedding the daemon
	// registers its own extensions here.
	Formatters *formatters.Registry
	// LogLevel is the level Logger logs at: the log-level API, SIGUSR1
	// (through SetLogLevel) and a reload change it. nil: a level of the
	// daemon's own, which then changes nothing Logger does.
	LogLevel *slog.LevelVar
	// ConfigPath names the file the configuration came from, for status
	// and the log ("": the built-in defaults).
	ConfigPath string
	// Reread reads the configuration again for Reload, as it was read at
	// start (file, environment, command-line overrides); nil: reloads are
	// refused.
	Reread func() (config.Config, error)
}

// Daemon is one running ctxd.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	version string
	opts    Options
	sigils  *sigils.Registry
	// formatters inject artifacts into the blocks: the shipped ones, and
	// any an embedding program registered (Options.Formatters).
	formatters *formatters.Registry
	level      *slog.LevelVar
	metrics    *metrics.Metrics
	feed       *dashboard.Feed // the dashboard's turns and band changes

	live       atomic.Pointer[live]                 // what a reload may change
	startLive  *live                                // what was read at start; guarded by reloadMu
	reloadMu   sync.Mutex                           // one reload at a time
	lastReload atomic.Pointer[httpapi.ReloadStatus] // nil until the first reload

	// Set in Run before anything is served; read-only afterwards.
	store  ctxd.Store
	karma  ctxd.KarmaStore // the store's traces, when it keeps them and karma is on; nil otherwise
	sensor ctxd.Sensor
	probe  *hostenv.Probe // the hardware probe: memory for the window plan, and the sensor unless one was given

	api      atomic.Pointer[httpapi.Server] // the HTTP surface, once Run made it
	ready    atomic.Pointer[engine.Engine]  // nil until the backend is ready
	personas atomic.Pointer[personas]       // every persona, the default's (ready) among them; nil until ready
	initErr  atomic.Pointer[string]         // why it is not ready yet
	sessions sessionCount                   // the store's sessions, counted off the request path
}

// New checks the configuration and returns a daemon ready to Run.
func New(cfg config.Config, opts Options) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := cfg.SigilRegistry()
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	// Every line logged with a request's context names the request.
	opts.Logger = slog.New(reqid.Handler(opts.Logger.Handler()))
	if opts.LogLevel == nil {
		opts.LogLevel = new(slog.LevelVar)
		var l slog.Level
		_ = l.UnmarshalText([]byte(cfg.Daemon.LogLevel)) // validated
		opts.LogLevel.Set(l)
	}
	fm := opts.Formatters
	if fm == nil {
		fm = standard.Default(standard.Options{Logger: opts.Logger})
	}
	d := &Daemon{cfg: cfg, log: opts.Logger, version: opts.Version, opts: opts, sigils: reg, formatters: fm, level: opts.LogLevel}
	d.startLive = &live{cfg: cfg}
	d.live.Store(d.startLive)
	d.metrics = metrics.New(d.metricsSnapshot)
	d.feed = dashboard.NewFeed(0)
	return d, nil
}

// Run serves the API on ln until ctx ends. It answers at once (health says
// "starting") while it brings the backend up in the background, and calls
// ready once requests can be answered. Errors in the configuration, the
// store or the codex end Run; a backend that is down or lacks the model
// does not: the daemon keeps trying and says why in every answer.
//
// When ctx ends Run stops in this order: it stops bringing the backend up;
// stops accepting connections and lets running requests finish for
// daemon.shutdown_grace; stops the ones still running (each gets a final
// error event saying its answer was not recorded) and waits for their
// handlers; closes the codex service (watchers, index); stops the backend
// and its tokenizer; and closes the store last, so nothing a request does
// finds it closed.
func (d *Daemon) Run(ctx context.Context, ln net.Listener, ready func()) error {
	if err := d.checkCodex(); err != nil {
		return err
	}
	unlock, err := lockStateDir(d.cfg.Daemon.StateDir, d.log)
	if err != nil {
		return err
	}
	defer unlock()
	closeStore, err := d.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if k, ok := d.store.(ctxd.KarmaStore); ok && d.cfg.Karma.Enabled {
		d.karma = k
	}
	d.openSensor()
	defer d.closeSensor()
	// The probe reads the hardware on its ticker until the daemon stops.
	probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		if err := d.probe.Run(probeCtx); err != nil {
			d.log.Warn("hardware probe", "err", err)
		}
	}()
	defer func() { stopProbe(); <-probeDone }()
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watchDone, bandsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		d.watchPressure(watchCtx, max(time.Second, d.cfg.Env.Interval.Duration))
	}()
	go func() {
		defer close(bandsDone)
		d.watchBands(watchCtx, time.Second)
	}()
	stopWatching := sync.OnceFunc(func() { stopWatch(); <-watchDone; <-bandsDone })
	defer stopWatching()
	countCtx, stopCount := context.WithCancel(context.WithoutCancel(ctx))
	d.sessions.start(countCtx, d.store, d.log)
	defer func() { stopCount(); d.sessions.wait() }()

	api := httpapi.New(d.apiConfig(), d)
	d.api.Store(api)
	// A socket whose file is removed is made again (relisten.go).
	ln = d.keepSocket(ln)
	defer ln.Close()
	if err := api.Serve(ln); err != nil {
		return err
	}

	initCtx, stopInit := context.WithCancel(ctx)
	defer stopInit()
	initDone := make(chan error, 1)
	go func() { initDone <- d.bringUp(initCtx, ready) }()

	initEnded := false
	select {
	case <-ctx.Done():
	case err = <-api.Err():
	case err = <-initDone:
		initEnded = true
		if err == nil { // ready: serve until the stop
			select {
			case <-ctx.Done():
			case err = <-api.Err():
			}
		}
	}
	d.log.Info("shutting down", "grace", d.cfg.Daemon.ShutdownGrace.Duration)
	stopInit()
	if !initEnded {
		<-initDone // cancelled: whatever it had opened is closed
	}
	api.Shutdown(d.cfg.Daemon.ShutdownGrace.Duration)
	stopWatching() // it evacuates personas: not while they close
	if ps := d.personas.Swap(nil); ps != nil {
		def := d.ready.Load()
		for _, e := range ps.pool.Close() { // loads under way end first
			if e == def {
				continue // closed below
			}
			if cerr := e.Close(); cerr != nil {
				d.log.Warn("request path", "persona", e.Model.Info.Model, "err", cerr)
			}
		}
	}
	if e := d.ready.Swap(nil); e != nil {
		if cerr := e.Close(); cerr != nil {
			d.log.Warn("request path", "err", cerr)
		}
	}
	if httpapi.IsClosed(err) || ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// apiConfig is the HTTP surface's configuration.
func (d *Daemon) apiConfig() httpapi.Config {
	roots := d.cfg.Codex.LoadRoots
	if d.cfg.Codex.Path != "" {
		roots = append([]string{d.cfg.Codex.Path}, roots...)
	}
	return httpapi.Config{Daemon: d.cfg.Daemon, LoadRoots: roots, Version: d.version, Sigils: d.sigils,
		Store: d.store, Karma: d.karma, KarmaBounds: d.cfg.Karma, Sensor: d.sensor, Metrics: d.metrics, Feed: d.feed, Logger: d.log}
}

// checkCodex fails fast on a codex path or settings file that cannot work.
func (d *Daemon) checkCodex() error {
	if d.cfg.Codex.Path == "" {
		return nil
	}
	if _, err := os.Stat(d.cfg.Codex.Path); err != nil {
		return fmt.Errorf("daemon: codex.path: %w", err)
	}
	_, found, err := codex.LoadSettings(d.cfg.Codex.Path, nil)
	if err != nil || !found {
		return err
	}
	lim, err := codexLimits(d.cfg.Codex.Path)
	if err != nil {
		return err
	}
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	if cur := d.live.Load(); !cur.reloaded { // a reload already read them
		d.live.Store(&live{cfg: cur.cfg, codexLim: lim})
	}
	d.startLive = &live{cfg: d.cfg, codexLim: lim}
	d.log.Info("codex settings", "file", codex.SettingsFile, "limits", fmt.Sprintf("%+v", lim))
	return nil
}

// openStore opens the session store (unless one was given) and returns
// what closes it.
func (d *Daemon) openStore(ctx context.Context) (func(), error) {
	if d.opts.Store != nil {
		d.store = d.opts.Store
		return func() {}, nil
	}
	// The store opens whatever ctx says: a stop during start-up is handled
	// after the server has started, like any other stop.
	if d.cfg.Store.Kind == "postgres" {
		maxConns := d.cfg.Store.MaxConns
		if maxConns == 0 && !strings.Contains(d.cfg.Store.URL, "pool_max_conns") {
			maxConns = 8 // store.max_conns's default, unless the URL sets the pool's size
		}
		if u, err := url.Parse(d.cfg.Store.URL); err == nil && u.User != nil {
			if _, has := u.User.Password(); has {
				d.log.Warn("store.url holds a password: anyone who can read the configuration reads it; PGPASSWORD or a ~/.pgpass file keep it out")
			}
		}
		s, err := pgstore.OpenWith(context.WithoutCancel(ctx), d.cfg.Store.URL, pgstore.OpenOptions{MaxConns: maxConns})
		if err != nil {
			return nil, err
		}
		d.store = s
		return func() { s.Close() }, nil
	}
	s, err := sqlite.Open(context.WithoutCancel(ctx), filepath.Join(d.cfg.Daemon.StateDir, "ctxd.db"))
	if err != nil {
		return nil, err
	}
	d.store = s
	return func() {
		if err := s.Close(); err != nil {
			d.log.Warn("session store", "err", err)
		}
	}, nil
}

// openSensor opens the hardware probe, which plans the window, and makes
// it the sensor of the environment bands unless one was given.
func (d *Daemon) openSensor() {
	// Run reads on its ticker; requests answer from the latest reading.
	env := d.cfg.Env
	hc := hostenv.Config{NVML: nvml.New(), Logger: d.log, MaxAge: env.Interval.Duration,
		Interval: env.Interval.Duration, Thresholds: env.Thresholds()}
	if env.CheckBackend {
		hc.Reachable = d.backendReachable
	}
	d.probe = hostenv.New(hc)
	d.sensor = d.probe
	if d.opts.Sensor != nil {
		d.sensor = d.opts.Sensor
	}
}

func (d *Daemon) closeSensor() { d.probe.Close() }

// backendReachable is nil when the backend answers (or is not up yet:
// that is the start-up's to report, not connectivity's).
func (d *Daemon) backendReachable(ctx context.Context) error {
	e := d.ready.Load()
	if e == nil {
		return nil
	}
	switch b := e.Model.Backend.(type) {
	case interface{ Ping(context.Context) error }:
		return b.Ping(ctx)
	case interface{ Health(context.Context) error }:
		return b.Health(ctx)
	}
	return nil
}

// bringUp brings the backend up, retrying with backoff until it works, a
// configuration error says it never will, or ctx ends.
func (d *Daemon) bringUp(ctx context.Context, ready func()) error {
	backoff := time.Second
	for {
		err := d.start(ctx)
		if err == nil {
			d.initErr.Store(nil)
			if ready != nil {
				ready()
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ctxd.KindOf(err) == ctxd.KindInvalid {
			d.log.Error("the configuration cannot work; stopping", "err", err)
			return err
		}
		msg := err.Error()
		d.initErr.Store(&msg)
		d.log.Error("backend not ready; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// start makes one attempt: open the backend, then build the request path
// on it and load the codex. A failed attempt leaves nothing open.
func (d *Daemon) start(ctx context.Context) error {
	open := d.opts.Open
	if open == nil {
		open = bringup.Open(bringup.Config{Backend: d.cfg.Backend, Limits: d.cfg.Limits, StateDir: d.cfg.Daemon.StateDir,
			Env: d.opts.BackendEnv, Memory: d.probe, Formats: d.formatters, Logger: d.log, MaxLoaded: 1 + len(d.cfg.Personas),
			Critical: func() bool { return d.sensor.Environment().VRAM == "critical" }})
	}
	onRestart := func() {
		if cur := d.ready.Load(); cur != nil {
			cur.Sched.Forget()
		}
		// On Ollama every persona's model was on the server that restarted.
		if ps := d.personas.Load(); ps != nil && d.cfg.Backend.Kind == "ollama" {
			for _, name := range ps.pool.Names()[1:] {
				if e, ok := ps.pool.Peek(name); ok {
					e.Sched.Forget()
				}
			}
		}
	}
	began := time.Now()
	m, err := open(ctx, onRestart)
	if err != nil {
		return err
	}
	lv, limits := d.startLimits(m.Window.NumCtx)
	// engine.New refuses limits that do not fit the window (the
	// orchestrator checks them; KindInvalid: the daemon stops) and closes
	// m when it fails.
	e, err := engine.New(ctx, d.engineConfig(d.cfg, limits), m)
	if err != nil {
		return err
	}
	ps, err := d.newPersonas(e, time.Since(began))
	if err != nil {
		e.Close()
		return err
	}
	d.personas.Store(ps)
	// Ready under reloadMu: a reload either ran before (and its limits are
	// applied here) or runs after and finds the engine.
	d.reloadMu.Lock()
	d.ready.Store(e)
	if now := d.live.Load(); now != lv {
		if err := d.applyLimits(ctx, e, now); err != nil {
			msg := fmt.Sprintf("the limits of a reload during start-up were not applied: %v", err)
			d.log.Error("reload: " + msg)
			d.lastReload.Store(&httpapi.ReloadStatus{At: time.Now(), File: d.opts.ConfigPath, Error: msg})
		}
	}
	d.reloadMu.Unlock()
	info := m.Info
	d.log.Info("ready", "backend", info.URL, "version", info.Version, "model", info.Model, "num_ctx", info.NumCtx, "slots", e.Sched.Slots())
	return nil
}

// engineConfig is the request path's configuration for c (the daemon's,
// or a persona's) under limits.
func (d *Daemon) engineConfig(c config.Config, limits governor.Limits) engine.Config {
	log, persona := d.log, ""
	if len(d.cfg.Personas) > 0 { // several: each line says whose
		log, persona = log.With("persona", c.Backend.Model), c.Backend.Model
	}
	return engine.Config{
		Identity: runcontext.Identity{Name: c.Identity.Name, Persona: c.Identity.Persona},
		Codex:    c.Codex, Karma: c.Karma, LowPowerAnswerReserve: c.Limits.LowPowerAnswerReserve,
		EditsLast: c.Backend.CacheReuse > 0,
		StateDir:  c.Daemon.StateDir, StoreTimeout: c.Daemon.StoreTimeout.Duration,
		MaxAsksPerSigil: c.Daemon.MaxAsksPerSigil, MaxSessionsPerSigil: c.Daemon.MaxSessionsPerSigil, SharedStore: c.Store.Shared(),
		LeaveOutTools: c.Daemon.DisallowedTools == "leave_out", Limits: limits, Sigils: d.sigils, Formatters: d.formatters,
		Store: d.store, KarmaStore: d.karma, Sensor: d.sensor,
		Observe: func(_ context.Context, sigil string, sum *ctxd.Summary) {
			d.metrics.Answer(sum)
			d.feed.Record(sigil, persona, *sum, time.Now())
		},
		Spent: d.metrics.Spent,
		OnCodex: func(plan ctxd.CodexPlan) {
			if api := d.api.Load(); api != nil {
				api.PublishCodex(plan)
			}
		},
		Logger: log,
	}
}

// startLimits are the limits a start puts in force on a window of numCtx
// tokens, and the live configuration they come from. A reload before the
// model's window was known may have set limits that do not fit it: the
// start's stay in force then, and status says so.
func (d *Daemon) startLimits(numCtx int) (*live, governor.Limits) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	lv := d.live.Load()
	limits := lv.limits(numCtx)
	if err := limits.Validate(); err != nil && lv.reloaded {
		msg := fmt.Sprintf("the reloaded limits do not fit the model's window (%v); the limits read at start are in force", err)
		d.log.Error("reload: "+msg, "num_ctx", numCtx)
		d.lastReload.Store(&httpapi.ReloadStatus{At: time.Now(), File: d.opts.ConfigPath, Error: msg})
		fixed := *lv
		fixed.cfg.Limits, fixed.codexLim = d.startLive.cfg.Limits, d.startLive.codexLim
		lv = &fixed
		d.live.Store(lv)
		limits = lv.limits(numCtx)
	}
	return lv, limits
}

// MetricsAddr is the metrics listener's address ("" when there is none).
func (d *Daemon) MetricsAddr() string {
	if api := d.api.Load(); api != nil {
		return api.MetricsAddr()
	}
	return ""
}

// DashboardAddr is the dashboard listener's address ("" when there is
// none).
func (d *Daemon) DashboardAddr() string {
	if api := d.api.Load(); api != nil {
		return api.DashboardAddr()
	}
	return ""
}

// TCPAddr is the TCP listener's address ("" when there is none yet).
func (d *Daemon) TCPAddr() string {
	if api := d.api.Load(); api != nil {
		return api.TCPAddr()
	}
	return ""
}

// Engine is the request path, or an error of kind KindUnavailable saying
// why there is none yet.
func (d *Daemon) Engine() (*engine.Engine, error) {
	if e := d.ready.Load(); e != nil {
		return e, nil
	}
	if msg := d.initErr.Load(); msg != nil {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "backend not ready: %s", *msg)
	}
	return nil, ctxd.Errorf(ctxd.KindUnavailable, "backend is starting")
}

// LogLevel is the log's level now.
func (d *Daemon) LogLevel() slog.Level { return d.level.Level() }

// SetLogLevel changes the log's level at once (SIGUSR1 and the log-level
// API); a reload sets it back to daemon.log_level.
func (d *Daemon) SetLogLevel(l slog.Level) {
	if old := d.level.Level(); old != l {
		d.level.Set(l)
		d.log.Warn("log level changed", "from", strings.ToLower(old.String()), "to", strings.ToLower(l.String()))
	}
}

// watchBands records each change of the environment bands in the
// dashboard's feed, until ctx ends. The sensor answers from its latest
// reading, so a look is cheap.
func (d *Daemon) watchBands(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	d.feed.NoteEnvironment(d.sensor.Environment(), time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			d.feed.NoteEnvironment(d.sensor.Environment(), now)
		}
	}
}
