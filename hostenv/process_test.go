package hostenv

import (
	"os"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ctxd/ctxd/internal/nvmltest"
)

// TestProcessRSS: this process holds some memory; no process holds none.
func TestProcessRSS(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc here")
	}
	if n := ProcessRSS(os.Getpid()); n < 1<<20 {
		t.Errorf("this process holds %d bytes, want at least a MiB", n)
	}
	if n := ProcessRSS(0); n != 0 {
		t.Errorf("pid 0: %d", n)
	}
}

// TestProcessCPU: the time this process has used grows as it works; a
// process that is not there is an error.
func TestProcessCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; x++ { // busy: at least a clock tick
	}
	after, err := ProcessCPU(os.Getpid())
	if err != nil || after <= before {
		t.Errorf("CPU time %v, then %v after %d turns of busy work (%v)", before, after, x, err)
	}
	if _, err := ProcessCPU(1 << 30); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

// TestProcessVRAM: NVML's per-process figures, summed over the GPUs, for
// the process asked about; none without NVML or where a device does not
// list its processes.
func TestProcessVRAM(t *testing.T) {
	withProcs := func(dev *mock.Device, procs ...nvml.ProcessInfo) *mock.Device {
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
		return dev
	}
	a := withProcs(nvmltest.Device("a", 24*gib, 10*gib), nvml.ProcessInfo{Pid: 42, UsedGpuMemory: 3 * gib}, nvml.ProcessInfo{Pid: 7, UsedGpuMemory: gib})
	b := withProcs(nvmltest.Device("b", 24*gib, 10*gib), nvml.ProcessInfo{Pid: 42, UsedGpuMemory: 2 * gib})
	p := New(Config{NVML: nvmltest.Library(a, b), HostMemory: hostMem(64*gib, 32*gib), SysRoot: t.TempDir()})
	if n, ok := p.ProcessVRAM(42); !ok || n != 5*gib {
		t.Errorf("pid 42: %d bytes (%v), want 5 GiB over two GPUs", n, ok)
	}
	if n, ok := p.ProcessVRAM(99); !ok || n != 0 {
		t.Errorf("pid 99 on no GPU: %d (%v), want 0, known", n, ok)
	}
	unlisted := nvmltest.Device("c", 24*gib, 10*gib)
	unlisted.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	if _, ok := New(Config{NVML: nvmltest.Library(unlisted), HostMemory: hostMem(64*gib, 32*gib), SysRoot: t.TempDir()}).ProcessVRAM(42); ok {
		t.Error("a device that does not list its processes was taken as knowing")
	}
	if _, ok := New(Config{NVML: nvmltest.Missing(), HostMemory: hostMem(64*gib, 32*gib), SysRoot: t.TempDir()}).ProcessVRAM(42); ok {
		t.Error("no NVML, yet a figure")
	}
}
