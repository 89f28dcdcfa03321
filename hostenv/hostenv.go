package hostenv

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// Config says where the probe looks and how it bands. Every field may be
// left zero.
type Config struct {
	NVML       NVML                                    // nil: no GPU library
	HostMemory func() (total, avail uint64, err error) // nil: gopsutil
	Load       func() (load1 float64, err error)       // 1-minute load average; nil: gopsutil
	SysRoot    string                                  // "/" normally; tests point it at a fake tree

	// Reachable, when set, says whether the backend answers; the probe
	// calls it once a reading, with ReachTimeout, unless the kernel has no
	// default route, and counts an error as offline.
	Reachable    func(context.Context) error
	ReachTimeout time.Duration // 0: 2s

	// Thresholds say where bands change; the zero value means
	// DefaultThresholds(). Invalid ones are logged and replaced by the
	// defaults: validate them first.
	Thresholds Thresholds
	Interval   time.Duration // Run's period; 0: 1s
	// MaxAge is for callers that never start Run: Environment and Latest
	// reuse a reading this young and take a new one otherwise (0: every
	// time). Under Run they always answer from the latest reading.
	MaxAge time.Duration

	Now    func() time.Time // nil: time.Now; tests pass a fake clock
	Logger *slog.Logger
}

// Counters count readings and band changes since the probe was made. The
// first reading sets the bands and is no change.
type Counters struct {
	Readings     int `json:"readings"`    // readings banded (by Tick, Run, or on demand)
	Environment  int `json:"environment"` // readings after which the Environment differed
	VRAM         int `json:"vram"`
	GPU          int `json:"gpu"`
	Power        int `json:"power"`
	Connectivity int `json:"connectivity"`
}

// Probe reads the environment and bands it. It is safe for concurrent use.
type Probe struct {
	cfg Config
	th  Thresholds
	log *slog.Logger

	// readMu serializes readings (Tick, Read, a refresh on demand: one
	// NVML user at a time, bands updated in reading order) and guards the
	// NVML state below. A reading may take up to ReachTimeout. Lock order:
	// readMu, then mu.
	readMu    sync.Mutex
	nvmlReady bool
	nvmlDead  bool  // init failed once: host memory from then on, said once
	nvmlErr   error // why, for every later reading's note

	// mu guards the fields below. It is held only for bookkeeping, never
	// across a device call or Reachable, so Environment answers at once.
	mu         sync.Mutex
	plan       Plan
	running    bool // Run is ticking: answer from the latest reading
	vram       *Bander
	gpu        Debouncer
	power      Debouncer
	conn       Debouncer
	lowBattery bool // the low-battery hysteresis state
	readings   int
	envChanges int
	lastEnv    ctxd.Environment
	lastRead   Reading
}

var _ ctxd.Sensor = (*Probe)(nil)

// New returns a probe. It initializes NVML lazily, on the first reading.
func New(cfg Config) *Probe {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/"
	}
	if cfg.HostMemory == nil {
		cfg.HostMemory = hostMemory
	}
	if cfg.Load == nil {
		cfg.Load = loadAvg
	}
	if cfg.ReachTimeout <= 0 {
		cfg.ReachTimeout = 2 * time.Second
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Probe{cfg: cfg, th: cfg.Thresholds, log: cfg.Logger.With("component", "hostenv")}
	if p.th == (Thresholds{}) {
		p.th = DefaultThresholds()
	} else if err := p.th.Validate(); err != nil {
		p.log.Error("invalid environment thresholds; using the defaults", "err", err)
		p.th = DefaultThresholds()
	}
	p.vram = NewBander(p.th.VRAMScale(), p.th.Hold)
	p.gpu.Hold, p.power.Hold, p.conn.Hold = p.th.Hold, p.th.Hold, p.th.Hold
	return p
}

// Thresholds returns the thresholds the probe bands with.
func (p *Probe) Thresholds() Thresholds { return p.th }

// SetPlan tells the probe how much memory ctxd's window plan expects the
// backend to hold (weights and KV cache for the window), and whether that
// is resident already (the model is loaded, so the used memory counts it).
// It counts from the next reading.
func (p *Probe) SetPlan(plannedBytes uint64, resident bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.plan = Plan{PlannedBytes: plannedBytes, Resident: resident}
}

// Run reads and bands the environment every Interval until ctx ends, the
// first time at once, and returns nil then. Meanwhile Environment and
// Latest answer from the latest reading. Only one Run at a time.
func (p *Probe) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("hostenv: already running")
	}
	p.running = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for ctx.Err() == nil {
		p.Tick(ctx)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return nil
}

// Tick takes one reading, at Config.Now, and updates the bands with it:
// the step Run repeats, exported so tests drive the probe on a fake clock.
// It returns the bands and the reading.
func (p *Probe) Tick(ctx context.Context) (ctxd.Environment, Reading) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	return p.tickLocked(ctx)
}

// tickLocked is Tick with p.readMu held.
func (p *Probe) tickLocked(ctx context.Context) (ctxd.Environment, Reading) {
	r := p.readLocked(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bandLocked(r), r
}

// bandLocked updates the bands with r and returns them. p.mu is held.
func (p *Probe) bandLocked(r Reading) ctxd.Environment {
	now := r.At
	var env ctxd.Environment
	if r.Pressure != nil {
		env.VRAM = p.vram.Update(now, *r.Pressure)
	} else {
		env.VRAM = p.vram.Unknown(now)
	}
	env.GPU = p.gpu.Update(now, GPUBand(r))
	power, low := PowerBand(r.Power, p.lowBattery, p.th)
	p.lowBattery = low
	env.Power = p.power.Update(now, power)
	env.Connectivity = p.conn.Update(now, ConnectivityBand(r.Connectivity))
	if p.readings > 0 && env != p.lastEnv {
		p.envChanges++
		p.log.Info("environment changed", "from", p.lastEnv, "to", env)
	}
	p.readings++
	p.lastEnv, p.lastRead = env, r
	return env
}

// Read takes one raw reading and leaves the bands alone.
func (p *Probe) Read() Reading {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	return p.readLocked(context.Background())
}

// readLocked takes a reading. p.readMu is held.
func (p *Probe) readLocked(ctx context.Context) Reading {
	r := Reading{At: p.cfg.Now()}
	var notes []string
	total, avail, herr := p.cfg.HostMemory()
	if herr == nil {
		r.Host.MemTotalBytes, r.Host.MemAvailableBytes = total, avail
	}
	if l, err := p.cfg.Load(); err == nil {
		r.Host.Load1 = &l
	} else {
		notes = append(notes, "load average: "+err.Error())
	}

	devs, state, err := p.gpusLocked()
	r.NVML = state
	switch {
	case err == nil:
		r.Source, r.GPUs, r.Devices = "nvml", len(devs), devs
		for _, d := range devs {
			r.TotalBytes += d.TotalBytes
			r.FreeBytes += d.FreeBytes
		}
	case herr == nil:
		notes = append(notes, err.Error())
		r.Source, r.TotalBytes, r.FreeBytes = "host", total, min(avail, total)
	default:
		notes = append(notes, err.Error(), "host memory: "+herr.Error())
		r.Source = "host"
	}

	p.mu.Lock()
	r.Plan = p.plan
	p.mu.Unlock()
	if r.TotalBytes > 0 {
		used := r.TotalBytes - r.FreeBytes
		if !r.Plan.Resident {
			used += r.Plan.PlannedBytes
		}
		f := float64(used) / float64(r.TotalBytes)
		r.Pressure = &f
	}

	r.Power = readPower(p.cfg.SysRoot)
	r.Connectivity.DefaultRoute = defaultRoute(p.cfg.SysRoot)
	if p.cfg.Reachable != nil && (r.Connectivity.DefaultRoute == nil || *r.Connectivity.DefaultRoute) {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.ReachTimeout)
		err := p.cfg.Reachable(rctx)
		cancel()
		ok := err == nil
		r.Connectivity.Reachable = &ok
		if err != nil {
			r.Connectivity.ReachError = err.Error()
		}
	}
	r.Note = strings.Join(notes, "; ")
	return r
}

// Environment returns the latest bands (see Latest).
func (p *Probe) Environment() ctxd.Environment {
	env, _ := p.Latest()
	return env
}

// Latest returns the bands and the raw reading they came from. Under Run
// it answers at once from the latest reading; otherwise, and before Run's
// first reading, it takes a reading when the last is older than MaxAge.
func (p *Probe) Latest() (ctxd.Environment, Reading) {
	if env, r, ok := p.recent(); ok {
		return env, r
	}
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if env, r, ok := p.recent(); ok { // taken while this call waited
		return env, r
	}
	return p.tickLocked(context.Background())
}

// recent returns the latest bands and reading if they may be reused.
func (p *Probe) recent() (ctxd.Environment, Reading, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ok := p.readings > 0 && (p.running || p.cfg.MaxAge > 0 && p.cfg.Now().Sub(p.lastRead.At) < p.cfg.MaxAge)
	return p.lastEnv, p.lastRead, ok
}

// Counters returns the readings and band changes so far.
func (p *Probe) Counters() Counters {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Counters{
		Readings: p.readings, Environment: p.envChanges,
		VRAM: p.vram.Changes(), GPU: p.gpu.Changes(), Power: p.power.Changes(), Connectivity: p.conn.Changes(),
	}
}

// Close shuts NVML down if it was initialized. Stop Run first; a reading
// after Close initializes NVML again.
func (p *Probe) Close() error {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if p.nvmlReady {
		p.cfg.NVML.Shutdown()
		p.nvmlReady = false
	}
	return nil
}
