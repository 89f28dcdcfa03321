package supervise

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChildOutlivesLockedThreads: goroutines that end while locked to
// their thread end that thread; the child must not take that for its
// parent's death (the parent-death signal follows the forking thread).
func TestChildOutlivesLockedThreads(t *testing.T) {
	var restarts atomic.Int64
	p, err := Start(t.Context(), Config{
		Name:      "sleep",
		Command:   func() *exec.Cmd { return exec.Command("sleep", "60") },
		LogPath:   filepath.Join(t.TempDir(), "log"),
		Ready:     func(context.Context) error { return nil },
		OnRestart: func() { restarts.Add(1) },
		Backoff:   time.Hour, // a restart would not come back within the test
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.mu.Lock()
	gone := p.gone
	p.mu.Unlock()
	// Goroutines that end locked, on every thread the runtime has: the one
	// that forked the child among them, as far as the scheduler goes.
	var wg sync.WaitGroup
	for range 400 {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread() // and never unlocked: the thread ends with the goroutine
				time.Sleep(time.Millisecond)
			}()
		}
		wg.Wait()
	}
	select {
	case <-gone:
		t.Fatal("the child died when a locked thread ended")
	case <-time.After(300 * time.Millisecond):
	}
}
