package hostenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ProcessRSS is a process's resident memory (VmRSS in /proc/PID/status),
// 0 when it is unknown (no such process, or no /proc): what a model
// server really holds, beside what ctxd planned for it.
func ProcessRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// ProcessCPU is the user and system CPU time a process has used so far
// (utime and stime in /proc/PID/stat).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// After the command's name (in parentheses, which it may hold too):
	// state is field 3 of the line, utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("hostenv: /proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("hostenv: /proc/%d/stat: %q", pid, s)
	}
	const userHZ = 100 // clock ticks a second: USER_HZ, 100 on Linux
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// ProcessVRAM is the GPU memory NVML says the process uses, summed over
// the GPUs (their compute processes), and whether NVML could say: false
// without a GPU read through NVML, or when a device does not list its
// processes (then only the process's resident memory is known).
func (p *Probe) ProcessVRAM(pid int) (int64, bool) {
	p.readMu.Lock()
	defer p.readMu.Unlock()
	if pid <= 0 || p.nvmlLocked() != nil {
		return 0, false
	}
	count, ret := p.cfg.NVML.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	var sum int64
	for i := range count {
		dev, ret := p.cfg.NVML.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return 0, false
		}
		procs, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return 0, false
		}
		for _, pr := range procs {
			if int(pr.Pid) == pid {
				sum += int64(pr.UsedGpuMemory)
			}
		}
	}
	return sum, true
}
