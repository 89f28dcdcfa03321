package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

// TestServiceAsSystemdRunsIt does what systemd does with the units `ctxd
// systemd-units` writes, without systemd: it runs the ctxd binary as the
// service's ExecStart does, hands it the listening socket as systemd's
// socket unit would (LISTEN_FDS), waits for READY=1 on NOTIFY_SOCKET
// (Type=notify), asks a question through the socket, then sends SIGTERM
// and expects a clean exit well within the unit's TimeoutStopSec.
func TestServiceAsSystemdRunsIt(t *testing.T) {
	needOllama(t)
	dir := socketDir(t)
	bin := filepath.Join(t.TempDir(), "ctxd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/ctxd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfg := baseConfig(t, t.TempDir(), codexDir(t, 1500))
	config := filepath.Join(t.TempDir(), "ctxd.toml")
	toml := fmt.Sprintf(`[daemon]
state_dir = %q
[backend]
binary = %q
gguf = %q
model = %q
num_ctx = %d
[codex]
path = %q
[limits]
answer_reserve = %d
`, cfg.Daemon.StateDir, cfg.Backend.Binary, cfg.Backend.GGUF, cfg.Backend.Model, cfg.Backend.NumCtx, cfg.Codex.Path, cfg.Limits.AnswerReserve)
	if err := os.WriteFile(config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}

	sock := filepath.Join(dir, "ctxd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lnFile, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	notifyPath := filepath.Join(dir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()

	// systemd sets LISTEN_PID to the service's pid; exec keeps the shell's.
	cmd := exec.Command("sh", "-c", `LISTEN_PID=$$ exec "$0" serve --config "$1"`, bin, config)
	cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=ctxd.socket", "NOTIFY_SOCKET="+notifyPath, "CTXD_SOCKET=")
	cmd.ExtraFiles = []*os.File{lnFile}
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()

	ready := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				return
			}
			if msg := string(buf[:n]); strings.Contains(msg, "READY=1") {
				ready <- msg
				return
			}
		}
	}()
	select {
	case <-ready:
	case err := <-exited:
		t.Fatalf("ctxd exited before READY=1: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("no READY=1 within 2 minutes")
	}
	sum, err := client.New(sock).Ask(context.Background(), ctxd.AskRequest{Session: "systemd", Query: "What does Handler2 return?"}, nil)
	if err != nil || sum.Turn != 1 {
		t.Fatalf("ask through the activated socket: %+v %v", sum, err)
	}

	stopAsked := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("ctxd exited with %v after SIGTERM, want 0", err)
		}
		t.Logf("stopped %v after SIGTERM", time.Since(stopAsked).Round(time.Millisecond))
	case <-time.After(30 * time.Second): // the unit's TimeoutStopSec
		t.Fatal("ctxd did not stop within the unit's TimeoutStopSec (30 s)")
	}
}
