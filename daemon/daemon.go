package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/codexsvc"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/standard"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/metrics"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
	"github.com/ctxd/ctxd/tokencount"
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
	Open Opener
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

// Model is a backend brought up for one model load: what requests run on.
type Model struct {
	Backend     ctxd.Backend
	Tokenizer   ctxd.Tokenizer
	TokenizerID string // names the vocabulary (the model file), for the codex's count cache
	Info        BackendInfo
	Window      governor.WindowPlan
	Facts       governor.ModelFacts
	Format      runcontext.Format // how prompts are rendered; nil: the plain format
	ModelInfo   map[string]any    // the model's metadata as Ollama's /api/show has it (Ollama only); the Ollama door shows it
	// ChoosesSlots: the backend runs each request on the slot ctxd names
	// (llama-server), rather than choosing one itself (Ollama).
	ChoosesSlots bool
	// Warm turns warm restarts on: saved slots (llama-server); nil: none.
	Warm     *orchestrator.WarmConfig
	Restarts func() int   // how often a supervised backend was restarted; nil if not supervised
	Loads    func() int   // how often the backend loaded the model (from its log; -1 unreadable); nil if unknown
	Close    func() error // stops what Open started; called once, after the last request
}

// Opener brings the backend up: start or reach the model server, load the
// model with the window planned for it, open its tokenizer. It calls
// onRestart whenever the backend restarted and lost its KV cache. An error
// of kind ctxd.KindInvalid (a configuration that cannot work, such as an
// explicit num_ctx that does not fit) ends the daemon; any other is
// retried until it succeeds.
type Opener func(ctx context.Context, onRestart func()) (*Model, error)

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

	live       atomic.Pointer[live]         // what a reload may change
	startLive  *live                        // what was read at start; guarded by reloadMu
	reloadMu   sync.Mutex                   // one reload at a time
	lastReload atomic.Pointer[ReloadStatus] // nil until the first reload

	// Set in Run before anything is served; read-only afterwards.
	store  ctxd.Store
	karma  ctxd.KarmaStore // the store's traces, when it keeps them and karma is on; nil otherwise
	sensor ctxd.Sensor
	probe  *hostenv.Probe // the hardware probe: memory for the window plan, and the sensor unless one was given

	tcpAddr     atomic.Pointer[string] // the TCP listener's address, once it listens
	metricsAddr atomic.Pointer[string] // the metrics listener's address, once it listens
	ready       atomic.Pointer[engine] // nil until the backend is ready
	initErr     atomic.Pointer[string] // why it is not ready yet
	drainMu     sync.Mutex             // guards draining; handled.Add happens under it
	draining    bool                   // shutting down: new requests are refused
	handled     sync.WaitGroup         // requests being served
}

// engine is everything that exists once the backend is ready.
type engine struct {
	model  *Model
	limits governor.Limits
	sched  *scheduler.Scheduler
	orch   *orchestrator.Orchestrator
	codex  *codexsvc.Service
	hub    *hub      // WebSocket sessions' notices
	since  time.Time // when it became ready
}

// New checks the configuration and returns a daemon ready to Run.
func New(cfg config.Config, opts Options) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg, err := newSigils(cfg)
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
	return d, nil
}

// errShuttingDown is the cause with which requests still running at the
// end of the shutdown grace period are stopped.
var errShuttingDown = &ctxd.Error{Kind: ctxd.KindInterrupted,
	Message: "ctxd is shutting down and stopped the request at the end of its grace period (daemon.shutdown_grace)"}

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

	reqCtx, stopRequests := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopRequests(nil)
	// The MCP endpoint's sessions, on both listeners: closed after the drain.
	mcps := newMCPHTTP(d, ctx.Done(), reqCtx)
	defer mcps.close()
	newServer := func(tokens bool) *http.Server {
		return &http.Server{
			Handler:           d.bodyDeadline(d.routes(tokens, mcps)),
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       d.cfg.Daemon.IdleTimeout.Duration,
			BaseContext:       func(net.Listener) context.Context { return reqCtx },
			ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
		}
	}
	sock := newServer(false)
	sock.ConnContext = withPeer // the socket peer's uid and gid, checked against the sigil's
	// A socket whose file is removed is made again (relisten.go).
	ln = d.keepSocket(ln)
	defer ln.Close()
	srvs := []*http.Server{sock}
	serveErr := make(chan error, 2)
	go func() { serveErr <- serveCapped(sock, ln, d.cfg.Daemon.MaxConnections) }()
	d.log.Info("listening", "socket", ln.Addr().String())
	if addr := d.cfg.Daemon.TCPListen; addr != "" {
		tln, err := net.Listen("tcp", addr)
		if err != nil {
			srvs[0].Close()
			return fmt.Errorf("daemon: daemon.tcp_listen: %w", err)
		}
		addr := tln.Addr().String()
		d.tcpAddr.Store(&addr)
		tcp := newServer(true)
		srvs = append(srvs, tcp)
		go func() { serveErr <- serveCapped(tcp, tln, d.cfg.Daemon.MaxConnections) }()
		d.log.Info("listening", "tcp", tln.Addr().String(), "tokens", "required")
	}

	if addr := d.cfg.Daemon.MetricsListen; addr != "" {
		stopMetrics, err := d.serveMetrics(addr)
		if err != nil {
			for _, srv := range srvs {
				srv.Close()
			}
			return err
		}
		defer stopMetrics() // after the drain: a scrape during it still answers
	}

	initCtx, stopInit := context.WithCancel(ctx)
	defer stopInit()
	initDone := make(chan error, 1)
	go func() { initDone <- d.bringUp(initCtx, ready) }()

	initEnded := false
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	case err = <-initDone:
		initEnded = true
		if err == nil { // ready: serve until the stop
			select {
			case <-ctx.Done():
			case err = <-serveErr:
			}
		}
	}
	d.log.Info("shutting down", "grace", d.cfg.Daemon.ShutdownGrace.Duration)
	stopInit()
	if !initEnded {
		<-initDone // cancelled: whatever it had opened is closed
	}
	d.drain(srvs, stopRequests)
	if e := d.ready.Swap(nil); e != nil {
		if cerr := e.codex.Close(); cerr != nil {
			d.log.Warn("codex service", "err", cerr)
		}
		if cerr := e.model.Close(); cerr != nil {
			d.log.Warn("backend", "err", cerr)
		}
	}
	if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// drain stops accepting, lets requests finish within the grace period,
// then stops those still running and waits (briefly) for their handlers to
// send their final events.
func (d *Daemon) drain(srvs []*http.Server, stopRequests context.CancelCauseFunc) {
	d.drainMu.Lock()
	d.draining = true
	d.drainMu.Unlock()
	grace, cancel := context.WithTimeout(context.Background(), d.cfg.Daemon.ShutdownGrace.Duration)
	defer cancel()
	errs := make(chan error, len(srvs))
	for _, srv := range srvs {
		go func() { errs <- srv.Shutdown(grace) }()
	}
	failed := false
	for range srvs {
		if err := <-errs; err != nil {
			failed = true
		}
	}
	// Shutdown forgets hijacked connections (WebSocket sessions): their
	// handlers have the rest of the grace period too.
	if !failed && !d.waitHijacked(grace) {
		failed = true
	}
	if !failed {
		return
	}
	closeAll := func() {
		for _, srv := range srvs {
			srv.Close()
		}
	}
	d.log.Warn("requests still running at the end of the shutdown grace period; stopping them")
	stopRequests(errShuttingDown)
	if d.waitHandlers() {
		closeAll()
		return
	}
	d.log.Error("request handlers did not end after being stopped; closing their connections", "after", handlerStopTimeout)
	closeAll() // their writes fail now, and they return
	if !d.waitHandlers() {
		d.log.Error("request handlers still running; closing the backend and the store under them", "after", 2*handlerStopTimeout)
	}
}

// waitHandlers waits for the running handlers, at most handlerStopTimeout;
// false if some are still running.
func (d *Daemon) waitHandlers() bool {
	done := make(chan struct{})
	go func() { d.handled.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(handlerStopTimeout):
		return false
	}
}

// handlerStopTimeout bounds the wait for stopped handlers: a generation
// stops at once, so this is a safety net, not a policy.
const handlerStopTimeout = 3 * time.Second

// checkCodex fails fast on a codex path or settings file that cannot work.
func (d *Daemon) checkCodex() error {
	if d.cfg.Codex.Path == "" {
		return nil
	}
	if _, err := os.Stat(d.cfg.Codex.Path); err != nil {
		return fmt.Errorf("daemon: codex.path: %w", err)
	}
	_, found, err := codex.LoadSettings(d.cfg.Codex.Path)
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
	switch b := e.model.Backend.(type) {
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
func (d *Daemon) start(ctx context.Context) (err error) {
	open := d.opts.Open
	switch {
	case open != nil:
	case d.cfg.Backend.Kind == "llamacpp":
		open = d.openLlamaCpp
	default:
		open = d.openOllama
	}
	var e engine
	onRestart := func() {
		if cur := d.ready.Load(); cur != nil {
			cur.sched.Forget()
		}
	}
	if e.model, err = open(ctx, onRestart); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			if e.codex != nil {
				e.codex.Close()
			}
			e.model.Close()
		}
	}()
	d.reloadMu.Lock()
	lv := d.live.Load()
	e.limits = lv.limits(e.model.Window.NumCtx)
	if err := e.limits.Validate(); err != nil && lv.reloaded {
		// A reload before the model's window was known set limits that
		// do not fit it: the start's stay in force, and status says so.
		msg := fmt.Sprintf("the reloaded limits do not fit the model's window (%v); the limits read at start are in force", err)
		d.log.Error("reload: "+msg, "num_ctx", e.model.Window.NumCtx)
		d.lastReload.Store(&ReloadStatus{At: time.Now(), File: d.opts.ConfigPath, Error: msg})
		fixed := *lv
		fixed.cfg.Limits, fixed.codexLim = d.startLive.cfg.Limits, d.startLive.codexLim
		lv = &fixed
		d.live.Store(lv)
		e.limits = lv.limits(e.model.Window.NumCtx)
	}
	d.reloadMu.Unlock()
	if err := e.limits.Validate(); err != nil {
		return ctxd.Errorf(ctxd.KindInvalid, "daemon: %w", err)
	}
	if e.model.Format == nil {
		e.model.Format = runcontext.Plain{}
	}
	counter := tokencount.New(e.model.Tokenizer, d.log)
	e.sched = scheduler.New(scheduler.Options{Slots: e.model.Window.Slots, LeastRecentTies: e.model.ChoosesSlots})
	mf, cacheType := e.model.Facts, e.model.Window.CacheType
	kvBytes := func(n int) int64 { return mf.KVBytes(cacheType, n) }
	if len(mf.HeadCountKV) == 0 { // layer shapes unknown: not reported, rather than 0
		kvBytes = nil
	}
	e.orch, err = orchestrator.New(orchestrator.Config{
		Identity: d.identity(),
		Format:   e.model.Format,
		Limits:   e.limits,
		KVBytes:  kvBytes,
		Sigils:   d.sigils,
		TopK:     d.cfg.Codex.TopK,
		Warm:     e.model.Warm,
		Karma: orchestrator.KarmaConfig{Store: d.karma, Model: e.model.Info.Model, Options: karma.Options{
			TopK: d.cfg.Karma.TopK, MaxChars: d.cfg.Karma.MaxChars, MaxEntryChars: d.cfg.Karma.MaxEntryChars, HalfLife: d.cfg.Karma.HalfLife.Duration}},
		LowPowerReserve: d.cfg.Limits.LowPowerAnswerReserve,
		Observe:         func(_ context.Context, sum *ctxd.Summary) { d.metrics.Answer(sum) },
		Formatters:      d.formatters,
		CodexFile: func(path string) (string, error) {
			f, err := e.codex.File(path)
			if ctxd.KindOf(err) == ctxd.KindNotFound {
				return "", fmt.Errorf("%w: %v", fs.ErrNotExist, err)
			}
			return f.Content, err
		},
		Logger: d.log,
	}, e.model.Backend, counter, d.store, d.sensor, e.sched)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInvalid, "%w", err)
	}
	// WebSocket sessions hear of each new codex; they start closing when
	// ctx ends, which it does when the daemon begins to shut down.
	e.hub = newHub(ctx.Done(), d.sensor, d.log)
	e.codex = codexsvc.New(codexsvc.Config{
		Codex: d.cfg.Codex, StateDir: d.cfg.Daemon.StateDir, Limits: e.limits,
		Tokenizer: e.model.Tokenizer, TokenizerID: e.model.TokenizerID, Counter: counter,
		Specials: e.model.Format.Specials(), Sink: hubSink{next: e.orch, hub: e.hub}, Logger: d.log,
		Stable: func(c runcontext.Codex) (runcontext.Rendered, error) {
			return d.stableBlocks(e.model.Format, c)
		},
	})
	if d.cfg.Codex.Path != "" {
		if _, err := e.codex.Load(ctx, d.cfg.Codex.Path, nil); err != nil {
			return err
		}
	}
	e.since = time.Now()
	// Ready under reloadMu: a reload either ran before (and its limits are
	// applied here) or runs after and finds the engine.
	d.reloadMu.Lock()
	d.ready.Store(&e)
	if now := d.live.Load(); now != lv {
		if err := d.applyLimits(ctx, &e, now); err != nil {
			msg := fmt.Sprintf("the limits of a reload during start-up were not applied: %v", err)
			d.log.Error("reload: " + msg)
			d.lastReload.Store(&ReloadStatus{At: time.Now(), File: d.opts.ConfigPath, Error: msg})
		}
	}
	d.reloadMu.Unlock()
	info := e.model.Info
	d.log.Info("ready", "backend", info.URL, "version", info.Version, "model", info.Model, "num_ctx", info.NumCtx, "slots", e.sched.Slots())
	return nil
}

func (d *Daemon) identity() runcontext.Identity {
	return runcontext.Identity{Name: d.cfg.Identity.Name, Persona: d.cfg.Identity.Persona}
}

// stableBlocks renders the stable blocks around a codex block as a request
// of the default sigil renders them now, in the model's format.
func (d *Daemon) stableBlocks(f runcontext.Format, c runcontext.Codex) (runcontext.Rendered, error) {
	sigil, _ := d.sigils.Resolve("")
	rc := &runcontext.RunContext{Identity: d.identity(), Codex: c, Environment: d.sensor.Environment(), Sigil: sigil}
	// The stable artifacts count toward the blocks a codex shares the
	// window with (the conventions file of this codex among them).
	arts, _ := d.formatters.Apply(context.Background(), formatters.Input{RunContext: rc})
	for _, a := range arts {
		if a.Stable {
			rc.Artifacts = append(rc.Artifacts, a)
		}
	}
	return f.Render(rc)
}

// MetricsAddr is the metrics listener's address ("" when there is none).
func (d *Daemon) MetricsAddr() string {
	if a := d.metricsAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// TCPAddr is the TCP listener's address ("" when there is none yet).
func (d *Daemon) TCPAddr() string {
	if a := d.tcpAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// engine is the request path, or an error of kind KindUnavailable saying
// why there is none yet.
func (d *Daemon) engine() (*engine, error) {
	if e := d.ready.Load(); e != nil {
		return e, nil
	}
	if msg := d.initErr.Load(); msg != nil {
		return nil, ctxd.Errorf(ctxd.KindUnavailable, "backend not ready: %s", *msg)
	}
	return nil, ctxd.Errorf(ctxd.KindUnavailable, "backend is starting")
}

// bodyDeadline bounds how long a client may take to send a request's
// body (daemon.body_timeout): a connection that sends headers and then
// trickles, or stops, is cut off then, instead of holding a descriptor and
// a goroutine forever. The deadline is lifted once the body is read, so
// the answer's stream is not bound by it; requests without a body (the
// WebSocket and MCP streams among them) get none.
func (d *Daemon) bodyDeadline(next http.Handler) http.Handler {
	timeout := d.cfg.Daemon.BodyTimeout.Duration
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts its read deadline when the body ends.
type deadlineBody struct {
	io.ReadCloser
	lift   func()
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		b.lift()
	}
	return n, err
}
