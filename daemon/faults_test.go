package daemon

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/logtest"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/fake"
)

// runOn runs a daemon on fakes serving on ln, and waits until it is ready.
func runOn(t *testing.T, ln net.Listener, socket string) *logtest.Lines {
	t.Helper()
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	cfg.Daemon.Socket = socket
	cfg.Daemon.StateDir = t.TempDir()
	cfg.Daemon.ShutdownGrace = config.Duration{Duration: 5 * time.Second}
	cfg.Limits.AnswerReserve = 64
	backend := fake.NewBackend()
	open := func(context.Context, func()) (*bringup.Model, error) {
		return daemontest.Model(backend, fake.Tokenizer{}, 100000, 1), nil
	}
	log := logtest.NewLines(t)
	d, err := New(cfg, Options{Open: open, Store: fake.NewStore(), Sensor: fake.NewSensor(), Version: "test",
		Logger: slog.New(slog.NewTextHandler(log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d, ln)
	return log
}

// waitUntil polls cond until it holds, failing the test after a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// askFake asks through a new client: one that connected before keeps its
// connection, which the socket's file going does not close.
func askFake(socket, session string) error {
	_, err := client.New(socket).Ask(context.Background(), ctxd.AskRequest{Session: session, Query: "What does Serve do?"}, nil)
	return err
}

// TestSocketRemovedIsRecreated: the socket's directory removed while the
// daemon serves cuts new clients off (they are told no daemon listens
// there); the daemon notices, logs it, makes the directory and the socket
// again with the modes Listen gives them, and the next ask succeeds, with
// no restart.
func TestSocketRemovedIsRecreated(t *testing.T) {
	t.Parallel()
	dir := daemontest.ShortDir(t)
	socket := filepath.Join(dir, "run", "ctxd.sock")
	ln, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	log := runOn(t, ln, socket)
	if err := askFake(socket, "s"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(socket)); err != nil {
		t.Fatal(err)
	}
	err = askFake(socket, "s")
	if err == nil {
		// The watch re-created it already: the client never saw the fault.
		t.Log("the socket was back before the client asked")
	} else if !strings.Contains(err.Error(), "cannot reach the daemon at "+socket) || !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("the client's error with the socket gone does not say so: %v", err)
	}
	waitUntil(t, "the socket re-created", func() bool {
		_, ok := log.Find("socket re-created")
		return ok
	})
	if err := askFake(socket, "s"); err != nil {
		t.Fatalf("ask after the socket was re-created: %v", err)
	}
	if line, ok := log.Find("socket lost", "directory "+filepath.Dir(socket)+" was removed"); !ok {
		t.Error("the log does not say the socket's directory was removed")
	} else {
		t.Logf("logged: %s", line)
	}
	for path, want := range map[string]fs.FileMode{socket: 0o600, filepath.Dir(socket): 0o700} {
		if info, err := os.Stat(path); err != nil || info.Mode().Perm() != want {
			t.Errorf("%s re-created with %v (%v), want %04o", path, info.Mode().Perm(), err, want)
		}
	}
	// The file alone, this time.
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the socket re-created after its file was removed", func() bool {
		_, ok := log.Find("socket lost", "its file was removed")
		return ok && askFake(socket, "s") == nil
	})
}

// TestPassedInSocketIsNotRecreated: a socket the daemon did not make
// (systemd's socket activation passes one in) is systemd's: when its file
// is removed the daemon logs that clients cannot connect and who must
// re-create it, and leaves the path alone.
func TestPassedInSocketIsNotRecreated(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(daemontest.ShortDir(t), "ctxd.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	log := runOn(t, ln, socket)
	if _, ok := log.Find("passed in", "does not re-create"); !ok {
		t.Error("the log does not say a passed-in socket is not re-created")
	}
	if err := askFake(socket, "s"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(socket); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the lost socket logged", func() bool {
		_, ok := log.Find("socket lost", "systemd")
		return ok
	})
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the daemon put something at a passed-in socket's path: %v", err)
	}
	if err := askFake(socket, "s"); err == nil {
		t.Error("a client reached the daemon through a removed socket")
	}
}
