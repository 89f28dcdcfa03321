package hostenv

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/nvmltest"
)

func TestGPUPresent(t *testing.T) {
	p := New(Config{NVML: nvmltest.GPU(24*gib, 20*gib), HostMemory: hostMem(64*gib, 1*gib), SysRoot: t.TempDir()})
	env, r := p.Latest()
	if r.Source != "nvml" || r.TotalBytes != 24*gib || env.GPU != Present || env.VRAM != Low {
		t.Fatalf("env %+v reading %+v", env, r)
	}
}

func TestNVMLMissingFallsBackToHostOnce(t *testing.T) {
	inits := 0
	lib := &mock.Interface{InitFunc: func() nvml.Return { inits++; return nvml.ERROR_LIBRARY_NOT_FOUND }}
	p := New(Config{NVML: lib, HostMemory: hostMem(16*gib, 4*gib), SysRoot: t.TempDir()})
	for range 3 {
		env, r := p.Latest()
		if r.Source != "host" || r.NVML != NVMLUnavailable || r.Note == "" || env.GPU != None || env.VRAM != Moderate {
			t.Fatalf("env %+v reading %+v", env, r)
		}
	}
	if inits != 1 {
		t.Errorf("NVML Init called %d times, want once", inits)
	}
}

func TestDeviceLostFallsBackPerReading(t *testing.T) {
	lib := nvmltest.GPU(8*gib, 8*gib)
	lib.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	p := New(Config{NVML: lib, HostMemory: hostMem(16*gib, 1*gib), SysRoot: t.TempDir()})
	env, r := p.Latest()
	if r.Source != "host" || r.NVML != NVMLError || r.Note == "" {
		t.Fatalf("reading %+v: want host fallback with a note", r)
	}
	if env.GPU != Unknown || env.VRAM != Critical {
		t.Errorf("env %+v: want gpu unknown, host memory pressure critical", env)
	}
}

func TestHostMemoryError(t *testing.T) {
	p := New(Config{HostMemory: func() (uint64, uint64, error) { return 0, 0, errors.New("no /proc") }, SysRoot: t.TempDir()})
	env, r := p.Latest()
	if env.VRAM != Unknown || r.Pressure != nil || env.GPU != None {
		t.Errorf("env %+v reading %+v: want vram unknown", env, r)
	}
}

// TestSetPlan: the planned window counts until it is resident, when the
// used memory holds it.
func TestSetPlan(t *testing.T) {
	cases := []struct {
		name     string
		lib      NVML
		planned  uint64
		resident bool
		pressure float64
		band     string
	}{
		{"gpu, nothing planned", nvmltest.GPU(24*gib, 18*gib), 0, false, 0.25, Low},
		{"gpu, plan to load", nvmltest.GPU(24*gib, 18*gib), 12 * gib, false, 0.75, Moderate},
		{"gpu, plan loaded", nvmltest.GPU(24*gib, 6*gib), 12 * gib, true, 0.75, Moderate},
		{"gpu, plan beyond the card", nvmltest.GPU(24*gib, 18*gib), 24 * gib, false, 1.25, Critical},
		{"host, plan to load", nil, 8 * gib, false, 0.875, High},
		{"host, plan loaded", nil, 8 * gib, true, 0.375, Low},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := New(Config{NVML: c.lib, HostMemory: hostMem(16*gib, 10*gib), SysRoot: t.TempDir()})
			p.SetPlan(c.planned, c.resident)
			env, r := p.Tick(t.Context())
			if r.Pressure == nil || *r.Pressure != c.pressure || env.VRAM != c.band {
				t.Fatalf("pressure %v band %q; want %v %q (reading %+v)", r.Pressure, env.VRAM, c.pressure, c.band, r)
			}
			if r.Plan != (Plan{PlannedBytes: c.planned, Resident: c.resident}) {
				t.Errorf("reading's plan %+v", r.Plan)
			}
		})
	}
}

// probeAt returns a probe over tr and a mock GPU of 100 GiB whose use
// follows mem, on clk.
func probeAt(tr *tree, mem *memory, clk *clock, cfg Config) *Probe {
	cfg.NVML = nvmltest.Library(mem.device(nvmltest.Device("GPU", 100*gib, 100*gib), 100*gib))
	cfg.HostMemory, cfg.SysRoot, cfg.Now = hostMem(64*gib, 32*gib), tr.root, clk.Now
	cfg.Load = func() (float64, error) { return 0.5, nil }
	return New(cfg)
}

func TestFirstReadingImmediate(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	tr.battery("Discharging", "10")
	tr.route(false)
	mem.set(95 * gib)
	p := probeAt(tr, mem, clk, Config{})
	want := ctxd.Environment{VRAM: Critical, GPU: Present, Power: LowBattery, Connectivity: Offline}
	if env, _ := p.Tick(t.Context()); env != want {
		t.Fatalf("first reading %+v, want %+v", env, want)
	}
	if c := p.Counters(); c != (Counters{Readings: 1}) {
		t.Errorf("counters %+v: the first reading is no change", c)
	}
}

// tick is one second of a scripted probe run: set changes the world
// before the reading, want is the Environment after it.
type tick struct {
	set  func()
	want ctxd.Environment
}

func TestProbeHoldAndHysteresis(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	tr.mains(true)
	tr.battery("Charging", "80")
	tr.route(true)
	p := probeAt(tr, mem, clk, Config{})
	vram := func(pct uint64) func() { return func() { mem.set(pct * gib) } }
	env := func(v, power string) ctxd.Environment {
		return ctxd.Environment{VRAM: v, GPU: Present, Power: power, Connectivity: Online}
	}
	unplug := func() { tr.mains(false); tr.battery("Discharging", "80") }
	plug := func() { tr.mains(true); tr.battery("Charging", "80") }
	script := []tick{
		{vram(50), env(Low, AC)},
		{vram(61), env(Low, AC)},                               // moderate is the candidate
		{vram(58), env(Low, AC)},                               // under its enter threshold: dropped
		{func() { mem.set(62 * gib); unplug() }, env(Low, AC)}, // moderate held from here; a 3 s power flap
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},
		{plug, env(Low, AC)},
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},
		{nil, env(Low, AC)},           // t=12: moderate held 9 s
		{nil, env(Moderate, AC)},      // t=13: held 10 s
		{vram(54), env(Moderate, AC)}, // under its leave threshold: low is the candidate
		{vram(57), env(Moderate, AC)}, // inside moderate's range again: dropped
	}
	for i, s := range script {
		if i > 0 {
			clk.Advance(time.Second)
		}
		if s.set != nil {
			s.set()
		}
		if got, _ := p.Tick(t.Context()); got != s.want {
			t.Fatalf("t=%ds: %+v, want %+v", i, got, s.want)
		}
	}
	want := Counters{Readings: len(script), Environment: 1, VRAM: 1}
	if c := p.Counters(); c != want {
		t.Errorf("counters %+v, want %+v", c, want)
	}
}

// TestProbePowerStates walks each power state through the probe with no
// hold, so each reading shows its band.
func TestProbePowerStates(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	th := DefaultThresholds()
	th.Hold = 0
	p := probeAt(tr, mem, clk, Config{Thresholds: th})
	steps := []struct {
		name string
		set  func()
		want string
	}{
		{"no supplies", func() {}, Unknown},
		{"mains", func() { tr.mains(true) }, AC},
		{"unplugged", func() { tr.mains(false); tr.battery("Discharging", "30") }, Battery},
		{"at the enter threshold", func() { tr.battery("Discharging", "20") }, Battery},
		{"below it", func() { tr.battery("Discharging", "19") }, LowBattery},
		{"recovering under leave", func() { tr.battery("Discharging", "24") }, LowBattery},
		{"at leave", func() { tr.battery("Discharging", "25") }, LowBattery},
		{"above leave", func() { tr.battery("Discharging", "26") }, Battery},
		{"low again", func() { tr.battery("Discharging", "12") }, LowBattery},
		{"power-saver profile", func() {
			tr.put("var/lib/power-profiles-daemon/state.ini", "[State]\nProfile=power-saver\n")
		}, LowPower},
		{"balanced again", func() {
			tr.put("var/lib/power-profiles-daemon/state.ini", "[State]\nProfile=balanced\n")
		}, LowBattery},
		{"plugged in", func() { tr.mains(true); tr.battery("Charging", "12") }, AC},
		{"platform low-power", func() { tr.put("sys/firmware/acpi/platform_profile", "low-power\n") }, LowPower},
		{"profile file gone", func() { tr.remove("sys/firmware/acpi/platform_profile") }, AC},
	}
	for _, s := range steps {
		clk.Advance(time.Second)
		s.set()
		if env, r := p.Tick(t.Context()); env.Power != s.want {
			t.Fatalf("%s: power %q, want %q (%+v)", s.name, env.Power, s.want, r.Power)
		}
	}
}

func TestProbeReachable(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	tr.route(true)
	var (
		calls   int
		failing bool
	)
	reach := func(ctx context.Context) error {
		calls++
		if _, ok := ctx.Deadline(); !ok {
			t.Error("Reachable called without a deadline")
		}
		if failing {
			return errors.New("connection refused")
		}
		return nil
	}
	p := probeAt(tr, mem, clk, Config{Reachable: reach})
	steps := []struct {
		name  string
		set   func()
		after time.Duration
		want  string
		calls int
	}{
		{"answers", func() {}, 0, Online, 1},
		{"fails once: held", func() { failing = true }, time.Second, Online, 2},
		{"fails for the hold", func() {}, 10 * time.Second, Offline, 3},
		{"answers again: held", func() { failing = false }, time.Second, Offline, 4},
		{"answers for the hold", func() {}, 10 * time.Second, Online, 5},
		{"no default route: not asked", func() { tr.route(false) }, time.Second, Online, 5},
		{"no default route for the hold", func() {}, 10 * time.Second, Offline, 5},
	}
	for _, s := range steps {
		clk.Advance(s.after)
		s.set()
		env, r := p.Tick(t.Context())
		if env.Connectivity != s.want || calls != s.calls {
			t.Fatalf("%s: %q after %d calls, want %q after %d (%+v)", s.name, env.Connectivity, calls, s.want, s.calls, r.Connectivity)
		}
		if failing && r.Connectivity.ReachError == "" {
			t.Errorf("%s: no reach error in %+v", s.name, r.Connectivity)
		}
	}
}

// TestMaxAge: without Run, a reading younger than MaxAge is reused.
func TestMaxAge(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	cases := []struct {
		maxAge   time.Duration
		readings []int // after each of 4 calls, one second apart
	}{
		{0, []int{1, 2, 3, 4}},
		{2 * time.Second, []int{1, 1, 2, 2}},
	}
	for _, c := range cases {
		p := probeAt(tr, mem, clk, Config{MaxAge: c.maxAge})
		for i, want := range c.readings {
			if i > 0 {
				clk.Advance(time.Second)
			}
			p.Environment()
			if got := p.Counters().Readings; got != want {
				t.Fatalf("max age %v, call %d: %d readings, want %d", c.maxAge, i, got, want)
			}
		}
	}
}

// TestRun: Run ticks at once, Environment answers from its reading
// without reading again, and Run returns when ctx ends.
func TestRun(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	tr.route(true)
	ticked := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	p := probeAt(tr, mem, clk, Config{Interval: time.Hour, Reachable: func(context.Context) error {
		once.Do(func() { ticked <- struct{}{}; <-release })
		return nil
	}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	<-ticked // Run is in its first reading
	if err := p.Run(ctx); err == nil {
		t.Error("a second Run did not fail")
	}
	close(release)
	env := p.Environment() // waits for the first reading, then reuses it
	if env.Connectivity != Online || env.GPU != Present {
		t.Errorf("env %+v", env)
	}
	clk.Advance(time.Minute)
	p.Environment()
	if n := p.Counters().Readings; n != 1 {
		t.Errorf("%d readings under Run before its next tick, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestConcurrentUse is for the race detector.
func TestConcurrentUse(t *testing.T) {
	tr, mem, clk := newTree(t), &memory{}, newClock()
	p := probeAt(tr, mem, clk, Config{MaxAge: time.Second})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for j := range 20 {
				switch (i + j) % 5 {
				case 0:
					p.Tick(t.Context())
				case 1:
					p.Environment()
				case 2:
					p.SetPlan(uint64(j)*gib, j%2 == 0)
				case 3:
					p.Read()
				case 4:
					p.Counters()
					clk.Advance(time.Second)
				}
			}
		})
	}
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
