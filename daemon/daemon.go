package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
)

// Options are the daemon's inputs besides its configuration.
type Options struct {
	Logger  *slog.Logger
	Version string
	// BackendEnv is the environment (KEY=VALUE) a managed backend inherits,
	// e.g. PATH; main passes it so nothing below main reads the environment.
	BackendEnv []string
}

// Daemon is one running ctxd.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	version string
	env     []string

	store    *sqlite.Store
	probe    *hostenv.Probe
	sigils   *sigils.Registry
	codexLim governor.Limits // the codex's own limits (.ctxd.toml); they only tighten

	codexSyncState
	runCtx context.Context // Run's context, for work that outlives a request

	mu      sync.RWMutex // guards the fields below, set once the backend is ready
	codex   *codexSet
	tokID   string // identifies the tokenizer (the model file), for the codex cache
	orch    *orchestrator.Orchestrator
	backend BackendInfo
	plan    governor.WindowPlan
	facts   governor.ModelFacts
	limits  governor.Limits
	initErr error
	server  *ollama.Server
	tok     *llamatok.Tokenizer
}

// BackendInfo describes the backend once it is ready.
type BackendInfo struct {
	Mode         string `json:"mode"`
	URL          string `json:"url"`
	Version      string `json:"version"`
	Model        string `json:"model"`
	Architecture string `json:"architecture"`
	TrainedCtx   int    `json:"trained_context_length"`
	NumCtx       int    `json:"num_ctx"`
	Restarts     int    `json:"restarts,omitempty"`
	KVCacheType  string `json:"kv_cache_type"`
}

// New checks the configuration and returns a daemon ready to Run.
func New(cfg config.Config, opts Options) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	scopes := map[string][]string{}
	for name, s := range cfg.Sigils {
		scopes[name] = s.Scopes
	}
	reg, err := sigils.NewRegistry(scopes, cfg.Daemon.DefaultSigil)
	if err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Daemon{cfg: cfg, log: opts.Logger, version: opts.Version, env: opts.BackendEnv, sigils: reg}, nil
}

// Run serves the API on ln until ctx ends. It answers at once (health says
// "starting") while it brings the backend up in the background, and calls
// ready once requests can be answered. Errors in the configuration, the
// store or the codex end Run; a backend that is down or lacks the model
// does not: the daemon keeps trying and says why in every answer.
func (d *Daemon) Run(ctx context.Context, ln net.Listener, ready func()) error {
	d.runCtx = ctx
	var err error
	if err := d.checkCodex(); err != nil {
		return err
	}
	// The store opens whatever ctx says: a stop during start-up is handled
	// below, after the server has started, like any other stop.
	if d.store, err = sqlite.Open(context.WithoutCancel(ctx), filepath.Join(d.cfg.Daemon.StateDir, "ctxd.db")); err != nil {
		return err
	}
	defer d.store.Close()
	// Bands move slowly (and with hysteresis): a reading a second old is as
	// good as a new one, and spares every request the probing.
	d.probe = hostenv.New(hostenv.Config{NVML: nvml.New(), Logger: d.log, MaxAge: time.Second})
	defer d.probe.Close()

	reqCtx, cancelRequests := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRequests()
	srv := &http.Server{
		Handler:           d.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	d.log.Info("listening", "socket", ln.Addr().String())

	initDone := make(chan struct{})
	go func() {
		defer close(initDone)
		d.initBackendLoop(ctx, ready)
	}()

	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	d.log.Info("shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutCtx); serr != nil {
		d.log.Warn("streams still open at shutdown deadline; cancelling them", "err", serr)
		cancelRequests()
		srv.Close()
	}
	<-initDone
	d.watchers.Wait() // they end with ctx
	d.closeBackend()
	d.codexMu.Lock()
	if d.index != nil {
		d.index.Close()
	}
	d.codexMu.Unlock()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// checkCodex fails fast on a codex path or settings file that cannot work.
func (d *Daemon) checkCodex() error {
	if d.cfg.Codex.Path == "" {
		return nil
	}
	if _, err := os.Stat(d.cfg.Codex.Path); err != nil {
		return fmt.Errorf("daemon: codex.path: %w", err)
	}
	settings, found, err := codex.LoadSettings(d.cfg.Codex.Path)
	if err != nil {
		return err
	}
	if found {
		l := settings.Limits
		d.codexLim = governor.Limits{MaxChars: l.MaxChars, AnswerReserve: l.AnswerReserve, MaxDepth: l.MaxDepth, CompactTo: l.CompactTo}
		d.log.Info("codex settings", "file", codex.SettingsFile, "limits", fmt.Sprintf("%+v", d.codexLim))
	}
	return nil
}

func (d *Daemon) identity() runcontext.Identity {
	return runcontext.Identity{Name: d.cfg.Identity.Name, Persona: d.cfg.Identity.Persona}
}

// initBackendLoop brings the backend up, retrying with backoff until it
// works or ctx ends.
func (d *Daemon) initBackendLoop(ctx context.Context, ready func()) {
	backoff := time.Second
	for {
		err := d.initBackend(ctx)
		if err == nil {
			if d.cfg.Codex.Path != "" && d.cfg.Codex.Watch {
				d.watch(ctx, d.cfg.Codex.Path)
			}
			if ready != nil {
				ready()
			}
			return
		}
		d.mu.Lock()
		d.initErr = err
		d.mu.Unlock()
		d.log.Error("backend not ready; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (d *Daemon) initBackend(ctx context.Context) error {
	b := d.cfg.Backend
	info := BackendInfo{Mode: b.Mode, Model: b.Model}
	var base *url.URL
	d.mu.Lock()
	server := d.server
	d.mu.Unlock()
	switch {
	case b.Mode == "managed" && server == nil:
		dir := filepath.Join(d.cfg.Daemon.StateDir, "ollama")
		s, err := ollama.Start(ctx, ollama.ServeConfig{
			Binary: b.Binary, Addr: b.Listen,
			ModelsDir: filepath.Join(dir, "models"), HomeDir: filepath.Join(dir, "home"),
			LogPath: filepath.Join(dir, "ollama.log"),
			Env:     append(d.env, kvCacheEnv(d.cfg.Limits.KVCacheType)...),
			Logger:  d.log,
			OnRestart: func() {
				if o := d.orchestrator(); o != nil {
					o.BackendRestarted()
				}
			},
		})
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.server = s
		d.mu.Unlock()
		base = s.URL()
	case b.Mode == "managed":
		base = server.URL()
	default:
		u, err := url.Parse(b.URL)
		if err != nil {
			return fmt.Errorf("daemon: backend.url: %w", err)
		}
		base = u
	}
	info.URL = base.String()

	probe := ollama.New(base, b.Model, ollama.LoadOptions{})
	v, err := probe.Version(ctx)
	if err != nil {
		return err
	}
	info.Version = v
	if b.Mode == "managed" && b.GGUF != "" {
		d.log.Info("importing model", "model", b.Model, "gguf", b.GGUF)
		if err := probe.Import(ctx, b.GGUF); err != nil {
			return err
		}
	}
	facts, err := probe.Facts(ctx)
	if err != nil {
		return err
	}
	info.Architecture, info.TrainedCtx = facts.Architecture, facts.ContextLength
	mf, plan, err := d.planWindow(facts)
	if err != nil {
		return err
	}
	info.NumCtx, info.KVCacheType = plan.NumCtx, string(plan.CacheType)
	limits := governor.Limits{
		MaxChars: d.cfg.Limits.MaxChars, NumCtx: plan.NumCtx, AnswerReserve: d.cfg.Limits.AnswerReserve,
		MaxDepth: d.cfg.Limits.MaxDepth, CompactTo: d.cfg.Limits.CompactTo,
	}.Tighten(d.codexLim)
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	client := ollama.New(base, b.Model, ollama.LoadOptions{
		NumCtx: info.NumCtx, NumBatch: b.NumBatch, NumThread: b.NumThread, KeepAlive: b.KeepAlive.Duration,
	})
	tok, err := llamatok.Open(facts.GGUFPath)
	if err != nil {
		return fmt.Errorf("daemon: tokenizer for %s: %w", b.Model, err)
	}
	ready := false
	defer func() {
		if !ready { // a failed attempt leaves nothing open; the next one starts over
			d.mu.Lock()
			if d.tok == tok {
				d.tok = nil
			}
			d.mu.Unlock()
			tok.Close()
		}
	}()
	d.log.Info("loading model", "model", b.Model, "num_ctx", info.NumCtx, "num_batch", b.NumBatch,
		"kv_cache", plan.CacheType, "kv_bytes", plan.KVBytes, "plan", plan.Reason)
	if err := client.Load(ctx); err != nil {
		return err
	}
	d.mu.Lock()
	d.tok, d.limits, d.tokID = tok, limits, filepath.Base(facts.GGUFPath)
	d.mu.Unlock()
	codexState := orchestrator.CodexState{Block: runcontext.Codex{Mode: runcontext.ModeNone},
		Plan: governor.CodexPlan{Mode: runcontext.ModeNone, Reason: "no codex configured"}}
	var set *codexSet
	if d.cfg.Codex.Path != "" {
		if set, err = d.loadCodex(ctx, d.cfg.Codex.Path, nil); err != nil {
			return err
		}
		codexState = set.state
	}
	orch, err := orchestrator.New(orchestrator.Config{
		Identity: d.identity(),
		Codex:    codexState,
		Limits:   limits,
		KVBytes:  func(n int) int64 { return mf.KVBytes(plan.CacheType, n) },
		Sigils:   d.sigils,
		Slot:     info.URL + "/" + b.Model,
		Logger:   d.log,
	}, &ollamaBackend{client: client, temperature: b.Temperature, seed: b.Seed}, tok, d.store, d.probe)
	if err != nil {
		return err
	}
	ready = true
	d.mu.Lock()
	d.orch, d.backend, d.initErr, d.codex = orch, info, nil, set
	d.plan, d.facts = plan, mf
	d.mu.Unlock()
	d.log.Info("ready", "backend", info.URL, "version", info.Version, "model", b.Model, "num_ctx", info.NumCtx)
	return nil
}

// planWindow reads the model's facts and the memory there is, and chooses
// num_ctx for this load.
func (d *Daemon) planWindow(facts ollama.Facts) (governor.ModelFacts, governor.WindowPlan, error) {
	mf, err := governor.FactsFromModelInfo(facts.Info)
	if err != nil {
		return mf, governor.WindowPlan{}, err
	}
	if info, err := os.Stat(facts.GGUFPath); err == nil {
		mf.WeightsBytes = info.Size()
	}
	reading := d.probe.Read()
	cacheType, _ := governor.ParseCacheType(d.cfg.Limits.KVCacheType) // validated with the config
	if cacheType != governor.CacheF16 && reading.GPUs == 0 {
		d.log.Warn("a quantized KV cache needs flash attention, which Ollama enables on GPUs only; budgeting f16", "configured", cacheType)
		cacheType = governor.CacheF16
	}
	b := d.cfg.Backend
	plan, err := governor.PlanWindow(governor.PlanRequest{
		Facts: mf, CacheType: cacheType,
		Memory:    governor.Memory{Source: reading.Source, Total: reading.TotalBytes, Free: reading.FreeBytes},
		Headroom:  int64(d.cfg.Limits.MemoryHeadroomMB) << 20,
		Requested: b.NumCtx, Max: b.MaxNumCtx, Min: 2*d.cfg.Limits.AnswerReserve + 256,
	})
	if err != nil {
		return mf, plan, err
	}
	d.log.Info("window planned", "num_ctx", plan.NumCtx, "kv_cache", plan.CacheType, "kv_bytes", plan.KVBytes,
		"weights_bytes", plan.WeightsBytes, "memory_source", reading.Source, "free_bytes", reading.FreeBytes, "reason", plan.Reason)
	return mf, plan, nil
}

// kvCacheEnv is the managed server's environment for a KV cache type:
// Ollama quantizes the cache only with flash attention on.
func kvCacheEnv(cacheType string) []string {
	if cacheType == "" || cacheType == string(governor.CacheF16) {
		return nil
	}
	return []string{"OLLAMA_FLASH_ATTENTION=1", "OLLAMA_KV_CACHE_TYPE=" + cacheType}
}

func (d *Daemon) orchestrator() *orchestrator.Orchestrator {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.orch
}

func (d *Daemon) closeBackend() {
	d.mu.Lock()
	server, tok := d.server, d.tok
	d.server, d.tok, d.orch = nil, nil, nil
	d.mu.Unlock()
	if tok != nil {
		tok.Close()
	}
	if server != nil {
		server.Close()
		d.log.Info("managed ollama stopped")
	}
}
