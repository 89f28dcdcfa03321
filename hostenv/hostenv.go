package hostenv

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/shirou/gopsutil/v4/mem"

	"github.com/ctxd/ctxd"
)

// NVML is the part of the NVML library hostenv uses; nvml.New() and
// go-nvml's mock.Interface both satisfy it.
type NVML interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// Reading is one raw measurement.
type Reading struct {
	Source       string // "nvml" when GPU memory was read, "host" otherwise
	GPUs         int
	TotalBytes   uint64 // memory the model can use: VRAM, or host memory without a GPU
	FreeBytes    uint64
	Power        string
	Connectivity string
	Note         string // why NVML was not used, when it was not
}

// Config says where the probe looks.
type Config struct {
	NVML       NVML                                    // nil: no GPU library
	HostMemory func() (total, avail uint64, err error) // nil: gopsutil
	SysRoot    string                                  // "/" normally; tests point it at a fake tree
	MaxAge     time.Duration                           // Environment reuses a reading this young (0: read every time)
	Logger     *slog.Logger
}

// Probe reads the environment and keeps the last bands for hysteresis.
type Probe struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex // guards the fields below
	nvmlReady bool
	nvmlDead  bool // init failed once: host memory from then on, said once
	memBand   string
	lastAt    time.Time // when lastEnv and lastRead were taken
	lastEnv   ctxd.Environment
	lastRead  Reading
}

// New returns a probe. It initializes NVML lazily.
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
	return &Probe{cfg: cfg, log: cfg.Logger.With("component", "hostenv")}
}

func hostMemory() (uint64, uint64, error) {
	v, err := mem.VirtualMemory()
	if err != nil {
		return 0, 0, err
	}
	return v.Total, v.Available, nil
}

// Read takes one raw reading.
func (p *Probe) Read() Reading {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readLocked()
}

func (p *Probe) readLocked() Reading {
	r := Reading{Power: p.power(), Connectivity: p.connectivity()}
	if n, total, free, err := p.gpuLocked(); err == nil {
		r.Source, r.GPUs, r.TotalBytes, r.FreeBytes = "nvml", n, total, free
		return r
	} else {
		r.Note = err.Error()
	}
	r.Source = "host"
	total, avail, err := p.cfg.HostMemory()
	if err != nil {
		r.Note += "; host memory: " + err.Error()
		return r
	}
	r.TotalBytes, r.FreeBytes = total, avail
	return r
}

var errNoGPU = errors.New("no NVIDIA GPU")

// gpuLocked sums memory over all NVIDIA devices. A library that is missing
// or fails to initialize is reported once and not retried; a device that
// fails later (lost, reset) falls back to host memory for that reading.
func (p *Probe) gpuLocked() (n int, total, free uint64, err error) {
	if p.cfg.NVML == nil || p.nvmlDead {
		return 0, 0, 0, errNoGPU
	}
	if !p.nvmlReady {
		if ret := p.cfg.NVML.Init(); ret != nvml.SUCCESS {
			p.nvmlDead = true
			p.log.Info("NVML unavailable; budgeting against host memory", "reason", nvmlError(ret))
			return 0, 0, 0, fmt.Errorf("nvml init: %s", nvmlError(ret))
		}
		p.nvmlReady = true
	}
	count, ret := p.cfg.NVML.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, 0, 0, fmt.Errorf("nvml device count: %s", nvmlError(ret))
	}
	if count == 0 {
		return 0, 0, 0, errNoGPU
	}
	for i := range count {
		dev, ret := p.cfg.NVML.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return 0, 0, 0, fmt.Errorf("nvml device %d: %s", i, nvmlError(ret))
		}
		m, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return 0, 0, 0, fmt.Errorf("nvml device %d memory: %s", i, nvmlError(ret))
		}
		total += m.Total
		free += m.Free
	}
	return count, total, free, nil
}

func nvmlError(ret nvml.Return) string {
	defer func() { _ = recover() }() // ErrorString needs the library itself
	s := nvml.ErrorString(ret)
	if s == "" {
		return fmt.Sprintf("NVML return %d", int(ret))
	}
	return s
}

// Close shuts NVML down if it was initialized.
func (p *Probe) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nvmlReady {
		p.cfg.NVML.Shutdown()
		p.nvmlReady = false
	}
	return nil
}

// Band thresholds on the free fraction of memory, and the margin a reading
// must pass a threshold by before the band changes.
const (
	lowBelow    = 0.15
	mediumBelow = 0.50
	hysteresis  = 0.05
)

var _ ctxd.Sensor = (*Probe)(nil)

// Environment returns the bands of a recent reading (taking one if the
// last is older than MaxAge).
func (p *Probe) Environment() ctxd.Environment {
	env, _ := p.Latest()
	return env
}

// Latest returns the bands and the raw reading they came from, taking a
// new reading if the last is older than MaxAge.
func (p *Probe) Latest() (ctxd.Environment, Reading) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cfg.MaxAge > 0 && !p.lastAt.IsZero() && time.Since(p.lastAt) < p.cfg.MaxAge {
		return p.lastEnv, p.lastRead
	}
	r := p.readLocked()
	env := ctxd.Environment{VRAM: "unknown", GPU: "none", Power: r.Power, Connectivity: r.Connectivity}
	if r.GPUs > 0 {
		env.GPU = "present"
	}
	if r.TotalBytes > 0 {
		p.memBand = band(p.memBand, float64(r.FreeBytes)/float64(r.TotalBytes))
		env.VRAM = map[string]string{"high": "low", "medium": "moderate", "low": "high"}[p.memBand]
	}
	p.lastAt, p.lastEnv, p.lastRead = time.Now(), env, r
	return env, r
}

// bandEdges are the free fractions each band covers.
var bandEdges = map[string][2]float64{
	"low":    {0, lowBelow},
	"medium": {lowBelow, mediumBelow},
	"high":   {mediumBelow, 1.01},
}

// band maps a free fraction to a band, staying in prev unless the fraction
// is past prev's edges by the hysteresis margin.
func band(prev string, free float64) string {
	raw := "high"
	switch {
	case free < lowBelow:
		raw = "low"
	case free < mediumBelow:
		raw = "medium"
	}
	edges, ok := bandEdges[prev]
	if ok && free >= edges[0]-hysteresis && free < edges[1]+hysteresis {
		return prev
	}
	return raw
}

// lowBatteryPercent is the charge under which a discharging battery
// counts as low power.
const lowBatteryPercent = 20

// power reads /sys/class/power_supply: "ac" when mains is online,
// "battery" when only a battery supplies power, "unknown" without supplies.
func (p *Probe) power() string {
	dir := filepath.Join(p.cfg.SysRoot, "sys/class/power_supply")
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		return "unknown"
	}
	sawBattery := false
	for _, e := range entries {
		typ := readTrim(filepath.Join(dir, e.Name(), "type"))
		switch typ {
		case "Mains", "USB":
			if readTrim(filepath.Join(dir, e.Name(), "online")) == "1" {
				return "ac"
			}
		case "Battery":
			sawBattery = true
			if readTrim(filepath.Join(dir, e.Name(), "status")) == "Discharging" {
				if c, err := strconv.Atoi(readTrim(filepath.Join(dir, e.Name(), "capacity"))); err == nil && c < lowBatteryPercent {
					return "low_power"
				}
				return "battery"
			}
		}
	}
	if sawBattery {
		return "battery"
	}
	return "unknown"
}

// connectivity is "online" when the kernel has a default route, "offline"
// when it has a routing table without one. It sends no traffic.
func (p *Probe) connectivity() string {
	data, err := os.ReadFile(filepath.Join(p.cfg.SysRoot, "proc/net/route"))
	if err != nil {
		return "unknown"
	}
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if i > 0 && len(f) > 2 && f[1] == "00000000" && f[0] != "lo" {
			return "online"
		}
	}
	return "offline"
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
