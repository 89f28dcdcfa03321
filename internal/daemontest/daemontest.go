// Package daemontest holds what the daemon's and the HTTP surface's tests
// share: a directory short enough for a Unix socket, a small codex, a
// logger that writes into the test's log, and a poll with a deadline.
package daemontest

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
)

// ShortDir is a directory for a socket, removed when the test ends:
// t.TempDir paths can be longer than a Unix socket path may be.
func ShortDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "ctxd-t-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// SmallCodex writes a codex of two small files and returns its root.
func SmallCodex(tb testing.TB) string {
	tb.Helper()
	dir := tb.TempDir()
	files := map[string]string{
		"main.go":   "package main\n\n// Serve answers requests.\nfunc Serve() error { return nil }\n",
		"README.md": "# Demo\nA codex for the daemon's tests.\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// Logger logs at debug level into the test's log, shown on failure.
func Logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// WaitFor polls cond until it holds, failing the test after 10s.
func WaitFor(tb testing.TB, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatal("condition not reached within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Config is the configuration of a test's daemon before the test adjusts
// it: a socket in a short directory, a private state directory, a small
// codex (not watched), a 64-token answer reserve, codex loads allowed
// under the temporary directory, and two sigils: default (a single
// user's, every scope but tools, as config.Default's) and coder (an
// agent's).
func Config(tb testing.TB) config.Config {
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: tb.TempDir()})
	cfg.Daemon.Socket = filepath.Join(ShortDir(tb), "ctxd.sock")
	cfg.Daemon.StateDir = tb.TempDir()
	cfg.Daemon.ShutdownGrace = config.Duration{Duration: 5 * time.Second}
	cfg.Codex.Path = SmallCodex(tb)
	cfg.Codex.Watch = false
	cfg.Limits.AnswerReserve = 64
	cfg.Codex.LoadRoots = []string{os.TempDir()} // the tests' codices are made there
	cfg.Sigils = map[string]config.Sigil{"default": {Scopes: []string{"ask", "sessions:read", "sessions:write", "codex:load"}}, "coder": {Scopes: []string{"ask", "search_codex"}}}
	return cfg
}

// Model is a model "brought up" on backend: tok counts its tokens, its
// window is numCtx tokens on slots slots, and closing it does nothing.
func Model(backend ctxd.Backend, tok ctxd.Tokenizer, numCtx, slots int) *bringup.Model {
	return &bringup.Model{
		Backend: backend, Tokenizer: tok, TokenizerID: "fake",
		Info:   bringup.BackendInfo{Kind: "fake", Mode: "fake", URL: "fake://", Model: "fake", NumCtx: numCtx, Slots: slots},
		Window: governor.WindowPlan{NumCtx: numCtx, Slots: slots, CacheType: governor.CacheF16},
		Close:  func() error { return nil },
	}
}
