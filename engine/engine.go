package engine

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/codexsvc"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/metrics"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// Engine is the request path on one model load. Its fields are set by New
// and never change; each is safe for concurrent use.
type Engine struct {
	Model *bringup.Model
	Sched *scheduler.Scheduler
	Orch  *orchestrator.Orchestrator
	Codex *codexsvc.Service
	Since time.Time // when it became ready
	log   *slog.Logger

	evacMu sync.Mutex  // guards saved
	saved  []savedSlot // what Evacuate saved, for Restore
}

// savedSlot is a slot Evacuate saved to a file.
type savedSlot struct {
	held scheduler.Held
	file string
}

// Config is what the request path is built from besides the model.
type Config struct {
	Identity runcontext.Identity
	Codex    config.Codex // the codex to load at once (Path "": none) and how
	// EditsLast: the backend shifts cached chunks past a change
	// (backend.cache_reuse), so an edit moves the changed files to the
	// codex's end (codex.Options.EditsLast).
	EditsLast bool
	Karma     config.Karma
	// LowPowerAnswerReserve caps answers while on low power (0: no cap).
	LowPowerAnswerReserve int
	StateDir              string          // the codex's caches and index go here
	StoreTimeout          time.Duration   // bounds each store call of a request (0: the orchestrator's default)
	MaxAsksPerSigil       int             // requests one sigil may have in flight (0: no bound)
	MaxSessionsPerSigil   int             // sessions one sigil may hold (0: no bound)
	SharedStore           bool            // other daemons write the store too (orchestrator.Config.SharedStore)
	LeaveOutTools         bool            // tools a sigil may not offer are left out and listed, not refused
	Limits                governor.Limits // the governor's limits on this model's window
	Sigils                *sigils.Registry
	Formatters            *formatters.Registry
	Store                 ctxd.Store
	KarmaStore            ctxd.KarmaStore // nil: no karma
	Sensor                ctxd.Sensor
	// Observe is told of every answer's summary; nil: nobody.
	Observe func(ctx context.Context, sigil string, sum *ctxd.Summary)
	// Spent is told of what the backend read for a request that ended
	// without an answer (orchestrator.Config.Spent); nil: nobody.
	Spent func(evaluated, reused int)
	// OnCodex is told of every new codex, once requests see it; nil: nobody.
	OnCodex func(plan ctxd.CodexPlan)
	Logger  *slog.Logger
}

// New builds the request path on m and loads the configured codex. It
// takes m: Close closes it, and so does a New that fails.
func New(ctx context.Context, cfg Config, m *bringup.Model) (_ *Engine, err error) {
	e := &Engine{Model: m, log: cfg.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if m.Format == nil {
		m.Format = runcontext.Plain{}
	}
	counter := tokencount.New(m.Tokenizer, cfg.Logger)
	e.Sched = scheduler.New(scheduler.Options{Slots: m.Window.Slots, LeastRecentTies: m.ChoosesSlots})
	if e.Orch, err = newOrchestrator(cfg, e, counter); err != nil { // limits that do not fit the window among them
		return nil, ctxd.Errorf(ctxd.KindInvalid, "%w", err)
	}
	walk := cfg.Codex.WalkOptions()
	walk.EditsLast = cfg.EditsLast
	e.Codex = codexsvc.New(codexsvc.Config{
		Settings: codexsvc.Settings{Walk: walk, CAGRatio: cfg.Codex.CAGRatio, Watch: cfg.Codex.Watch,
			AllowRedactOff: cfg.Codex.AllowCodexRedactOff},
		StateDir: cfg.StateDir, Limits: cfg.Limits,
		Tokenizer: m.Tokenizer, TokenizerID: m.TokenizerID, Counter: counter,
		Specials: m.Format.Specials(), Sink: sink{next: e.Orch, onCodex: cfg.OnCodex}, Logger: cfg.Logger,
		Stable: e.Orch.StableBlocks,
	})
	if cfg.Codex.Path != "" {
		if _, err := e.Codex.Load(ctx, cfg.Codex.Path, nil); err != nil {
			return nil, err
		}
	}
	e.Since = time.Now()
	return e, nil
}

// newOrchestrator is the orchestrator of e's model, reading codex files
// through e's codex service.
func newOrchestrator(cfg Config, e *Engine, counter *tokencount.Counter) (*orchestrator.Orchestrator, error) {
	m := e.Model
	mf, cacheType := m.Facts, m.Window.CacheType
	kvBytes := func(n int) int64 { return mf.KVBytes(cacheType, n) }
	if len(mf.HeadCountKV) == 0 { // layer shapes unknown: not reported, rather than 0
		kvBytes = nil
	}
	k := cfg.Karma
	return orchestrator.New(orchestrator.Config{
		Identity: cfg.Identity,
		Format:   m.Format,
		Limits:   cfg.Limits,
		KVBytes:  kvBytes,
		Sigils:   cfg.Sigils,
		TopK:     cfg.Codex.TopK,
		Warm:     m.Warm,
		Karma: orchestrator.KarmaConfig{Store: cfg.KarmaStore, Model: m.Info.Model, Options: karma.Options{
			TopK: k.TopK, MaxChars: k.MaxChars, MaxEntryChars: k.MaxEntryChars, HalfLife: k.HalfLife.Duration}},
		LowPowerReserve: cfg.LowPowerAnswerReserve,
		StoreTimeout:    cfg.StoreTimeout,
		LeaveOutTools:   cfg.LeaveOutTools,
		MaxAsksPerSigil: cfg.MaxAsksPerSigil, MaxSessionsPerSigil: cfg.MaxSessionsPerSigil, SharedStore: cfg.SharedStore,
		Room:       room{e},
		Observe:    cfg.Observe,
		Spent:      cfg.Spent,
		Formatters: cfg.Formatters,
		CodexFile: func(path string) (string, error) {
			f, err := e.Codex.File(path)
			if ctxd.KindOf(err) == ctxd.KindNotFound {
				return "", fmt.Errorf("%w: %v", fs.ErrNotExist, err)
			}
			return f.Content, err
		},
		Logger: cfg.Logger,
	}, m.Backend, counter, cfg.Store, cfg.Sensor, e.Sched)
}

// SetLimits puts new limits in force: the codex is planned against them
// first, and requests get them once it is. An error leaves the old ones.
func (e *Engine) SetLimits(ctx context.Context, l governor.Limits) error {
	if err := e.Codex.SetLimits(ctx, l); err != nil {
		return err
	}
	return e.Orch.SetLimits(l)
}

// evacuatedPrefix names the files Evacuate saves slots to (not the warm
// restarts' ctxd-*.bin, which live on).
const evacuatedPrefix = "evacuated-slot-"

// Evacuate gives the model's memory back: it saves every slot that holds a
// conversation to a file and stops the model's server. The request path
// stays (its codex, tokenizer and sessions); Restore brings the server and
// the slots back. No request may run meanwhile: the caller sees to it. A
// slot that cannot be saved is lost (its next request evaluates it), not
// an error.
func (e *Engine) Evacuate(ctx context.Context) error {
	if e.Model.Suspend == nil || e.Model.Resume == nil {
		return ctxd.Errorf(ctxd.KindUnsupported, "engine: this backend cannot be evacuated (ctxd does not run its server)")
	}
	e.evacMu.Lock()
	defer e.evacMu.Unlock()
	var saved []savedSlot
	if w := e.Model.Warm; w != nil {
		for _, h := range e.Sched.Snapshot() {
			name := fmt.Sprintf("%s%d.bin", evacuatedPrefix, h.Slot)
			n, err := w.Store.SaveSlot(ctx, h.Slot, name)
			if err != nil || n < len(h.Tokens) {
				e.log.Warn("slot not saved before evacuation; its next request evaluates it", "slot", h.Slot, "tokens", len(h.Tokens), "saved", n, "err", err)
				continue
			}
			saved = append(saved, savedSlot{held: h, file: name})
		}
	}
	e.Sched.Forget()
	if err := e.Model.Suspend(ctx); err != nil {
		return fmt.Errorf("engine: stop the model's server: %w", err)
	}
	e.saved = saved
	e.log.Info("evacuated", "model", e.Model.Info.Model, "slots_saved", len(saved))
	return nil
}

// Restore starts an evacuated model's server again and restores the slots
// Evacuate saved; a slot that does not come back whole is evaluated by its
// next request.
func (e *Engine) Restore(ctx context.Context) error {
	if e.Model.Resume == nil {
		return ctxd.Errorf(ctxd.KindUnsupported, "engine: this backend cannot be restored")
	}
	e.evacMu.Lock()
	defer e.evacMu.Unlock()
	if err := e.Model.Resume(ctx); err != nil {
		return fmt.Errorf("engine: start the model's server again: %w", err)
	}
	restored := 0
	for _, s := range e.saved {
		n, err := e.Model.Warm.Store.RestoreSlot(ctx, s.held.Slot, s.file)
		if err != nil || n < len(s.held.Tokens) {
			e.log.Warn("slot not restored; its next request evaluates it", "slot", s.held.Slot, "tokens", len(s.held.Tokens), "restored", n, "err", err)
		} else {
			e.Sched.Put(s.held)
			restored++
		}
		if e.Model.Warm.Dir != "" {
			_ = os.Remove(filepath.Join(e.Model.Warm.Dir, s.file))
		}
	}
	e.log.Info("restored", "model", e.Model.Info.Model, "slots_restored", restored, "of", len(e.saved))
	e.saved = nil
	return nil
}

// OnDisk is what Evacuate saved and Restore has not yet restored: the
// slots, the tokens they hold, and their files' bytes (0 where ctxd cannot
// see the server's slot directory).
func (e *Engine) OnDisk() (slots, tokens int, bytes int64) {
	e.evacMu.Lock()
	defer e.evacMu.Unlock()
	for _, s := range e.saved {
		slots++
		tokens += len(s.held.Tokens)
		if w := e.Model.Warm; w != nil && w.Dir != "" {
			if info, err := os.Stat(filepath.Join(w.Dir, s.file)); err == nil {
				bytes += info.Size()
			}
		}
	}
	return slots, tokens, bytes
}

// Close stops the codex service and then the model; the store is not
// the engine's.
func (e *Engine) Close() error {
	if e.Codex != nil {
		if err := e.Codex.Close(); err != nil {
			return fmt.Errorf("engine: codex service: %w", err)
		}
	}
	if e.Model != nil && e.Model.Close != nil {
		if err := e.Model.Close(); err != nil {
			return fmt.Errorf("engine: backend: %w", err)
		}
	}
	return nil
}

// room is e's codex service as the orchestrator's Room; the service is
// made after the orchestrator.
type room struct{ e *Engine }

func (r room) MakeRoom(ctx context.Context, n int) (bool, error) {
	if r.e.Codex == nil {
		return false, nil
	}
	return r.e.Codex.MakeRoom(ctx, n)
}

// sink hands each new codex to the request path, then tells OnCodex.
type sink struct {
	next    codexsvc.Sink
	onCodex func(ctxd.CodexPlan)
}

func (s sink) SetCodex(block runcontext.Codex, plan ctxd.CodexPlan, r ctxd.Retriever, limits governor.Limits) {
	s.next.SetCodex(block, plan, r, limits)
	if s.onCodex != nil {
		s.onCodex(plan)
	}
}

// FillMetrics fills the request path's gauges of a metrics scrape: ready,
// backend restarts, slots and queues, the codex. It reads snapshots only.
func (e *Engine) FillMetrics(v *metrics.Snapshot) {
	v.Ready = true
	if e.Model.Restarts != nil {
		v.BackendRestarts = e.Model.Restarts()
	}
	st := e.Sched.Status()
	v.Slots, v.SlotsBusy, v.QueuedForSlot, v.QueuedForSession = len(st.Slots), st.Busy, len(st.Waiting), st.InSessions
	if cs, ok := e.Codex.Stats(); ok {
		v.CodexMode, v.CodexLoadSeconds, v.CodexTokens = cs.Plan.Mode, cs.LoadMillis/1000, cs.Tokens
	}
}
