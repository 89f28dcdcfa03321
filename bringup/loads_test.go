package bringup

import (
	"os"
	"path/filepath"
	"testing"
)

// One model load as each supported Ollama logs it (abridged from real
// logs): v0.17 reports "llama runner started in" twice for one load, so
// only the scheduler's "loaded runners" line counts loads.
var loadLogs = map[string]string{
	"v0.6.5": `time=2026-11-23T22:48:00.300Z level=INFO source=sched.go:451 msg="loaded runners" count=1
time=2026-11-23T22:48:00.301Z level=INFO source=server.go:580 msg="waiting for llama runner to start responding"
time=2026-11-23T22:48:00.520Z level=INFO source=server.go:619 msg="llama runner started in 0.22 seconds"
[GIN] 2026/11/23 - 22:48:00 | 200 |  250.1ms |       127.0.0.1 | POST     "/api/generate"
`,
	"v0.17.4": `time=2026-11-23T22:48:00.300Z level=INFO source=server.go:431 msg="starting runner" cmd="ollama runner --model m --port 1"
time=2026-11-23T22:48:00.400Z level=INFO source=sched.go:566 msg="loaded runners" count=1
time=2026-11-23T22:48:00.401Z level=INFO source=server.go:1350 msg="waiting for llama runner to start responding"
time=2026-11-23T22:48:00.520Z level=INFO source=server.go:1388 msg="llama runner started in 0.22 seconds"
time=2026-11-23T22:48:00.521Z level=INFO source=server.go:1388 msg="llama runner started in 0.22 seconds"
[GIN] 2026/11/23 - 22:48:00 | 200 |  250.1ms |       127.0.0.1 | POST     "/api/generate"
`,
}

func TestLoadCounterCountsOneLoadOnEachVersion(t *testing.T) {
	for version, load := range loadLogs {
		t.Run(version, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ollama.log")
			earlier := "time=2026-11-22T00:00:00Z level=INFO msg=\"loaded runners\" count=1\n" // an earlier run's
			if err := os.WriteFile(path, []byte(earlier), 0o644); err != nil {
				t.Fatal(err)
			}
			c := newLineCounter(path, ollamaLoadMarker)
			if n := c.Count(); n != 0 {
				t.Fatalf("before any load: %d; want 0 (the earlier run's line is not counted)", n)
			}
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// The first load arrives in two writes, split inside its line.
			half := len(load) / 3
			f.WriteString(load[:half])
			c.Count()
			f.WriteString(load[half:])
			if n := c.Count(); n != 1 {
				t.Fatalf("after one load: %d; want 1", n)
			}
			f.WriteString(load)
			if n := c.Count(); n != 2 {
				t.Fatalf("after two loads: %d; want 2", n)
			}
		})
	}
}
