package ollama

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/ctxd/ctxd/supervise"
)

// ServeConfig says how to run a private `ollama serve`.
type ServeConfig struct {
	Binary      string // path to the ollama binary
	Addr        string // loopback host:port; port 0 picks a free port
	ModelsDir   string // OLLAMA_MODELS: a private models directory
	HomeDir     string // HOME for the server (it keeps its key pair there)
	LogPath     string // where the server's output goes
	NumParallel int    // OLLAMA_NUM_PARALLEL; ctxd uses 1 so num_ctx is not split
	// MaxLoaded is OLLAMA_MAX_LOADED_MODELS (0: 1): as many as ctxd has
	// personas, so that Ollama never unloads one behind ctxd's back (ctxd's
	// memory budget decides which stay loaded).
	MaxLoaded int
	Env       []string // extra KEY=VALUE pairs (PATH, LD_LIBRARY_PATH...)
	Logger    *slog.Logger
	// OnRestart is called after the supervisor restarted a crashed server:
	// whatever the old one held in its KV cache is gone.
	OnRestart func()
	// StopTimeout is how long Close waits after SIGTERM before SIGKILL;
	// 0 means 5 seconds.
	StopTimeout time.Duration
	// Backoff is the first wait before a restart, doubling up to
	// MaxBackoff; 0 means 1 second and 30 seconds.
	Backoff    time.Duration
	MaxBackoff time.Duration
}

// Server is a supervised `ollama serve` process. Its DialContext (the
// supervisor's) is the dialer for its clients (Options.Dial): Ollama has
// no API key, so ctxd makes sure, connection by connection, that the
// process on the port is the one it started.
type Server struct {
	*supervise.Process
	base *url.URL
}

// Start starts the server and returns once it answers HTTP on its port,
// holding that port itself. It fails with the tail of the server's log if
// the process exits or does not come up, or if another process answers on
// the port.
func Start(ctx context.Context, cfg ServeConfig) (*Server, error) {
	if cfg.NumParallel == 0 {
		cfg.NumParallel = 1
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("ollama: serve: binary %q: %w (run `make ollama` to build the pinned version)", cfg.Binary, err)
	}
	addr, err := LoopbackAddr(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ollama: serve: %w", err)
	}
	for _, dir := range []string{cfg.ModelsDir, cfg.HomeDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("ollama: serve: %w", err)
		}
	}
	s := &Server{base: &url.URL{Scheme: "http", Host: addr}}
	ping := New(s.base, "", Options{})
	s.Process, err = supervise.Start(ctx, supervise.Config{
		Name: "ollama serve",
		Command: func() *exec.Cmd {
			cmd := exec.Command(bin, "serve")
			cmd.Env = append([]string{
				"OLLAMA_HOST=" + addr,
				"OLLAMA_MODELS=" + cfg.ModelsDir,
				"HOME=" + cfg.HomeDir,
				"OLLAMA_NUM_PARALLEL=" + strconv.Itoa(cfg.NumParallel),
				"OLLAMA_MAX_LOADED_MODELS=" + strconv.Itoa(max(1, cfg.MaxLoaded)),
				"OLLAMA_KEEP_ALIVE=-1",
				"OLLAMA_NOPRUNE=1",
			}, cfg.Env...)
			return cmd
		},
		LogPath: cfg.LogPath, Ready: ping.Ping, Network: "tcp", Addr: addr, OnRestart: cfg.OnRestart,
		StopTimeout: cfg.StopTimeout, Backoff: cfg.Backoff, MaxBackoff: cfg.MaxBackoff, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("ollama: %w", err)
	}
	if cfg.Logger != nil {
		cfg.Logger.Info("ollama serve is up", "url", s.base.String(), "models", cfg.ModelsDir, "log", cfg.LogPath)
	}
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() *url.URL { return s.base }

// LoopbackAddr checks that addr (host:port) is on a loopback address and
// picks a free port for port 0. Another process may bind the port before
// the server does; the supervisor then refuses to start (it checks who
// holds the port).
func LoopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("addr %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("addr %q: a managed server listens on a loopback address only", addr)
	}
	if port != "0" {
		return addr, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	defer ln.Close()
	return net.JoinHostPort(host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), nil
}
