package integration

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/logtest"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/ollama"
)

// writeReliability names the file (docs/reliability.md) whose faults
// section TestFaults rewrites with what it saw.
var writeReliability = flag.String("write-reliability", "", "rewrite the faults section of this file (docs/reliability.md) with TestFaults' table")

// faultsCommand reproduces the table; the section states it.
const faultsCommand = "CTXD_REQUIRE_OLLAMA=1 CTXD_OLLAMA_BIN=$PWD/bin/ollama go test -count=1 -run TestFaults ./integration -args -write-reliability ../docs/reliability.md"

// faultRow is one fault as TestFaults met it.
type faultRow struct {
	fault     string
	client    string // the error the client got
	log       string // the daemon's log line that names the fault
	recovered string // how long after the fault cleared an ask succeeded again
}

// TestFaults injects each fault into a real daemon and checks that the
// client gets an error naming the problem (not a bare status, not a
// hang), that the daemon logs it, stays up, and serves again by itself
// once the fault clears, with no restart. Each subtest records what the
// client saw, what the log said and how long recovery took; with
// -write-reliability the table goes into docs/reliability.md.
//
// The store faults need root (mount); they skip, saying so, without it.
func TestFaults(t *testing.T) {
	needOllama(t)
	var (
		mu   sync.Mutex
		rows []faultRow
	)
	record := func(r faultRow) {
		mu.Lock()
		rows = append(rows, r)
		mu.Unlock()
	}
	// One external Ollama, holding the model, for the faults that are not
	// the backend's.
	srv := ollamatest.Start(t)
	if err := ollama.New(srv.URL(), "ctxd-test", ollama.Options{}).Import(context.Background(), modelPath(t, testModel())); err != nil {
		t.Fatal(err)
	}
	external := func(t *testing.T, stateDir string) config.Config {
		cfg := baseConfig(t, stateDir, "")
		cfg.Backend.Mode, cfg.Backend.URL = "external", srv.URL().String()
		return cfg
	}
	faults := []struct {
		name string
		run  func(t *testing.T) faultRow
	}{
		{"backend killed mid-stream", faultBackendKilled},
		{"backend slow to start", faultBackendLate},
		{"backend answering garbage", func(t *testing.T) faultRow { return faultBackendGarbage(t, srv) }},
		{"store directory read-only", func(t *testing.T) faultRow { return faultStoreReadOnly(t, external) }},
		{"disk full under the store", func(t *testing.T) faultRow { return faultDiskFull(t, external) }},
		{"socket directory removed", func(t *testing.T) faultRow { return faultSocketRemoved(t, external) }},
	}
	for _, f := range faults {
		t.Run(strings.ReplaceAll(f.name, " ", "_"), func(t *testing.T) {
			row := faultRow{fault: f.name, client: "(not reached)", log: "(not reached)", recovered: "(not reached)"}
			defer func() {
				if t.Skipped() {
					row.recovered = "skipped: " + skipReason(t)
				}
				record(row)
			}()
			row = f.run(t)
			row.fault = f.name
			t.Logf("client saw: %s", row.client)
			t.Logf("daemon logged: %s", row.log)
			t.Logf("recovered: %s", row.recovered)
		})
	}
	if *writeReliability != "" && !t.Failed() {
		if err := writeFaultsSection(*writeReliability, rows); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the faults table into %s", *writeReliability)
	}
}

// skipReasons keeps why a subtest skipped, for its row.
var skipReasons sync.Map // *testing.T -> string

func skipf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	skipReasons.Store(t, msg)
	t.Skip(msg)
}

func skipReason(t *testing.T) string {
	if v, ok := skipReasons.Load(t); ok {
		return v.(string)
	}
	return "skipped"
}

// faultDaemon is a daemon under a fault, with its log at hand.
type faultDaemon struct {
	cfg config.Config
	log *logtest.Lines
}

// startLogged runs a daemon as start does, keeping its log lines; wait
// says whether to wait until it is ready.
func startLogged(t *testing.T, cfg config.Config, wait bool) *faultDaemon {
	t.Helper()
	log := logtest.NewLines(t)
	startOpts(t, cfg, wait, daemon.Options{Logger: slog.New(slog.NewTextHandler(log, nil)),
		BackendEnv: []string{"PATH=" + os.Getenv("PATH")}})
	return &faultDaemon{cfg: cfg, log: log}
}

// ask asks through a new client (one connected before keeps its
// connection through a socket's removal) and returns the client's error.
func (f *faultDaemon) ask(session, query string, onToken func(string)) (*ctxd.Summary, error) {
	return client.New(f.cfg.Daemon.Socket).Ask(context.Background(), ctxd.AskRequest{Session: session, Query: query}, onToken)
}

// mustAsk asks and fails the test on an error.
func (f *faultDaemon) mustAsk(t *testing.T, session, query string) {
	t.Helper()
	if _, err := f.ask(session, query, nil); err != nil {
		t.Fatalf("ask %q: %v", query, err)
	}
}

// recovery asks until an ask succeeds and says how long after since the
// ask that succeeded began (its own answer's time is not counted); it
// fails the test if the daemon has not recovered in 3 minutes.
func (f *faultDaemon) recovery(t *testing.T, session string, since time.Time) string {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var err error
	for tries := 1; ; tries++ {
		began := time.Now()
		if _, err = f.ask(session, "Are you back?", nil); err == nil {
			return fmt.Sprintf("%.1f s (ask %d succeeded)", began.Sub(since).Seconds(), tries)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ask succeeded within 3 minutes after the fault cleared; the last: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// wantError checks that err names the problem: every one of mentions;
// and that an error answer's kind is not "internal" (a bug's).
func wantError(t *testing.T, err error, mentions ...string) string {
	t.Helper()
	if err == nil {
		t.Fatal("the ask succeeded under the fault")
	}
	var api *client.APIError
	if errors.As(err, &api) && api.Kind == ctxd.KindInternal {
		t.Errorf("the fault answered as an internal error (a bug's kind): %v", err)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("the client's error does not say %q: %v", m, err)
		}
	}
	return err.Error()
}

// faultBackendKilled: the managed `ollama serve` is killed (SIGKILL, with
// its runner) while it streams an answer. The client gets the tokens so
// far and then an error event saying the answer broke off and was not
// recorded; the supervisor restarts the server, and the next ask loads
// the model again and succeeds.
func faultBackendKilled(t *testing.T) faultRow {
	cfg := baseConfig(t, t.TempDir(), codexDir(t, 800))
	cfg.Limits.AnswerReserve = 1500 // an answer long enough to be killed in
	d := startLogged(t, cfg, true)
	d.mustAsk(t, "k", "Say anything.")
	pid := ollamaServePID(t, filepath.Join(cfg.Daemon.StateDir, "ollama", "models"))
	var (
		killed   time.Time
		killOnce sync.Once
		streamed int
	)
	_, err := d.ask("k", "Tell me a long story about the handlers.", func(string) {
		streamed++
		killOnce.Do(func() {
			killed = time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Errorf("kill ollama serve (pid %d): %v", pid, err)
			}
		})
	})
	if killed.IsZero() {
		t.Fatalf("no token streamed before the answer ended (%v)", err)
	}
	t.Logf("%d tokens streamed before the error", streamed)
	row := faultRow{client: wantError(t, err, "broke off the answer", "not recorded")}
	row.log = d.log.Wait(t, time.Minute, "ask failed", "broke off") + " / " + cutAttr(d.log.Wait(t, time.Minute, "exited unexpectedly"), " log_tail=")
	row.recovered = d.recovery(t, "k", killed) + ", counted from the kill: the supervisor restarts the server and Ollama reloads the model"
	return row
}

// ollamaServePID is the pid of the `ollama serve` whose models are in dir.
func ollamaServePID(t *testing.T, dir string) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/environ")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(env, []byte("\x00OLLAMA_MODELS="+dir+"\x00")) && !bytes.HasPrefix(env, []byte("OLLAMA_MODELS="+dir+"\x00")) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if args := strings.Split(string(cmd), "\x00"); len(args) > 1 && args[1] == "serve" {
			var pid int
			fmt.Sscan(filepath.Base(filepath.Dir(p)), &pid)
			return pid
		}
	}
	t.Fatalf("no ollama serve with models in %s", dir)
	return 0
}

// faultBackendLate: the external backend's URL answers nothing when the
// daemon starts and for a while after (a server that comes up late).
// Asks get a 503 saying the backend is not reachable at that URL; once a
// server is up there with the model, the daemon's retries find it.
func faultBackendLate(t *testing.T) faultRow {
	addr, err := ollama.LoopbackAddr("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig(t, t.TempDir(), "")
	cfg.Backend.Mode, cfg.Backend.URL = "external", "http://"+addr
	d := startLogged(t, cfg, false)
	row := faultRow{log: d.log.Wait(t, time.Minute, "backend not ready; retrying", addr)}
	_, err = d.ask("late", "hi", nil)
	row.client = wantError(t, err, "not reachable", addr)
	dir := t.TempDir()
	srv, err := ollama.Start(context.Background(), ollama.ServeConfig{
		Binary: ollamatest.Binary(t), Addr: addr, ModelsDir: filepath.Join(dir, "models"), HomeDir: filepath.Join(dir, "home"),
		LogPath: filepath.Join(dir, "ollama.log"), Env: []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if err := ollama.New(srv.URL(), "ctxd-test", ollama.Options{}).Import(context.Background(), modelPath(t, testModel())); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	row.recovered = d.recovery(t, "late", up) + ", counted from the server holding the model: the daemon retries with backoff (1 s doubling to 30 s)"
	return row
}

// faultBackendGarbage: the backend's URL starts answering something that
// is not Ollama (an HTML error page, as a misrouted proxy does) after the
// daemon came up on it. Asks fail with a 502 naming what came back; once
// it answers as Ollama again, the next ask succeeds.
func faultBackendGarbage(t *testing.T, srv *ollama.Server) faultRow {
	var garbage atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(srv.URL())
	proxy.FlushInterval = -1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if garbage.Load() {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html><body><h1>Welcome to nginx!</h1></body></html>\n"))
			return
		}
		proxy.ServeHTTP(w, r)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	cfg := baseConfig(t, t.TempDir(), "")
	cfg.Backend.Mode, cfg.Backend.URL = "external", "http://"+ln.Addr().String()
	d := startLogged(t, cfg, true)
	d.mustAsk(t, "g", "hi")
	garbage.Store(true)
	_, err = d.ask("g", "hi again", nil)
	row := faultRow{client: wantError(t, err, "Welcome to nginx")}
	row.log = d.log.Wait(t, time.Minute, "ask failed", "nginx")
	garbage.Store(false)
	row.recovered = d.recovery(t, "g", time.Now())
	return row
}

// mount runs mount(8) (or umount) and skips the test when the system
// does not let this process mount.
func mount(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err == nil {
		return
	}
	if args[0] == "mount" && (os.Geteuid() != 0 || bytes.Contains(out, []byte("permission denied")) || bytes.Contains(out, []byte("must be superuser"))) {
		skipf(t, "%s needs root: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
	t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
}

// storeFilesClosed waits until no descriptor of this process is open on
// the store's database files: the store closes them when it idles.
func storeFilesClosed(t *testing.T, stateDir string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		open := false
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, filepath.Join(stateDir, "ctxd.db")) {
				open = true
			}
		}
		if !open {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the store kept its files open for 2 minutes with nothing to do")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// faultStoreReadOnly: the state directory becomes read-only under a
// running daemon. The kernel will not remount a file system read-only
// while a file on it is open for writing (the daemon's lock file is), so
// the fault is a read-only bind mount over the directory, as an
// administrator or a sandbox would place it: what the store opens from
// then on is read-only. The store closes its files when idle, so the next
// ask meets the fault; it fails saying the store could not be opened and
// why, and once the mount is gone the next ask is recorded.
func faultStoreReadOnly(t *testing.T, external func(*testing.T, string) config.Config) faultRow {
	state := t.TempDir()
	d := startLogged(t, external(t, state), true)
	d.mustAsk(t, "ro", "hi")
	storeFilesClosed(t, state)
	mount(t, "mount", "--bind", state, state)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command("umount", "-l", state).Run()
		}
	})
	mount(t, "mount", "-o", "remount,bind,ro", state)
	_, err := d.ask("ro", "hi again", nil)
	row := faultRow{client: wantError(t, err, "session store", "read-only file system")}
	row.log = d.log.Wait(t, time.Minute, "ask failed", "read-only file system")
	if out, err := exec.Command("umount", state).CombinedOutput(); err != nil {
		t.Logf("umount %s: %v: %s; detaching it", state, err, out)
		mount(t, "umount", "-l", state)
	}
	mounted = false
	row.recovered = d.recovery(t, "ro", time.Now())
	return row
}

// faultDiskFull: the file system under the store fills up (a small tmpfs
// as the state directory, filled by another file). Asks fail saying the
// store could not record the answer because its disk is full; once the
// other file is gone the next ask is recorded, on the same daemon.
func faultDiskFull(t *testing.T, external func(*testing.T, string) config.Config) faultRow {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	mount(t, "mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", state)
	t.Cleanup(func() { exec.Command("umount", "-l", state).Run() })
	d := startLogged(t, external(t, state), true)
	d.mustAsk(t, "full", "hi")
	storeFilesClosed(t, state) // the disk fills while ctxd idles: its write-ahead log is gone
	filler := filepath.Join(state, "filler")
	fill(t, filler)
	_, err := d.ask("full", "hi again", nil)
	row := faultRow{client: wantError(t, err, "session store", "disk holding it is full")}
	row.log = d.log.Wait(t, time.Minute, "ask failed", "disk holding it is full")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	row.recovered = d.recovery(t, "full", time.Now())
	return row
}

// fill writes path until the disk is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// faultSocketRemoved: the socket's directory is removed while the daemon
// serves (a tmp cleaner, an `rm -r`). New clients are told no daemon
// listens there; the daemon notices, logs it, makes the directory and the
// socket again, and the next ask succeeds.
func faultSocketRemoved(t *testing.T, external func(*testing.T, string) config.Config) faultRow {
	cfg := external(t, t.TempDir())
	cfg.Daemon.Socket = filepath.Join(daemontest.ShortDir(t), "run", "ctxd.sock")
	d := startLogged(t, cfg, true)
	d.mustAsk(t, "sock", "hi")
	removed := time.Now()
	if err := os.RemoveAll(filepath.Dir(cfg.Daemon.Socket)); err != nil {
		t.Fatal(err)
	}
	_, err := d.ask("sock", "hi again", nil)
	row := faultRow{client: wantError(t, err, "cannot reach the daemon at "+cfg.Daemon.Socket, "no such file or directory")}
	row.log = d.log.Wait(t, time.Minute, "socket lost", "was removed")
	row.recovered = d.recovery(t, "sock", removed) + ", counted from the removal: the daemon checks its socket every second and re-creates it"
	row.log += " / " + d.log.Wait(t, time.Minute, "socket re-created")
	return row
}

// cutAttr drops a log line's attribute that starts with key (" key="),
// and the ones after it.
func cutAttr(line, key string) string {
	before, _, _ := strings.Cut(line, key)
	return before
}

// writeFaultsSection rewrites the faults section of the file at path.
func writeFaultsSection(path string, rows []faultRow) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nWritten by `%s` (the store faults mount a tmpfs and a bind mount: they need root, and skip without it). "+
		"Each fault is injected into a real daemon on the real Ollama and the real SQLite store; the daemon stays up through all of them and is never restarted. "+
		"\"Recovered after\" is the time from the fault clearing to the first ask that succeeded again.\n\n", faultsCommand)
	b.WriteString("| Fault | What the client saw | What the daemon logged | Recovered after |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", cell(r.fault), cell(r.client), cell(r.log), cell(r.recovered))
	}
	doc, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("faults table: %w", err)
	}
	open, end := "<!-- reliability:faults -->", "<!-- /reliability:faults -->"
	i, j := bytes.Index(doc, []byte(open)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("faults table: %s has no section between %s and %s", path, open, end)
	}
	out := append(append(append([]byte{}, doc[:i+len(open)]...), b.String()...), doc[j:]...)
	return os.WriteFile(path, out, 0o644)
}

// cell makes s one Markdown table cell: one line, pipes escaped, and at
// most 600 characters.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}
