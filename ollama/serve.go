package ollama

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ServeConfig says how to run a private `ollama serve`.
type ServeConfig struct {
	Binary      string   // path to the ollama binary
	Addr        string   // loopback host:port; port 0 picks a free port
	ModelsDir   string   // OLLAMA_MODELS: a private models directory
	HomeDir     string   // HOME for the server (it keeps its key pair there)
	LogPath     string   // where the server's output goes
	NumParallel int      // OLLAMA_NUM_PARALLEL; ctxd uses 1 so num_ctx is not split
	Env         []string // extra KEY=VALUE pairs (PATH, LD_LIBRARY_PATH...)
	Logger      *slog.Logger
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

// Server is a supervised `ollama serve` process.
type Server struct {
	cfg  ServeConfig
	base *url.URL
	log  *slog.Logger

	mu      sync.Mutex // guards cmd, gone, restart
	cmd     *exec.Cmd
	gone    chan struct{} // closed when cmd has exited and been reaped
	restart int

	ctx  context.Context    // ends when Close is called: restarts stop waiting
	stop context.CancelFunc // ends ctx
	done chan struct{}      // closed when the supervisor has stopped
}

// Start starts the server and returns once it answers HTTP. It fails with
// the tail of the server's log if the process exits or does not come up.
func Start(ctx context.Context, cfg ServeConfig) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NumParallel == 0 {
		cfg.NumParallel = 1
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("ollama: serve: binary %q: %w (run `make ollama` to build the pinned version)", cfg.Binary, err)
	}
	cfg.Binary = bin
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("ollama: serve: addr %q: %w", cfg.Addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("ollama: serve: addr %q: a managed server listens on a loopback address only", cfg.Addr)
	}
	if port == "0" {
		p, err := freePort(host)
		if err != nil {
			return nil, fmt.Errorf("ollama: serve: pick a port: %w", err)
		}
		cfg.Addr = net.JoinHostPort(host, strconv.Itoa(p))
	}
	for _, dir := range []string{cfg.ModelsDir, cfg.HomeDir, filepath.Dir(cfg.LogPath)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("ollama: serve: %w", err)
		}
	}
	s := &Server{
		cfg:  cfg,
		base: &url.URL{Scheme: "http", Host: cfg.Addr},
		log:  cfg.Logger.With("component", "ollama-serve"),
		done: make(chan struct{}),
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	exited, err := s.spawn()
	if err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx, exited); err != nil {
		s.stop()
		s.stopProcess()
		return nil, err
	}
	go s.supervise(exited)
	s.log.Info("ollama serve is up", "url", s.base.String(), "models", cfg.ModelsDir, "log", cfg.LogPath)
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() *url.URL { return s.base }

// PID is the process id of the current server process.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Restarts is how often the supervisor restarted the server.
func (s *Server) Restarts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restart
}

func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// spawn starts the process; the returned channel yields its exit error.
func (s *Server) spawn() (<-chan error, error) {
	logf, err := os.OpenFile(s.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ollama: serve: log: %w", err)
	}
	cmd := exec.Command(s.cfg.Binary, "serve")
	cmd.Env = append([]string{
		"OLLAMA_HOST=" + s.cfg.Addr,
		"OLLAMA_MODELS=" + s.cfg.ModelsDir,
		"HOME=" + s.cfg.HomeDir,
		"OLLAMA_NUM_PARALLEL=" + strconv.Itoa(s.cfg.NumParallel),
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_KEEP_ALIVE=-1",
		"OLLAMA_NOPRUNE=1",
	}, s.cfg.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a terminal's Ctrl-C reaches ctxd only and
	// ctxd decides the stop order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("ollama: serve: start %s: %w", s.cfg.Binary, err)
	}
	gone := make(chan struct{})
	s.mu.Lock()
	s.cmd, s.gone = cmd, gone
	s.mu.Unlock()
	exited := make(chan error, 1)
	go func() {
		exited <- cmd.Wait()
		close(gone)
		logf.Close()
	}()
	return exited, nil
}

func (s *Server) waitReady(ctx context.Context, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	c := New(s.base, "", Options{})
	for {
		if err := c.Ping(ctx); err == nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("ollama: serve exited during start (%v); log %s:\n%s", err, s.cfg.LogPath, tail(s.cfg.LogPath, 2048))
		case <-ctx.Done():
			return fmt.Errorf("ollama: serve did not answer at %s: %w; log %s:\n%s", s.base, ctx.Err(), s.cfg.LogPath, tail(s.cfg.LogPath, 2048))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// supervise restarts the server when it exits unexpectedly, with backoff,
// until Close.
func (s *Server) supervise(exited <-chan error) {
	defer close(s.done)
	for {
		var err error
		select {
		case err = <-exited:
		case <-s.ctx.Done():
			return
		}
		if s.ctx.Err() != nil {
			return
		}
		s.log.Error("ollama serve exited unexpectedly; restarting", "err", err, "log_tail", tail(s.cfg.LogPath, 512))
		next := s.respawn()
		if next == nil {
			return // closing
		}
		exited = next
		s.mu.Lock()
		s.restart++
		s.mu.Unlock()
		s.log.Info("ollama serve restarted", "url", s.base.String())
		if s.cfg.OnRestart != nil {
			s.cfg.OnRestart()
		}
	}
}

// respawn starts the server again until it answers, backing off between
// tries. It returns nil as soon as the server is closed.
func (s *Server) respawn() <-chan error {
	backoff := s.cfg.Backoff
	for {
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			return nil
		}
		backoff = min(2*backoff, max(s.cfg.MaxBackoff, s.cfg.Backoff))
		next, err := s.spawn()
		if err != nil {
			s.log.Error("restart failed", "err", err)
			continue
		}
		if err := s.waitReady(s.ctx, next); err != nil {
			s.log.Error("restarted server did not come up", "err", err)
			s.stopProcess()
			if s.ctx.Err() != nil {
				return nil
			}
			continue
		}
		return next
	}
}

// Close stops the server: it cancels any restart in progress, then sends
// SIGTERM to the server's process group (its runners too) and SIGKILL
// after StopTimeout. It returns once the supervisor has stopped.
func (s *Server) Close() error {
	s.stop()
	s.stopProcess()
	<-s.done
	return nil
}

func (s *Server) stopProcess() {
	s.mu.Lock()
	cmd, gone := s.cmd, s.gone
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM) // the runner subprocess too
	select {
	case <-gone:
	case <-time.After(s.cfg.StopTimeout):
		s.log.Warn("ollama serve ignored SIGTERM; killing it", "after", s.cfg.StopTimeout)
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-gone
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL) // a runner left behind in the group
}

// tail returns the last n bytes of a file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	off := max(0, info.Size()-n)
	buf := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return "(log unreadable: " + err.Error() + ")"
	}
	return string(buf)
}
