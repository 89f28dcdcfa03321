package hostenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ctxd/ctxd/internal/nvmltest"
)

const gib = 1 << 30

func hostMem(total, avail uint64) func() (uint64, uint64, error) {
	return func() (uint64, uint64, error) { return total, avail, nil }
}

func TestGPUPresent(t *testing.T) {
	p := New(Config{NVML: nvmltest.GPU(24*gib, 20*gib), HostMemory: hostMem(64*gib, 1*gib), SysRoot: t.TempDir()})
	env, r := p.Latest()
	if r.Source != "nvml" || r.TotalBytes != 24*gib || env.GPU != "present" || env.VRAM != "low" {
		t.Fatalf("env %+v reading %+v", env, r)
	}
}

func TestNVMLMissingFallsBackToHostOnce(t *testing.T) {
	inits := 0
	lib := &mock.Interface{InitFunc: func() nvml.Return { inits++; return nvml.ERROR_LIBRARY_NOT_FOUND }}
	p := New(Config{NVML: lib, HostMemory: hostMem(16*gib, 4*gib), SysRoot: t.TempDir()})
	for range 3 {
		env, r := p.Latest()
		if r.Source != "host" || env.GPU != "none" || env.VRAM != "moderate" {
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
	_, r := p.Latest()
	if r.Source != "host" || r.Note == "" {
		t.Fatalf("reading %+v: want host fallback with a note", r)
	}
}

func TestHostMemoryError(t *testing.T) {
	p := New(Config{HostMemory: func() (uint64, uint64, error) { return 0, 0, errors.New("no /proc") }, SysRoot: t.TempDir()})
	env, _ := p.Latest()
	if env.VRAM != "unknown" {
		t.Errorf("memory band = %q, want unknown", env.VRAM)
	}
}

func TestBandHysteresis(t *testing.T) {
	cases := []struct {
		prev string
		free float64
		want string
	}{
		{"", 0.60, "high"},
		{"high", 0.48, "high"}, // inside the margin: stay
		{"high", 0.44, "medium"},
		{"medium", 0.53, "medium"},
		{"medium", 0.56, "high"},
		{"medium", 0.12, "medium"},
		{"medium", 0.09, "low"},
		{"low", 0.18, "low"},
		{"low", 0.21, "medium"},
	}
	for _, c := range cases {
		if got := band(c.prev, c.free); got != c.want {
			t.Errorf("band(%q, %.2f) = %q, want %q", c.prev, c.free, got, c.want)
		}
	}
}

func TestPowerAndConnectivity(t *testing.T) {
	root := t.TempDir()
	put := func(rel, content string) {
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := New(Config{SysRoot: root, HostMemory: hostMem(1, 1)})
	if got := p.power(); got != "unknown" {
		t.Errorf("no supplies: power %q", got)
	}
	put("sys/class/power_supply/BAT0/type", "Battery\n")
	put("sys/class/power_supply/BAT0/status", "Discharging\n")
	put("sys/class/power_supply/BAT0/capacity", "55\n")
	if got := p.power(); got != "battery" {
		t.Errorf("discharging: power %q", got)
	}
	put("sys/class/power_supply/BAT0/capacity", "7\n")
	if got := p.power(); got != "low_power" {
		t.Errorf("low battery: power %q", got)
	}
	put("sys/class/power_supply/AC/type", "Mains\n")
	put("sys/class/power_supply/AC/online", "1\n")
	if got := p.power(); got != "ac" {
		t.Errorf("mains online: power %q", got)
	}
	if got := p.connectivity(); got != "unknown" {
		t.Errorf("no route table: %q", got)
	}
	put("proc/net/route", "Iface\tDestination\tGateway\nlo\t0000007F\t00000000\n")
	if got := p.connectivity(); got != "offline" {
		t.Errorf("no default route: %q", got)
	}
	put("proc/net/route", "Iface\tDestination\tGateway\neth0\t00000000\t0101A8C0\n")
	if got := p.connectivity(); got != "online" {
		t.Errorf("default route: %q", got)
	}
}
