// Package llamaservertest runs a real llama.cpp `llama-server` for tests.
// The binary cannot be installed from this project's registries, so it is
// found through CTXD_LLAMA_SERVER, beside the project at
// ../shared/bin/llama-server, or on PATH; without it (or on a machine it
// cannot start on, or with CTXD_LLAMA_SERVER=off) tests skip and say why.
package llamaservertest

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd/internal/reporoot"
)

// Binary returns the llama-server binary, or skips the test.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("CTXD_LLAMA_SERVER"); p == "off" {
		tb.Skip("CTXD_LLAMA_SERVER=off: the llama-server tests are turned off")
	} else if p != "" {
		if _, err := os.Stat(p); err != nil {
			tb.Skipf("CTXD_LLAMA_SERVER=%s: %v", p, err)
		}
		return p
	}
	if root, err := reporoot.Find(); err == nil {
		p := filepath.Join(root, "..", "shared", "bin", "llama-server")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("llama-server"); err == nil {
		return p
	}
	tb.Skip("llama-server not found (CTXD_LLAMA_SERVER, ../shared/bin/llama-server, PATH): the test needs llama.cpp's server")
	return ""
}

// Start runs llama-server on model with args (after -m, --host and
// --port) and returns its base URL once /health answers; it is stopped at
// cleanup. A server that cannot start here skips the test with its log.
func Start(tb testing.TB, model string, args ...string) string {
	tb.Helper()
	return StartServer(tb, model, args...).URL
}

// Server is a llama-server a test started: its base URL, and Kill, which
// kills it (SIGKILL, as a crash) and waits for it to exit.
type Server struct {
	URL  string
	Kill func()
}

// StartServer is Start, with the server's handle.
func StartServer(tb testing.TB, model string, args ...string) *Server {
	tb.Helper()
	bin := Binary(tb)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	logPath := filepath.Join(tb.TempDir(), "llama-server.log")
	logf, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-m", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Skipf("llama-server %s cannot start here: %v", bin, err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	go func() { exited <- cmd.Wait(); logf.Close(); close(done) }()
	kill := sync.OnceFunc(func() {
		cmd.Process.Kill()
		<-done
	})
	tb.Cleanup(kill)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return &Server{URL: base, Kill: kill}
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			tb.Skipf("llama-server exited during start (%v), so it cannot run here; its log:\n%s", err, tail(string(log), 2000))
		case <-ctx.Done():
			log, _ := os.ReadFile(logPath)
			tb.Fatalf("llama-server did not answer /health within 60s; its log:\n%s", tail(string(log), 2000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }
