package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// UID is the user a root test runs PostgreSQL as (nobody).
const UID = 65534

// Mode is how Stop shuts the server down.
type Mode int

const (
	// Fast aborts the open transactions, checkpoints and exits (pg_ctl
	// stop -m fast; SIGINT).
	Fast Mode = iota
	// Immediate exits at once, without a checkpoint, as a crash would:
	// the next start recovers from the write-ahead log (pg_ctl stop -m
	// immediate; SIGQUIT).
	Immediate
)

// timeout bounds each start, stop and database made or dropped.
const timeout = time.Minute

// Cluster is one PostgreSQL server and its data directory. Its methods
// are safe for concurrent use.
type Cluster struct {
	bins Binaries
	dir  string // scratch: data/, the socket, postgres.log
	port int    // the loopback port, kept across restarts
	cred *syscall.Credential
	dbs  atomic.Int64 // databases made, to name the next

	mu   sync.Mutex    // guards the fields below; held through a start or a stop
	cmd  *exec.Cmd     // the running postmaster; nil when stopped
	done chan struct{} // closed when cmd has exited
}

// create makes a cluster in a fresh directory under /tmp (initdb) and
// starts it.
func create() (*Cluster, error) {
	bins, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	sweepOnce.Do(sweep)
	c := &Cluster{bins: bins}
	if os.Getuid() == 0 {
		c.cred = &syscall.Credential{Uid: UID, Gid: UID, Groups: []uint32{}}
	}
	if c.dir, err = os.MkdirTemp("/tmp", dirPrefix); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.dir, ownerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, UID, UID); err != nil {
			os.RemoveAll(c.dir)
			return nil, err
		}
	}
	initdb := c.command(bins.Initdb, "-D", c.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync")
	if out, err := run(initdb); err != nil {
		os.RemoveAll(c.dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	for try := 0; ; try++ {
		if c.port, err = freePort(); err != nil {
			break
		}
		if err = c.start(); err == nil || try == 2 {
			break
		}
	}
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
	return c, nil
}

func (c *Cluster) data() string    { return filepath.Join(c.dir, "data") }
func (c *Cluster) logFile() string { return filepath.Join(c.dir, "postgres.log") }

// command is a PostgreSQL program run as the cluster's user, in its
// directory. Should the test binary die, the program is sent SIGQUIT
// (PostgreSQL's immediate shutdown), so none outlives it; start it with
// start (process.go), which makes that hold.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = c.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "TZ=UTC"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	return cmd
}

// freePort is a loopback port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Port is the loopback port the server listens on.
func (c *Cluster) Port() int { return c.port }

// SocketDir is the directory of the server's Unix socket.
func (c *Cluster) SocketDir() string { return c.dir }

// URL is the URL of database db over TCP, on the loopback port.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// SocketURL is the URL of database db over the Unix socket.
func (c *Cluster) SocketURL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d", db, c.dir, c.port)
}

// Start starts the server unless it runs, and waits until it accepts
// connections (after a crash, once it has recovered).
func (c *Cluster) Start(tb testing.TB) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return
	}
	if err := c.startLocked(); err != nil {
		tb.Fatal(err)
	}
}

// Stop stops the server, as mode says, unless it is stopped.
func (c *Cluster) Stop(tb testing.TB, mode Mode) {
	tb.Helper()
	if err := c.stop(mode); err != nil {
		tb.Fatal(err)
	}
}

// Restart stops the server (Fast) and starts it again: the same data, the
// same port and socket.
func (c *Cluster) Restart(tb testing.TB) {
	tb.Helper()
	c.Stop(tb, Fast)
	c.Start(tb)
}

func (c *Cluster) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startLocked()
}

func (c *Cluster) startLocked() error {
	log, err := os.OpenFile(c.logFile(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := c.command(c.bins.Postgres, "-D", c.data(),
		"-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(c.port), "-c", "unix_socket_directories="+c.dir,
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = log, log
	if err := start(cmd); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	c.cmd, c.done = cmd, done
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		conn, err := pgconn.Connect(ctx, c.SocketURL("postgres")+"&connect_timeout=5")
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-done:
			c.cmd, c.done = nil, nil
			return fmt.Errorf("postgres exited at its start (%v): %s", cmd.ProcessState, tail(c.logFile(), 2000))
		case <-ctx.Done():
			c.signalLocked(syscall.SIGKILL)
			return fmt.Errorf("postgres did not accept connections within %s: %v\n%s", timeout, err, tail(c.logFile(), 2000))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop shuts the server down as mode says and waits for it to exit.
func (c *Cluster) stop(mode Mode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
		c.cmd, c.done = nil, nil
		return nil
	case <-time.After(timeout):
	}
	c.signalLocked(syscall.SIGKILL)
	return fmt.Errorf("postgres did not stop within %s (%v); killed", timeout, sig)
}

// signalLocked sends sig to the postmaster and, for SIGKILL, waits for it.
func (c *Cluster) signalLocked(sig syscall.Signal) {
	c.cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL {
		<-c.done
		c.cmd, c.done = nil, nil
	}
}

// destroy stops the server and removes its directory.
func (c *Cluster) destroy() error {
	err := c.stop(Fast)
	return errors.Join(err, os.RemoveAll(c.dir))
}

// NewDatabase creates a fresh database and returns its URL (over TCP); it
// is dropped when tb ends. Where the server has ICU, the database collates
// as en-US does, as many production databases do, so that a store that
// relies on byte order must say so in its queries.
func (c *Cluster) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("ctxd_test_%d", c.dbs.Add(1))
	if err := c.admin(func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 STRATEGY FILE_COPY LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
		if err != nil {
			_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
		}
		return err
	}); err != nil {
		tb.Fatalf("create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		c.mu.Lock()
		running := c.cmd != nil
		c.mu.Unlock()
		if !running {
			return // stopped by the test: the cluster goes with its directory
		}
		if err := c.admin(func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			return err
		}); err != nil {
			tb.Errorf("drop database %s: %v", name, err)
		}
	})
	return c.URL(name)
}

// admin runs fn on a connection to the maintenance database, over the
// socket.
func (c *Cluster) admin(fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.SocketURL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return fn(ctx, conn)
}
