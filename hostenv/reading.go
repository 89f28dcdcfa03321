package hostenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/shirou/gopsutil/v4/load"
	"github.com/shirou/gopsutil/v4/mem"
)

// NVML is the part of the NVML library hostenv uses; nvml.New() and
// go-nvml's mock.Interface both satisfy it.
type NVML interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// What NVML said in a reading (Reading.NVML).
const (
	NVMLOK          = "ok"          // every device's memory was read
	NVMLUnavailable = "unavailable" // no library, or it failed to start (not retried)
	NVMLNoDevices   = "no_devices"  // it started and sees no device
	NVMLError       = "error"       // it started but a device could not be read
)

// Reading is one raw measurement, for status pages and the window plan;
// it never reaches the prompt. Optional numbers are nil when the hardware
// or the driver does not say.
type Reading struct {
	At time.Time `json:"at"`

	// The memory the model runs in: VRAM summed over the GPUs when NVML
	// read them (Source "nvml"), host memory otherwise (Source "host"),
	// both zero when neither could be read.
	Source     string `json:"source"`
	GPUs       int    `json:"gpus"`
	TotalBytes uint64 `json:"total_bytes"`
	FreeBytes  uint64 `json:"free_bytes"`
	// Pressure is the VRAM pressure fraction, ctxd's planned window
	// counted (see the package doc); nil without a memory reading.
	Pressure *float64 `json:"pressure,omitempty"`
	Plan     Plan     `json:"plan"`

	NVML         string       `json:"nvml"` // one of the NVML* constants
	Devices      []GPU        `json:"devices,omitempty"`
	Host         Host         `json:"host"`
	Power        Power        `json:"power"`
	Connectivity Connectivity `json:"connectivity"`
	Note         string       `json:"note,omitempty"` // what could not be read, and why
}

// Plan is the memory ctxd's window plan expects the backend to hold
// (weights and KV cache), as last given to Probe.SetPlan.
type Plan struct {
	PlannedBytes uint64 `json:"planned_bytes"`
	Resident     bool   `json:"resident"` // loaded: already counted in the used memory
}

// GPU is one NVIDIA device. A device call other than memory that fails
// leaves its field nil.
type GPU struct {
	Index          int     `json:"index"`
	Name           string  `json:"name,omitempty"`
	TotalBytes     uint64  `json:"total_bytes"`
	UsedBytes      uint64  `json:"used_bytes"`
	FreeBytes      uint64  `json:"free_bytes"`
	UtilizationPct *uint32 `json:"utilization_pct,omitempty"`
	PowerDrawMW    *uint32 `json:"power_draw_mw,omitempty"`
	PowerLimitMW   *uint32 `json:"power_limit_mw,omitempty"`
}

// Host is the machine's memory and load.
type Host struct {
	MemTotalBytes     uint64   `json:"mem_total_bytes"`
	MemAvailableBytes uint64   `json:"mem_available_bytes"`
	Load1             *float64 `json:"load1,omitempty"`
}

// Power is what /sys/class/power_supply and the power profile say.
type Power struct {
	Source          string `json:"source"`                    // ac, battery or unknown
	BatteryPercent  *int   `json:"battery_percent,omitempty"` // mean over the system's batteries
	Discharging     bool   `json:"discharging"`
	PlatformProfile string `json:"platform_profile,omitempty"` // /sys/firmware/acpi/platform_profile
	PPDProfile      string `json:"ppd_profile,omitempty"`      // power-profiles-daemon's saved profile
	LowPowerMode    bool   `json:"low_power_mode"`             // either profile saves power
}

// Connectivity is whether the kernel has a default route and, when the
// probe has a Reachable check, whether the backend answered it.
type Connectivity struct {
	DefaultRoute *bool  `json:"default_route,omitempty"` // nil: no readable route table
	Reachable    *bool  `json:"reachable,omitempty"`     // nil: not checked
	ReachError   string `json:"reach_error,omitempty"`
}

// gpusLocked reads every NVIDIA device. A library that is missing or fails
// to initialize is reported once and not retried; a device whose memory
// cannot be read (lost, reset) fails the whole GPU reading, and the memory
// falls back to the host's for that reading. p.readMu is held.
func (p *Probe) gpusLocked() (devs []GPU, state string, err error) {
	if err := p.nvmlLocked(); err != nil {
		return nil, NVMLUnavailable, err
	}
	count, ret := p.cfg.NVML.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, NVMLError, fmt.Errorf("nvml device count: %s", nvmlError(ret))
	}
	if count == 0 {
		return nil, NVMLNoDevices, errors.New("no NVIDIA GPU")
	}
	devs = make([]GPU, 0, count)
	for i := range count {
		dev, ret := p.cfg.NVML.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, NVMLError, fmt.Errorf("nvml device %d: %s", i, nvmlError(ret))
		}
		g, err := readGPU(i, dev)
		if err != nil {
			return nil, NVMLError, err
		}
		devs = append(devs, g)
	}
	return devs, NVMLOK, nil
}

// nvmlLocked initializes NVML the first time; a library that is missing
// or fails to initialize is reported once and not retried. p.readMu is
// held.
func (p *Probe) nvmlLocked() error {
	if p.cfg.NVML == nil {
		return errors.New("no NVML library")
	}
	if p.nvmlDead {
		return p.nvmlErr
	}
	if !p.nvmlReady {
		if ret := p.cfg.NVML.Init(); ret != nvml.SUCCESS {
			p.nvmlDead = true
			p.nvmlErr = fmt.Errorf("nvml init: %s", nvmlError(ret))
			p.log.Info("NVML unavailable; budgeting against host memory", "reason", nvmlError(ret))
			return p.nvmlErr
		}
		p.nvmlReady = true
	}
	return nil
}

// readGPU reads one device: its memory, which it must, and its name,
// utilisation and power, which it may.
func readGPU(i int, dev nvml.Device) (GPU, error) {
	m, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return GPU{}, fmt.Errorf("nvml device %d memory: %s", i, nvmlError(ret))
	}
	g := GPU{Index: i, TotalBytes: m.Total, FreeBytes: min(m.Free, m.Total)}
	g.UsedBytes = g.TotalBytes - g.FreeBytes
	if name, ret := dev.GetName(); ret == nvml.SUCCESS {
		g.Name = name
	}
	if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		g.UtilizationPct = &u.Gpu
	}
	if mw, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		g.PowerDrawMW = &mw
	}
	if mw, ret := dev.GetEnforcedPowerLimit(); ret == nvml.SUCCESS {
		g.PowerLimitMW = &mw
	} else if mw, ret := dev.GetPowerManagementLimit(); ret == nvml.SUCCESS {
		g.PowerLimitMW = &mw
	}
	return g, nil
}

func nvmlError(ret nvml.Return) string {
	defer func() { _ = recover() }() // ErrorString needs the library itself
	s := nvml.ErrorString(ret)
	if s == "" {
		return fmt.Sprintf("NVML return %d", int(ret))
	}
	return s
}

func hostMemory() (uint64, uint64, error) {
	v, err := mem.VirtualMemory()
	if err != nil {
		return 0, 0, err
	}
	return v.Total, v.Available, nil
}

func loadAvg() (float64, error) {
	a, err := load.Avg()
	if err != nil {
		return 0, err
	}
	return a.Load1, nil
}

// readPower reads <root>/sys/class/power_supply: "ac" when a mains (or
// USB) supply is online, "battery" when the system has a battery and no
// online mains, "unknown" without supplies. Batteries of devices (a mouse:
// scope "Device") do not count. Either power profile in its power-saving
// setting is low-power mode; a missing file is not.
func readPower(root string) Power {
	var p Power
	dir := filepath.Join(root, "sys/class/power_supply")
	entries, _ := os.ReadDir(dir)
	mainsOnline, batteries, percentSum, percents := false, 0, 0, 0
	for _, e := range entries {
		supply := filepath.Join(dir, e.Name())
		if readTrim(filepath.Join(supply, "scope")) == "Device" {
			continue
		}
		switch readTrim(filepath.Join(supply, "type")) {
		case "Mains", "USB":
			if readTrim(filepath.Join(supply, "online")) == "1" {
				mainsOnline = true
			}
		case "Battery":
			batteries++
			if readTrim(filepath.Join(supply, "status")) == "Discharging" {
				p.Discharging = true
			}
			if c, err := strconv.Atoi(readTrim(filepath.Join(supply, "capacity"))); err == nil && c >= 0 && c <= 100 {
				percentSum += c
				percents++
			}
		}
	}
	switch {
	case mainsOnline:
		p.Source = AC
	case batteries > 0:
		p.Source = Battery
	default:
		p.Source = Unknown
	}
	if percents > 0 {
		pct := percentSum / percents
		p.BatteryPercent = &pct
	}
	p.PlatformProfile = readTrim(filepath.Join(root, "sys/firmware/acpi/platform_profile"))
	p.PPDProfile = ppdProfile(filepath.Join(root, "var/lib/power-profiles-daemon/state.ini"))
	p.LowPowerMode = p.PlatformProfile == "low-power" || p.PPDProfile == "power-saver"
	return p
}

// ppdProfile is the Profile= line of power-profiles-daemon's state file.
func ppdProfile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.TrimSpace(k) == "Profile" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// defaultRoute says whether <root>/proc/net/route has a default route
// (not on the loopback); nil when it cannot be read. It sends no traffic.
func defaultRoute(root string) *bool {
	data, err := os.ReadFile(filepath.Join(root, "proc/net/route"))
	if err != nil {
		return nil
	}
	found := false
	for i, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if i > 0 && len(f) > 2 && f[1] == "00000000" && f[0] != "lo" {
			found = true
			break
		}
	}
	return &found
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
