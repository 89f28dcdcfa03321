package hostenv

import (
	"os"
	"testing"
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
