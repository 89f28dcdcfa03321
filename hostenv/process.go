package hostenv

import (
	"os"
	"strconv"
	"strings"
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
