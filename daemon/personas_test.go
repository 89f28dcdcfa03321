package daemon

import (
	"testing"

	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/internal/nvmltest"
)

// TestMemoryBudget: the personas' budget is the configured one, else the
// memory the model runs in (VRAM through NVML where a GPU is read, host
// memory otherwise) free now with the default persona's plan, less the
// headroom.
func TestMemoryBudget(t *testing.T) {
	const gib, mib = int64(1) << 30, int64(1) << 20
	host := func() (uint64, uint64, error) { return uint64(64 * gib), uint64(40 * gib), nil }
	limits := config.Limits{MemoryHeadroomMB: 512}
	for _, tc := range []struct {
		name   string
		probe  hostenv.Config
		limits config.Limits
		want   int64
		source string
	}{
		{"gpu", hostenv.Config{NVML: nvmltest.GPU(uint64(24*gib), uint64(20*gib)), HostMemory: host}, limits, 20*gib + 2*gib - 512*mib, "nvml"},
		{"two gpus", hostenv.Config{NVML: nvmltest.Library(nvmltest.Device("a", uint64(24*gib), uint64(10*gib)), nvmltest.Device("b", uint64(24*gib), uint64(12*gib))), HostMemory: host}, limits, 22*gib + 2*gib - 512*mib, "nvml"},
		{"no gpu", hostenv.Config{NVML: nvmltest.Missing(), HostMemory: host}, limits, 40*gib + 2*gib - 512*mib, "host"},
		{"configured", hostenv.Config{NVML: nvmltest.GPU(uint64(24*gib), uint64(20*gib)), HostMemory: host}, config.Limits{MemoryHeadroomMB: 512, MemoryBudgetMB: 6000}, 6000 * mib, "nvml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.probe.SysRoot = t.TempDir()
			p := hostenv.New(tc.probe)
			defer p.Close()
			rd := p.Read()
			if rd.Source != tc.source {
				t.Fatalf("memory read from %q, want %q", rd.Source, tc.source)
			}
			if got := memoryBudget(tc.limits, rd, 2*gib); got != tc.want {
				t.Errorf("budget %d MiB, want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}
