package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/reporoot"
	"github.com/ctxd/ctxd/systemd"
)

// TestServiceAsSystemdRunsIt does what systemd does with the units `ctxd
// systemd-units` writes, without systemd: it runs the ctxd binary as the
// service's ExecStart does, hands it the listening socket as systemd's
// socket unit would (LISTEN_FDS), turns the watchdog on (WATCHDOG_USEC)
// and listens on NOTIFY_SOCKET (Type=notify): it expects READY=1, STATUS=
// lines that follow the daemon (the backend, the codex, the session it
// asked in), WATCHDOG=1 pings, and on SIGTERM STOPPING=1 and a clean exit
// well within the unit's TimeoutStopSec.
func TestServiceAsSystemdRunsIt(t *testing.T) {
	needOllama(t)
	dir := daemontest.ShortDir(t)
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
	svc := startService(t, bin, config, os.Environ(), sock)
	_, before := svc.await(t, "READY=1", is("READY=1"))
	t.Logf("notifications before READY=1: %q", before)
	sum, err := client.New(sock).Ask(context.Background(), ctxd.AskRequest{Session: "systemd", Query: "What does Handler2 return?"}, nil)
	if err != nil || sum.Turn != 1 {
		t.Fatalf("ask through the activated socket: %+v %v", sum, err)
	}
	// The line follows the daemon: once the answer is done, its session
	// and the slot that holds its prompt.
	status, _ := svc.await(t, "a STATUS= line with the session and its warm slot", func(m string) bool {
		return strings.HasPrefix(m, "STATUS=ready · ollama") && strings.Contains(m, "1 session, 1 slot warm, 0 busy")
	})
	for _, want := range []string{"ctxd-test", "num_ctx 4096 × 1 slot", "codex ", " cag"} {
		if !strings.Contains(status, want) {
			t.Errorf("status line %q lacks %q", status, want)
		}
	}
	svc.await(t, "WATCHDOG=1", is("WATCHDOG=1"))
	svc.stop(t)
}

// TestMakeInstallAsTheReadmeSays runs `make install` into a scratch
// $HOME, as README "Running under systemd" says, and checks what it
// installs: the binary, the managed Ollama, the demo model, a config
// (kept on a second install) and units that systemd-analyze accepts. Then
// it starts the service exactly as the installed unit's ExecStart says,
// with an activated socket where the socket unit puts it, and asks
// `ctxd status` (the README's last command) without telling it where.
func TestMakeInstallAsTheReadmeSays(t *testing.T) {
	needOllama(t)
	ollamaBin, err := filepath.EvalSymlinks(os.Getenv("CTXD_OLLAMA_BIN"))
	if os.Getenv("CTXD_OLLAMA_BIN") == "" {
		ollamaBin, err = filepath.EvalSymlinks(filepath.Join(repoRoot(t), "bin", "ollama"))
	}
	if err != nil {
		t.Fatal(err)
	}
	// The README's commands, which this test runs: make install as
	// written (its build outputs sent to a scratch directory, not the
	// tree's bin/ and var/), systemctl's part as systemd would, and
	// status as written.
	readme := strings.Split(strings.TrimSpace(readmeBlock(t, "systemd")), "\n")
	if want := []string{"make install", "systemctl --user daemon-reload && systemctl --user enable --now ctxd.socket", "~/.local/bin/ctxd status"}; !slices.Equal(readme, want) {
		t.Fatalf("README's systemd block is %q; this test runs %q: make them agree", readme, want)
	}
	home, scratch, runtime := t.TempDir(), t.TempDir(), daemontest.ShortDir(t)
	env := installEnv(t, home, runtime)
	install := func() string {
		t.Helper()
		cmd := exec.Command("sh", "-c", readme[0]+` "$@"`, "sh",
			"CTXD="+filepath.Join(scratch, "ctxd"), "OLLAMA_PIN="+ollamaBin, "DEMO_MODEL="+filepath.Join(scratch, "ctxd-demo.gguf"))
		cmd.Dir, cmd.Env = repoRoot(t), env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
		return string(out)
	}
	out := install()
	t.Logf("make install:\n%s", out)

	local, conf := filepath.Join(home, ".local"), filepath.Join(home, ".config")
	config := filepath.Join(conf, "ctxd", "ctxd.toml")
	units := filepath.Join(conf, "systemd", "user")
	for path, mode := range map[string]os.FileMode{
		filepath.Join(local, "bin", "ctxd"):                     0o755,
		filepath.Join(local, "lib", "ctxd", "ollama"):           0o755,
		filepath.Join(local, "share", "ctxd", "ctxd-demo.gguf"): 0o644,
		config:                                0o600,
		filepath.Join(units, "ctxd.service"):  0o644,
		filepath.Join(units, "ctxd.socket"):   0o644,
		filepath.Join(local, "state", "ctxd"): 0o700 | os.ModeDir, // the service's only writable directory
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Errorf("make install did not make %s: %v", path, err)
		} else if fi.Mode() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
		}
	}
	service, err := os.ReadFile(filepath.Join(units, "ctxd.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(service), `ReadWritePaths=-%t/ctxd "`+filepath.Join(local, "state", "ctxd")+`"`) {
		t.Errorf("the installed service does not make the config's state directory writable:\n%s", service)
	}
	switch err := systemd.Verify(t.Context(), env, filepath.Join(units, "ctxd.socket"), filepath.Join(units, "ctxd.service")); {
	case errors.Is(err, systemd.ErrNoAnalyzer) && os.Getenv("CTXD_REQUIRE_SYSTEMD") != "1":
		t.Log("systemd-analyze not installed: the installed units were not checked by systemd")
	case err != nil:
		t.Errorf("the installed units: %v", err)
	}

	// A second install keeps the operator's config.
	edited := []byte("# mine\n")
	old, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, append(edited, old...), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := install(); !strings.Contains(out, "kept "+config) {
		t.Errorf("second make install did not say it kept the config:\n%s", out)
	}
	if b, _ := os.ReadFile(config); !strings.HasPrefix(string(b), string(edited)) {
		t.Error("second make install overwrote the config")
	}

	// The service as the installed unit runs it, its socket where the
	// socket unit makes it (%t/ctxd/ctxd.sock, mode 0700 directory).
	m := regexp.MustCompile(`(?m)^ExecStart="([^"]+)" serve --config "([^"]+)"$`).FindStringSubmatch(string(service))
	if m == nil {
		t.Fatalf("no ExecStart of the expected form in the installed unit:\n%s", service)
	}
	unquote := strings.NewReplacer("%%", "%", "$$", "$")
	bin, cfgPath := unquote.Replace(m[1]), unquote.Replace(m[2])
	if err := os.Mkdir(filepath.Join(runtime, "ctxd"), 0o700); err != nil {
		t.Fatal(err)
	}
	svc := startService(t, bin, cfgPath, env, filepath.Join(runtime, "ctxd", "ctxd.sock"))
	svc.await(t, "READY=1", is("READY=1"))
	cmd := exec.Command("sh", "-c", readme[2])
	cmd.Env = env
	status, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ctxd status: %v\n%s", err, status)
	}
	for _, want := range []string{" · ready\n", "model ctxd-demo", "codex        none loaded", "config       " + config} {
		if !strings.Contains(string(status), want) {
			t.Errorf("ctxd status lacks %q:\n%s", want, status)
		}
	}
	svc.stop(t)
}

// service is the ctxd binary run as systemd runs the service: its socket
// handed over (LISTEN_FDS), its notifications read from NOTIFY_SOCKET,
// the watchdog on.
type service struct {
	cmd    *exec.Cmd
	exited chan error
	msgs   chan string // notifications, one datagram each
}

func startService(t *testing.T, bin, config string, env []string, sock string) *service {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	lnFile, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lnFile.Close()
	notifyPath := filepath.Join(daemontest.ShortDir(t), "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &service{exited: make(chan error, 1), msgs: make(chan string, 1024)}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := notify.Read(buf)
			if err != nil {
				return
			}
			s.msgs <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { notify.Close(); <-read })

	// systemd sets LISTEN_PID and WATCHDOG_PID to the service's pid; exec
	// keeps the shell's. WatchdogSec=2s: pings at least every second.
	s.cmd = exec.Command("sh", "-c", `LISTEN_PID=$$ WATCHDOG_PID=$$ exec "$0" serve --config "$1"`, bin, config)
	s.cmd.Env = append(env, "LISTEN_FDS=1", "LISTEN_FDNAMES=ctxd.socket", "NOTIFY_SOCKET="+notifyPath, "WATCHDOG_USEC=2000000", "CTXD_SOCKET=")
	s.cmd.ExtraFiles = []*os.File{lnFile}
	s.cmd.Stderr = testWriter{t}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(func() {
		if s.cmd.ProcessState == nil {
			s.cmd.Process.Kill()
			<-s.exited
		}
	})
	return s
}

func is(state string) func(string) bool { return func(m string) bool { return m == state } }

// await returns the first notification that satisfies want, and those
// before it; it fails if ctxd exits first or nothing comes in 2 minutes
// (a cold model import on two cores).
func (s *service) await(t *testing.T, what string, want func(string) bool) (string, []string) {
	t.Helper()
	var before []string
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case m := <-s.msgs:
			if want(m) {
				return m, before
			}
			before = append(before, m)
		case err := <-s.exited:
			s.exited <- err
			t.Fatalf("ctxd exited (%v) before %s; notifications: %q", err, what, before)
		case <-timeout:
			t.Fatalf("no %s within 2 minutes; notifications: %q", what, before)
		}
	}
}

// stop sends SIGTERM as systemd does and expects STOPPING=1, then exit 0
// within the unit's TimeoutStopSec (30 s).
func (s *service) stop(t *testing.T) {
	t.Helper()
	stopAsked := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	s.await(t, "STOPPING=1", func(m string) bool { return strings.HasPrefix(m, "STOPPING=1") })
	select {
	case err := <-s.exited:
		if err != nil {
			t.Errorf("ctxd exited with %v after SIGTERM, want 0", err)
		}
		t.Logf("stopped %v after SIGTERM", time.Since(stopAsked).Round(time.Millisecond))
	case <-time.After(30 * time.Second): // the unit's TimeoutStopSec
		t.Fatal("ctxd did not stop within the unit's TimeoutStopSec (30 s)")
	}
}

// installEnv is the environment of a user session with home as $HOME and
// runtime as $XDG_RUNTIME_DIR, the Go caches kept (a fresh $HOME would
// have none) and no XDG or ctxd settings of the session running the test.
func installEnv(t *testing.T, home, runtime string) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	goenv := strings.Fields(string(out))
	if len(goenv) != 3 {
		t.Fatalf("go env: %q", out)
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "XDG_") || strings.HasPrefix(k, "CTXD_") || k == "HOME" || k == "MAKEFLAGS" || k == "MFLAGS" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home, "XDG_RUNTIME_DIR="+runtime,
		"GOCACHE="+goenv[0], "GOMODCACHE="+goenv[1], "GOPATH="+goenv[2])
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := reporoot.Find()
	if err != nil {
		t.Fatal(err)
	}
	return root
}
