package pgtest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// shared is the cluster Server starts once per test binary.
var shared struct {
	once sync.Once
	c    *Cluster
	err  error
}

// Server returns the cluster the tests of this binary share, starting it
// at the first call; it skips tb (fails it, where PostgreSQL is required)
// when the cluster cannot run. Tests on it must leave it running: one
// that stops it uses New.
func Server(tb testing.TB) *Cluster {
	tb.Helper()
	shared.once.Do(func() { shared.c, shared.err = create() })
	if shared.err != nil {
		unavailable(tb, shared.err)
	}
	return shared.c
}

// New returns a private cluster, stopped and removed when tb ends, for a
// test that stops, crashes or restarts it.
func New(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := create()
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(func() {
		if err := c.destroy(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// Main runs the tests, then stops the shared cluster (StopShared), and
// exits with the tests' code. A package whose tests call Server calls it
// from TestMain, or calls StopShared from a TestMain of its own.
func Main(m *testing.M) {
	code := m.Run()
	if err := StopShared(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// StopShared stops the shared cluster, if the tests started it, and
// removes its directory; call it once the tests have run (m.Run).
func StopShared() error {
	if shared.c == nil {
		return nil
	}
	return shared.c.destroy()
}
