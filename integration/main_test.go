package integration

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd/internal/pgtest"
	"github.com/ctxd/ctxd/internal/testwatch"
)

func TestMain(m *testing.M) {
	// llama.cpp's loader logs through the default logger; keep it to warnings.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	flag.Parse()
	stop := testwatch.Watch(digest.print)
	code := m.Run()
	pgtest.StopShared() // the PostgreSQL the shared-store tests started, if any
	stop()
	digest.print()
	os.Exit(code)
}

// digest keeps the failures of the long tests in brief, printed once more
// after the whole package has run: their logs run to thousands of lines,
// and a CI log cut in its middle would otherwise lose the line that says
// what failed.
var digest failureDigest

type failureDigest struct {
	mu    sync.Mutex
	lines []string
}

// errorf fails t as t.Errorf does and keeps the message's first line.
func (d *failureDigest) errorf(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	t.Error(msg)
	d.keep(t, msg)
}

// fatalf fails t as t.Fatalf does and keeps the message's first line.
func (d *failureDigest) fatalf(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	d.keep(t, msg)
	t.Fatal(msg)
}

func (d *failureDigest) keep(t testing.TB, msg string) {
	first, _, _ := strings.Cut(strings.TrimSpace(msg), "\n")
	if len(first) > 400 {
		first = first[:400] + "…"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lines = append(d.lines, t.Name()+": "+first)
}

func (d *failureDigest) print() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.lines) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "\nfailures in brief (%d; each in full above, in its test's log):\n", len(d.lines))
	for _, l := range d.lines {
		fmt.Fprintln(os.Stderr, "  "+l)
	}
}
