package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
)

// needOllama skips the whole test, not only its subtests, when the Ollama
// binary is missing (and fails it when CTXD_REQUIRE_OLLAMA is set): a test
// whose subtests all skip would otherwise report PASS. The tests here run
// one at a time: each drives a real model server on a 2-core CPU.
func needOllama(tb testing.TB) {
	tb.Helper()
	ollamatest.Binary(tb)
}

// needLlamaServer skips the whole test when llama.cpp's llama-server is
// not found (a fresh clone has no ../shared; CI has it).
func needLlamaServer(tb testing.TB) {
	tb.Helper()
	llamaservertest.Binary(tb)
}

// llamaConfig is baseConfig on a managed llama-server with one slot.
func llamaConfig(t testing.TB, stateDir, codex string) config.Config {
	t.Helper()
	c := baseConfig(t, stateDir, codex)
	c.Backend.Kind, c.Backend.Binary = "llamacpp", llamaservertest.Binary(t)
	return c
}

// openaiConfig is llamaConfig on the OpenAI backend: ctxd reaches an
// external llama-server through its OpenAI routes (/v1/completions,
// /v1/models), counting with the model file. startOpts starts that server
// with the configuration's model, window and slots.
func openaiConfig(t testing.TB, stateDir, codex string) config.Config {
	t.Helper()
	c := llamaConfig(t, stateDir, codex)
	c.Backend.Kind, c.Backend.Mode, c.Backend.URL, c.Backend.Binary = "openai", "external", "", ""
	return c
}

// startOpenAIServer starts the llama-server an openaiConfig names (its
// URL empty): the model file, each slot's window (num_ctx, else
// max_num_ctx) and the slots, and sets the URL.
func startOpenAIServer(t testing.TB, cfg *config.Config) {
	t.Helper()
	cfg.Backend.URL = llamaservertest.Start(t, cfg.Backend.GGUF, openAIServerArgs(*cfg)...)
}

// openAIServerArgs are the llama-server arguments for an openaiConfig:
// each slot's window, the slots, and the model's name.
func openAIServerArgs(cfg config.Config) []string {
	b := cfg.Backend
	n := b.NumCtx
	if n == 0 {
		n = b.MaxNumCtx
	}
	slots := max(1, b.Slots)
	return []string{"-c", strconv.Itoa(n * slots), "-np", strconv.Itoa(slots), "--swa-full", "--alias", b.Model}
}

// backend is a model server the socket suite runs against.
type backend struct {
	name   string
	config func(t testing.TB, stateDir, codex string) config.Config
}

// forEachBackend runs fn as a subtest on Ollama, on llama-server, and on
// the OpenAI backend in front of llama-server (the last two skip with a
// message where the binary is missing). Call needOllama
// first: the Ollama subtest always runs, so the test never passes on
// skipped subtests alone.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range []backend{{"ollama", baseConfig}, {"llamacpp", llamaConfig}, {"openai", openaiConfig}} {
		t.Run(b.name, func(t *testing.T) {
			if b.name != "ollama" {
				needLlamaServer(t)
			}
			fn(t, b)
		})
	}
}

// testModel is small enough to load and evaluate quickly on two cores.
func testModel() modelgen.Config {
	c := modelgen.DefaultConfig()
	c.Name = "ctxd-test"
	c.VocabSize = 2048
	c.ContextLength = 8192
	return c
}

func modelPath(t testing.TB, c modelgen.Config) string {
	t.Helper()
	return ollamatest.Model(t, c)
}

// running is a daemon under test.
type running struct {
	cfg    config.Config
	daemon *daemon.Daemon
	client *client.Client
	stop   func() error // stops the daemon and returns Run's error
}

// codexDir writes a codex of roughly n bytes of Go-like text.
func codexDir(t testing.TB, n int) string {
	t.Helper()
	dir := t.TempDir()
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "// Handler%d serves request kind %d and returns an error.\nfunc Handler%d(w io.Writer, n int) error {\n\treturn fmt.Errorf(\"kind %%d\", n+%d)\n}\n\n", i, i, i, i)
	}
	if err := os.WriteFile(filepath.Join(dir, "handlers.go"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# Handlers\nEach handler serves one kind of request.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// baseConfig is a managed-backend configuration over the test model.
func baseConfig(t testing.TB, stateDir, codex string) config.Config {
	t.Helper()
	c := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	c.Daemon.Socket = filepath.Join(daemontest.ShortDir(t), "ctxd.sock")
	c.Daemon.StateDir = stateDir
	c.Daemon.LogLevel = "info"
	c.Backend.Binary = ollamatest.Binary(t)
	c.Backend.GGUF = modelPath(t, testModel())
	c.Backend.Model = "ctxd-test"
	c.Backend.NumCtx = 4096
	c.Codex.Path = codex
	c.Codex.LoadRoots = []string{os.TempDir()} // the tests' codices are made there
	c.Limits.AnswerReserve = 16
	return c
}

// start runs a daemon and waits until it is ready (or wait=false: only
// until it listens).
func start(t testing.TB, cfg config.Config, wait bool) *running {
	t.Helper()
	return startEnv(t, cfg, wait)
}

// startEnv is start with extra environment (KEY=VALUE) for a managed backend.
func startEnv(t testing.TB, cfg config.Config, wait bool, env ...string) *running {
	t.Helper()
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Daemon.LogLevel)); err != nil {
		t.Fatal(err)
	}
	return startOpts(t, cfg, wait, daemon.Options{BackendEnv: append([]string{"PATH=" + os.Getenv("PATH")}, env...)})
}

func startOpts(t testing.TB, cfg config.Config, wait bool, opts daemon.Options) *running {
	t.Helper()
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Daemon.LogLevel)); err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
	}
	opts.Version = "test"
	if os.Getenv("CTXD_TEST_BACKEND") == "openai" && cfg.Backend.Kind == "ollama" && cfg.Backend.Mode == "managed" && len(cfg.Personas) == 0 {
		// A suite run on the OpenAI backend in front of llama-server:
		// every daemon the tests would give a managed Ollama gets it
		// instead (make test-openai; docs/scale.md).
		cfg.Backend.Kind, cfg.Backend.Mode, cfg.Backend.URL, cfg.Backend.Binary = "openai", "external", "", ""
	}
	if cfg.Backend.Kind == "openai" && cfg.Backend.URL == "" {
		startOpenAIServer(t, &cfg)
	}
	d, err := daemon.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := daemon.Listen(cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, ln, func() { close(ready) }) }()
	r := &running{cfg: cfg, daemon: d, client: client.New(cfg.Daemon.Socket)}
	stopped := false
	r.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			ln.Close()
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("daemon did not stop within 30s")
		}
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("daemon stop: %v", err)
		}
	})
	if wait {
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("daemon exited before ready: %v", err)
		case <-time.After(2 * time.Minute):
			t.Fatal("daemon not ready within 2 minutes")
		}
	}
	return r
}

// testWriter sends log lines to the test log, so they show only on failure.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
