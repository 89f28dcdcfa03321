// Package supervise runs a model server as a child process: it starts it
// in its own process group, waits until it answers, restarts it with
// backoff when it dies, and stops it (and whatever it started, such as
// Ollama's runners) with SIGTERM, then SIGKILL. When the server crashes,
// whatever it left in its process group is killed before the restart.
// The adapters (ollama, llamacpp) say how to build the command and how to
// tell it is ready.
//
// Given the server's address, it makes sure ctxd talks to the process it
// started and to no other: a start or restart is ready only once the
// socket there is held by the child's process group (another local user
// may have bound the port after a crash), and DialContext checks every
// connection the same way. The check reads Linux's /proc (package
// sockowner); where it cannot be made, the supervisor logs so once and
// goes on unchecked.
//
// It knows no server's API; it does not retry requests.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/ctxd/ctxd/sockowner"
)

// Config says what to run and how to know it runs.
type Config struct {
	Name    string                      // for logs and errors, e.g. "ollama serve"
	Command func() *exec.Cmd            // a fresh command for each start (binary, args, env)
	LogPath string                      // where the process's output goes (appended)
	Ready   func(context.Context) error // nil once the server answers
	// Network ("tcp", the default, or "unix") and Addr (a loopback
	// host:port with an IP address, or a socket path) are where the server
	// listens. When Addr is set, a start or restart is ready only once the
	// socket there is held by the started process's group (running as
	// ctxd's user), and DialContext reaches that process only.
	Network, Addr string
	// ReadyTimeout bounds a start; 0 means 60 seconds.
	ReadyTimeout time.Duration
	// OnRestart is called after a crashed process was restarted: whatever
	// the old one held (its KV cache) is gone.
	OnRestart func()
	// StopTimeout is how long Close waits after SIGTERM before SIGKILL;
	// 0 means 5 seconds.
	StopTimeout time.Duration
	// Backoff is the first wait before a restart, doubling up to
	// MaxBackoff; 0 means 1 second and 30 seconds.
	Backoff    time.Duration
	MaxBackoff time.Duration
	Logger     *slog.Logger
}

// Process is a supervised server process.
type Process struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex // guards cmd, gone, restart, paused
	cmd     *exec.Cmd
	gone    chan struct{} // closed when cmd has exited and been reaped
	restart int
	paused  bool // Pause stopped it: its exit is not a crash, and nothing restarts it but Resume

	parked  chan struct{}       // the supervisor waits for Resume (after a Pause)
	resumed chan (<-chan error) // Resume hands the supervisor the new process's exit
	pauseMu sync.Mutex          // one Pause or Resume at a time

	unchecked sync.Once // logs that the socket's owner cannot be checked here
	// checkConn checks who holds the server end of a connection
	// DialContext made (sockowner's CheckConn; tests count its calls).
	checkConn func(sockowner.Owner, net.Conn) error

	ctx  context.Context    // ends when Close is called: restarts stop waiting
	stop context.CancelFunc // ends ctx
	done chan struct{}      // closed when the supervisor has stopped
}

// Start starts the process and returns once it is ready. It fails with the
// tail of the process's log if the process exits or does not come up, and
// at once if another process holds the socket at Config.Addr.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 60 * time.Second
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
	if cfg.Network == "" {
		cfg.Network = "tcp"
	}
	if err := os.MkdirAll(filepath.Dir(cfg.LogPath), 0o700); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Name, err)
	}
	p := &Process{cfg: cfg, log: cfg.Logger.With("component", cfg.Name), done: make(chan struct{}),
		checkConn: sockowner.Owner.CheckConn, parked: make(chan struct{}, 1), resumed: make(chan (<-chan error))}
	p.ctx, p.stop = context.WithCancel(context.Background())
	exited, err := p.spawn()
	if err != nil {
		return nil, err
	}
	if err := p.waitReady(ctx, exited); err != nil {
		p.stop()
		p.stopProcess()
		return nil, err
	}
	go p.supervise(exited)
	return p, nil
}

// PID is the process id of the current process.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Restarts is how often the supervisor restarted the process.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restart
}

// spawn starts the process; the returned channel yields its exit error.
func (p *Process) spawn() (<-chan error, error) {
	logf, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: log: %w", p.cfg.Name, err)
	}
	cmd := p.cfg.Command()
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a terminal's Ctrl-C reaches ctxd only and
	// ctxd decides the stop order; and its children die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	// The parent-death signal is tied to the thread that forks the child,
	// not to ctxd: when that thread ends (Go ends a thread whose goroutine
	// exits while locked to it, as ctxd's background token count does), the
	// child gets SIGTERM. So the child is started from a thread locked to a
	// goroutine that waits for it: that thread lives as long as the child.
	started := make(chan error, 1)
	gone := make(chan struct{})
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.mu.Lock()
		p.cmd, p.gone = cmd, gone
		p.mu.Unlock()
		started <- nil
		exited <- cmd.Wait()
		close(gone)
		logf.Close()
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: start %s: %w", p.cfg.Name, cmd.Path, err)
	}
	return exited, nil
}

// waitReady waits until the process answers and, given its address, holds
// the socket there: something else answering there (another user's
// process that bound the port first) is refused at once.
func (p *Process) waitReady(ctx context.Context, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	for {
		if err := p.cfg.Ready(ctx); err == nil {
			err := p.verify()
			if err == nil {
				return nil
			}
			if errors.Is(err, sockowner.ErrNotOwned) {
				return fmt.Errorf("%s: refusing the server that answers on %s, which ctxd did not start: %w; log %s:\n%s",
					p.cfg.Name, p.cfg.Addr, err, p.cfg.LogPath, Tail(p.cfg.LogPath, 2048))
			}
		}
		select {
		case err := <-exited:
			// A server that could not bind its port because another
			// process holds it: say who, rather than only that it exited.
			if p.cfg.Addr != "" {
				if verr := p.heldByOther(); errors.Is(verr, sockowner.ErrNotOwned) {
					return fmt.Errorf("%s exited during start (%v): %w; log %s:\n%s",
						p.cfg.Name, err, verr, p.cfg.LogPath, Tail(p.cfg.LogPath, 2048))
				}
			}
			return fmt.Errorf("%s exited during start (%v); log %s:\n%s", p.cfg.Name, err, p.cfg.LogPath, Tail(p.cfg.LogPath, 2048))
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer: %w; log %s:\n%s", p.cfg.Name, ctx.Err(), p.cfg.LogPath, Tail(p.cfg.LogPath, 2048))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// supervise restarts the process when it exits unexpectedly, with
// backoff, until Close.
func (p *Process) supervise(exited <-chan error) {
	defer close(p.done)
	for {
		var err error
		select {
		case err = <-exited:
		case <-p.ctx.Done():
			return
		}
		if p.ctx.Err() != nil {
			return // Close stops the group
		}
		if p.Paused() {
			p.parked <- struct{}{}
			select {
			case exited = <-p.resumed:
				continue
			case <-p.ctx.Done():
				return
			}
		}
		// What it started (Ollama's runners, holding the model in
		// memory) would outlive it in its process group.
		p.killGroup()
		p.log.Error(p.cfg.Name+" exited unexpectedly; restarting", "err", err, "log_tail", Tail(p.cfg.LogPath, 512))
		next := p.respawn()
		if next == nil {
			return // closing
		}
		exited = next
		if p.Paused() { // paused during the restart: stopped, and parked on the next turn
			p.stopProcess()
			continue
		}
		p.mu.Lock()
		p.restart++
		p.mu.Unlock()
		p.log.Info(p.cfg.Name + " restarted")
		if p.cfg.OnRestart != nil {
			p.cfg.OnRestart()
		}
	}
}

// respawn starts the process again until it answers, backing off between
// tries. It returns nil as soon as the process is closed.
func (p *Process) respawn() <-chan error {
	backoff := p.cfg.Backoff
	for {
		select {
		case <-time.After(backoff):
		case <-p.ctx.Done():
			return nil
		}
		backoff = min(2*backoff, max(p.cfg.MaxBackoff, p.cfg.Backoff))
		next, err := p.spawn()
		if err != nil {
			p.log.Error("restart failed", "err", err)
			continue
		}
		if err := p.waitReady(p.ctx, next); err != nil {
			p.log.Error("the restarted process did not come up", "err", err)
			p.stopProcess()
			if p.ctx.Err() != nil {
				return nil
			}
			continue
		}
		return next
	}
}

// Paused reports whether Pause stopped the process and no Resume has
// started it again.
func (p *Process) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Pause stops the process (SIGTERM, then SIGKILL after StopTimeout) and
// keeps it stopped: its exit is not a crash, and the supervisor restarts
// it only when Resume says so. It gives the process's memory back while
// its configuration stays. Pausing a paused process does nothing.
func (p *Process) Pause() error {
	p.pauseMu.Lock()
	defer p.pauseMu.Unlock()
	p.mu.Lock()
	if p.paused {
		p.mu.Unlock()
		return nil
	}
	p.paused = true
	p.mu.Unlock()
	p.stopProcess()
	select {
	case <-p.parked: // the supervisor saw the exit and waits for Resume
	case <-p.done:
		return fmt.Errorf("%s: closed", p.cfg.Name)
	}
	p.log.Info(p.cfg.Name + " paused")
	return nil
}

// Resume starts a paused process again and returns once it is ready, as
// Start does; from then on the supervisor restarts it on a crash again.
// A start that fails leaves it paused, and a later Resume tries again.
// Resuming a process that is not paused does nothing.
func (p *Process) Resume(ctx context.Context) error {
	p.pauseMu.Lock()
	defer p.pauseMu.Unlock()
	if !p.Paused() {
		return nil
	}
	if p.ctx.Err() != nil {
		return fmt.Errorf("%s: closed", p.cfg.Name)
	}
	exited, err := p.spawn()
	if err != nil {
		return err
	}
	if err := p.waitReady(ctx, exited); err != nil {
		p.stopProcess()
		return err
	}
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	select {
	case p.resumed <- exited:
	case <-p.done: // closed meanwhile: Close stops what was started
		p.stopProcess()
		return fmt.Errorf("%s: closed", p.cfg.Name)
	}
	p.log.Info(p.cfg.Name + " resumed")
	return nil
}

// Close stops the process: it cancels any restart in progress, then sends
// SIGTERM to the process group and SIGKILL after StopTimeout. It returns
// once the supervisor has stopped.
func (p *Process) Close() error {
	p.stop()
	p.stopProcess()
	<-p.done
	return nil
}

func (p *Process) stopProcess() {
	p.mu.Lock()
	cmd, gone := p.cmd, p.gone
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM) // its children too
	select {
	case <-gone:
	case <-time.After(p.cfg.StopTimeout):
		p.log.Warn(p.cfg.Name+" ignored SIGTERM; killing it", "after", p.cfg.StopTimeout)
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-gone
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL) // a child left behind in the group
}

// killGroup kills what is left in the process group of a process that
// crashed.
func (p *Process) killGroup() {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err == nil {
		p.log.Info("killed what the crashed "+p.cfg.Name+" left in its process group", "pgid", cmd.Process.Pid)
	}
}

// errNotRunning: the process exited and is not yet restarted.
var errNotRunning = errors.New("not running")

// owner is who must hold the server's socket: the running process's group,
// as ctxd's user.
func (p *Process) owner() (sockowner.Owner, error) {
	p.mu.Lock()
	cmd, gone := p.cmd, p.gone
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return sockowner.Owner{}, fmt.Errorf("%s: %w", p.cfg.Name, errNotRunning)
	}
	select {
	case <-gone: // its pid may be another process's by now
		return sockowner.Owner{}, fmt.Errorf("%s: %w (restarting)", p.cfg.Name, errNotRunning)
	default:
	}
	return sockowner.Owner{PGID: cmd.Process.Pid, UID: os.Geteuid()}, nil
}

// heldByOther is verify for a process that has exited: its group is
// gone, so whoever holds Config.Addr now is another process.
func (p *Process) heldByOther() error {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	return sockowner.Owner{PGID: cmd.Process.Pid, UID: os.Geteuid()}.CheckListener(p.cfg.Network, p.cfg.Addr)
}

// verify checks that the running process holds the socket at Config.Addr.
func (p *Process) verify() error {
	if p.cfg.Addr == "" {
		return nil
	}
	owner, err := p.owner()
	if err != nil {
		return err
	}
	return p.allowUnchecked(owner.CheckListener(p.cfg.Network, p.cfg.Addr))
}

// allowUnchecked passes a check that cannot be made on this system, and
// says so once.
func (p *Process) allowUnchecked(err error) error {
	if errors.Is(err, errors.ErrUnsupported) {
		p.unchecked.Do(func() {
			p.log.Warn("cannot check that the server on "+p.cfg.Addr+" is the process started", "err", err)
		})
		return nil
	}
	return err
}

var dialer = &net.Dialer{Timeout: 5 * time.Second}

// DialContext is a dialer for the server's clients (an http.Transport's
// DialContext). Given Config.Addr, it dials that address, whatever it is
// asked for, and returns the connection only if the running process holds
// its server end; else an error of Op "dial" that says who does, or that
// the process is restarting. Without Config.Addr it dials as asked.
//
// The check is made once per connection, here: a client keeps its
// connections (an http.Transport's pool) and reads its answers to the end,
// so that requests reuse them. A connection checked stays the server's: it
// ends with the process that accepted it, and a restarted server is
// reached over new, checked ones. Servers still close connections
// (llama-server after every streamed completion, and idle ones after a few
// seconds), so a request often comes on a new connection: the check is on
// the request path, and sockowner keeps it to tens of microseconds.
func (p *Process) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if p.cfg.Addr == "" {
		return dialer.DialContext(ctx, network, address)
	}
	owner, err := p.owner()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: p.cfg.Network, Err: err}
	}
	c, err := dialer.DialContext(ctx, p.cfg.Network, p.cfg.Addr)
	if err != nil {
		return nil, err
	}
	if err := p.allowUnchecked(p.checkConn(owner, c)); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: p.cfg.Network, Addr: c.RemoteAddr(),
			Err: fmt.Errorf("%s: refusing a server ctxd did not start: %w", p.cfg.Name, err)}
	}
	return c, nil
}

// Tail returns the last n bytes of a file, for error messages.
func Tail(path string, n int64) string {
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
