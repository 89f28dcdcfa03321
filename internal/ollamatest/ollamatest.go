// Package ollamatest runs a real, private `ollama serve` for tests: the
// pinned binary that `make ollama` builds into bin/, a private models
// directory, a loopback port, and models that modelgen writes.
//
// Without the binary, tests skip, unless CTXD_REQUIRE_OLLAMA is set (as
// `make test` and CI set it), in which case they fail: the integration
// tests must never pass by not running.
package ollamatest

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ctxd/ctxd/internal/reporoot"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
)

// Binary returns the path of the ollama binary, or skips (fails when
// required) if there is none.
func Binary(tb testing.TB) string {
	tb.Helper()
	path := os.Getenv("CTXD_OLLAMA_BIN")
	if path == "" {
		root, err := reporoot.Find()
		if err != nil {
			tb.Fatal(err)
		}
		path = filepath.Join(root, "bin", "ollama")
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CTXD_REQUIRE_OLLAMA") != "" {
			tb.Fatalf("ollama binary %s: %v (run `make ollama`)", path, err)
		}
		tb.Skipf("ollama binary %s missing (run `make ollama`); set CTXD_REQUIRE_OLLAMA=1 to fail instead", path)
	}
	return path
}

// Start runs a private ollama serve for the test and stops it at cleanup.
func Start(tb testing.TB) *ollama.Server {
	tb.Helper()
	bin := Binary(tb)
	dir := tb.TempDir()
	srv, err := ollama.Start(context.Background(), ollama.ServeConfig{
		Binary:    bin,
		Addr:      "127.0.0.1:0",
		ModelsDir: filepath.Join(dir, "models"),
		HomeDir:   filepath.Join(dir, "home"),
		LogPath:   filepath.Join(dir, "ollama.log"),
		Env:       []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close() })
	return srv
}

var modelsMu sync.Mutex

// Model writes the model for cfg, or reuses the one an earlier run wrote:
// generation is deterministic, so a file named by the config's Key holds
// exactly that model. Files live in the OS temp dir, shared by test runs.
func Model(tb testing.TB, cfg modelgen.Config) string {
	tb.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	dir := filepath.Join(os.TempDir(), "ctxd-test-models")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	p := filepath.Join(dir, cfg.Key()+".gguf")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if err := modelgen.WriteFile(p, cfg); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Client imports the model for cfg into srv under name and returns a
// client with the given load options, loaded.
func Client(tb testing.TB, srv *ollama.Server, name string, cfg modelgen.Config, load ollama.Options) *ollama.Client {
	tb.Helper()
	c := ollama.New(srv.URL(), name, load)
	if err := c.Import(context.Background(), Model(tb, cfg)); err != nil {
		tb.Fatal(err)
	}
	return c
}
