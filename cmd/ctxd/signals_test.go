package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/httpapi"
)

// TestHelperServe is not a test: it is `ctxd` when the test binary runs
// itself as the daemon (CTXD_TEST_SERVE=1), with the arguments after "--".
func TestHelperServe(t *testing.T) {
	if os.Getenv("CTXD_TEST_SERVE") != "1" {
		t.Skip("the daemon's stand-in for TestSignals")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(run(args, os.Stdout, os.Stderr))
}

// TestSignals runs the daemon as its own process, as systemd does (stderr
// its journal), and drives it with signals: SIGHUP reloads the config
// file (a good one takes effect, a bad one is refused and the good one
// stays), SIGUSR1 turns debug logging on and off, and the log is JSON.
func TestSignals(t *testing.T) {
	dir, err := os.MkdirTemp("", "ctxd-sig-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "ctxd.sock")
	cfgPath := filepath.Join(dir, "ctxd.toml")
	write := func(agent string) {
		t.Helper()
		// The backend never answers: the daemon keeps trying to reach it,
		// and serves status, reload and its log level meanwhile.
		toml := fmt.Sprintf(`[daemon]
state_dir = %q
socket = %q
[backend]
mode = "external"
url = "http://127.0.0.1:9"
model = "absent"
[sigils.default]
scopes = ["ask", "admin"]
[sigils.agent]
%s
`, filepath.Join(dir, "state"), sock, agent)
		if err := os.WriteFile(cfgPath, []byte(toml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`scopes = ["ask"]`)

	logPath := filepath.Join(dir, "stderr")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(logFile.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperServe$", "--", "serve", "--config", cfgPath)
	cmd.Env = append(os.Environ(), "CTXD_TEST_SERVE=1", fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("the daemon did not stop on SIGTERM within 20s")
		}
	})
	c := client.New(sock)
	// Every request has a deadline: a daemon that stops answering fails
	// the test rather than hanging it.
	call := func(req func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return req(ctx)
	}
	status := func() httpapi.Status {
		t.Helper()
		var s httpapi.Status
		if err := call(func(ctx context.Context) error { return c.Status(ctx, &s) }); err != nil {
			t.Fatalf("status: %v", err)
		}
		return s
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s; log:\n%s", what, readFile(t, logPath))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait("the daemon listens", func() bool {
		var s httpapi.Status
		return call(func(ctx context.Context) error { return c.Status(ctx, &s) }) == nil
	})
	if s := status(); s.Reload != nil || s.LogLevel != "info" || s.Config != cfgPath {
		t.Fatalf("before any signal: reload %+v, log level %q, config %q", s.Reload, s.LogLevel, s.Config)
	}

	signal := func(sig syscall.Signal) {
		t.Helper()
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	// SIGHUP with a good file: the agent's revocation takes effect.
	write(`scopes = ["ask"]
revoked = true`)
	signal(syscall.SIGHUP)
	wait("the reload", func() bool { r := status().Reload; return r != nil })
	if r := status().Reload; !r.OK || !strings.Contains(strings.Join(r.Applied, " "), "sigils") {
		t.Fatalf("reload: %+v", r)
	}
	if err := call(func(ctx context.Context) error { _, err := c.Sigil(ctx); return err }); err != nil {
		t.Fatalf("the default sigil: %v", err)
	}
	var sig struct{}
	if err := call(func(ctx context.Context) error { return c.GetJSON(ctx, "/v1/sigil?sigil=agent", &sig) }); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the revoked sigil after SIGHUP: %v", err)
	}
	// SIGHUP with a bad file: refused, and the revocation stays.
	first := status().Reload.At
	write(`scopes = ["ask", "fly"]`)
	signal(syscall.SIGHUP)
	wait("the second reload", func() bool { return !status().Reload.At.Equal(first) })
	if r := status().Reload; r.OK || !strings.Contains(r.Error, `"fly"`) {
		t.Errorf("a bad file was not refused by name: %+v", r)
	}
	if err := call(func(ctx context.Context) error { return c.GetJSON(ctx, "/v1/sigil?sigil=agent", &sig) }); err == nil {
		t.Error("a refused reload undid the revocation")
	}

	// SIGUSR1: debug, and back.
	signal(syscall.SIGUSR1)
	wait("debug logging", func() bool { return status().LogLevel == "debug" })
	signal(syscall.SIGUSR1)
	wait("info logging again", func() bool { return status().LogLevel == "info" })

	// The log is JSON (stderr is "the journal"), and says what happened.
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(readFile(t, logPath)))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line is not JSON: %q", sc.Text())
		}
		msgs = append(msgs, fmt.Sprint(line["msg"]))
	}
	log := strings.Join(msgs, "\n")
	for _, want := range []string{"reloaded", "reload refused: the running configuration stays in force", "log level changed"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
