package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd/internal/logtest"
	"github.com/ctxd/ctxd/sockowner"
)

// serveEnv makes the test binary a helper server: it listens on the
// address in its value (failing, as a real server does, when the port is
// taken) and answers every request with "child". With childEnv set too, it
// first starts a child of its own (sleep) in its process group, like
// Ollama's runners, and writes the child's pid to that file.
const (
	serveEnv = "SUPERVISE_TEST_SERVE"
	childEnv = "SUPERVISE_TEST_CHILD_PID_FILE"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(serveEnv); addr != "" {
		os.Exit(serveHelper(addr, os.Getenv(childEnv)))
	}
	os.Exit(m.Run())
}

func serveHelper(addr, pidFile string) int {
	if pidFile != "" {
		child := exec.Command("sleep", "3600")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(child.Process.Pid)), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	http.Serve(ln, answer("child"))
	return 0
}

func answer(s string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, s) })
}

// helper is a command that runs the helper server on addr.
func helper(addr string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, serveEnv+"="+addr)...)
	return cmd
}

// freeAddr is a loopback address whose port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// get asks the server at addr through client; it returns the answer.
func get(ctx context.Context, client *http.Client, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s", resp.Status)
	}
	return string(b), err
}

// ready is a readiness check like the adapters' (HEAD / or GET /health):
// whatever answers on addr passes it.
func ready(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := get(ctx, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, addr)
		return err
	}
}

// impostor listens on addr in this test process, which is not in the
// supervised child's process group, and answers "impostor".
func impostor(t *testing.T, addr string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the impostor cannot bind %s: %v", addr, err)
	}
	srv := &http.Server{Handler: answer("impostor")}
	go srv.Serve(ln)
	var once sync.Once
	stop = func() { once.Do(func() { srv.Close() }) }
	t.Cleanup(stop)
	return stop
}

// TestStartOnATakenPortNamesTheHolder: another process took the port
// before the server could bind it (the free-port pick races). Whether the
// impostor answers the readiness check first ("impostor answers"), or the
// server exits on its failed bind first ("server exits"), Start fails
// naming the port and who holds it, not only that the server exited.
func TestStartOnATakenPortNamesTheHolder(t *testing.T) {
	for name, readyFor := range map[string]func(addr string) func(context.Context) error{
		"impostor answers": ready,
		"server exits": func(string) func(context.Context) error { // only the exit can end the start
			return func(context.Context) error { return errors.New("not yet") }
		},
	} {
		t.Run(name, func(t *testing.T) {
			addr := freeAddr(t)
			impostor(t, addr)
			p, err := Start(t.Context(), Config{
				Name:    "helper",
				Command: func() *exec.Cmd { return helper(addr) },
				LogPath: filepath.Join(t.TempDir(), "log"),
				Ready:   readyFor(addr),
				Network: "tcp", Addr: addr,
			})
			if err == nil {
				p.Close()
				t.Fatalf("Start accepted the process listening on %s, which it did not start", addr)
			}
			t.Log(err)
			for _, want := range []string{addr, "held by another process", "pid " + strconv.Itoa(os.Getpid())} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q", want)
				}
			}
		})
	}
}

// TestRestartRefusesAnImpostor: the server crashes, another process binds
// its port before the restart, and answers the readiness check. The
// supervisor must not take it for the restarted server, and the client's
// dialer must not reach it; once the port is free again, the restart
// succeeds.
func TestRestartRefusesAnImpostor(t *testing.T) {
	addr := freeAddr(t)
	var (
		mu     sync.Mutex
		starts int
	)
	impostorUp := make(chan struct{})
	restarted := make(chan struct{}, 10)
	log := logtest.New()
	p, err := Start(t.Context(), Config{
		Name: "helper",
		Command: func() *exec.Cmd {
			mu.Lock()
			starts++
			n := starts
			mu.Unlock()
			if n == 2 {
				<-impostorUp // the first restart comes once the impostor listens
			}
			return helper(addr)
		},
		LogPath: filepath.Join(t.TempDir(), "log"),
		Ready:   ready(addr),
		Network: "tcp", Addr: addr,
		OnRestart: func() { restarted <- struct{}{} },
		Backoff:   10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Logger: slog.New(log),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	p.mu.Lock()
	pid, gone := p.cmd.Process.Pid, p.gone
	p.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-gone
	stop := impostor(t, addr)
	close(impostorUp)

	deadline := time.After(60 * time.Second)
	for refused := false; !refused; {
		select {
		case <-restarted:
			t.Fatalf("the supervisor took the process listening on %s for the restarted server", addr)
		case <-log.Seen():
			_, refused = log.Find("held by another process")
		case <-deadline:
			t.Fatalf("no restart refused within 60s; log: %q", log.Messages())
		}
	}
	msg, _ := log.Find("held by another process")
	t.Log(msg)
	if p.Restarts() != 0 {
		t.Errorf("restarts %d with the impostor on the port", p.Restarts())
	}
	client := &http.Client{Transport: &http.Transport{DialContext: p.DialContext}}
	if got, err := get(t.Context(), client, addr); err == nil {
		t.Errorf("the supervisor's dialer reached %q", got)
	} else {
		t.Logf("the supervisor's dialer: %v", err)
	}

	stop()
	select {
	case <-restarted:
	case <-deadline:
		t.Fatalf("not restarted once the port was free; log: %q", log.Messages())
	}
	client.CloseIdleConnections()
	if got, err := get(t.Context(), client, addr); err != nil || got != "child" {
		t.Errorf("after the restart: %q, %v; want the child's answer", got, err)
	}
}

// TestCrashKillsTheGroup: what the server started (Ollama's runners,
// which hold the model in memory) dies with it when it crashes, before
// the restart.
func TestCrashKillsTheGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	p, restarted := startHelper(t, childEnv+"="+pidFile)
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	runner, _ := strconv.Atoi(string(b))
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("not restarted within 60s")
	}
	// SIGKILL was sent before the restart; its delivery is the kernel's.
	for start := time.Now(); alive(runner); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*time.Second {
			syscall.Kill(runner, syscall.SIGKILL)
			t.Fatalf("the crashed server's child %d outlived it", runner)
		}
	}
}

// startHelper starts the helper server (with env) supervised on a free
// port, restarting after 10 ms; restarted hears each restart. The test's
// end closes it.
func startHelper(t *testing.T, env ...string) (p *Process, restarted chan struct{}) {
	t.Helper()
	addr := freeAddr(t)
	restarted = make(chan struct{}, 10)
	p, err := Start(t.Context(), Config{
		Name:    "helper",
		Command: func() *exec.Cmd { return helper(addr, env...) },
		LogPath: filepath.Join(t.TempDir(), "log"),
		Ready:   ready(addr),
		Network: "tcp", Addr: addr,
		OnRestart: func() { restarted <- struct{}{} },
		Backoff:   10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, restarted
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	s := string(b)
	return !strings.HasPrefix(strings.TrimSpace(s[strings.LastIndexByte(s, ')')+1:]), "Z")
}

// TestOwnershipCheckedOncePerConnection: the ownership check (milliseconds
// of /proc reading) is made when DialContext makes a connection, and not
// again for the requests a pooling client sends over it; a new connection
// gets its own.
func TestOwnershipCheckedOncePerConnection(t *testing.T) {
	addr := freeAddr(t)
	p, err := Start(t.Context(), Config{
		Name:    "helper",
		Command: func() *exec.Cmd { return helper(addr) },
		LogPath: filepath.Join(t.TempDir(), "log"),
		Ready:   ready(addr),
		Network: "tcp", Addr: addr,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var checks, dials atomic.Int64
	check := p.checkConn
	p.checkConn = func(o sockowner.Owner, c net.Conn) error {
		checks.Add(1)
		return check(o, c)
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		return p.DialContext(ctx, network, address)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for i := range 10 {
		if got, err := get(t.Context(), client, addr); err != nil || got != "child" {
			t.Fatalf("request %d: %q, %v", i, got, err)
		}
	}
	if c, d := checks.Load(), dials.Load(); c != 1 || d != 1 {
		t.Errorf("10 requests in turn: %d checks, %d dials; want 1 of each", c, d)
	}
	tr.CloseIdleConnections()
	if got, err := get(t.Context(), client, addr); err != nil || got != "child" {
		t.Fatalf("on a new connection: %q, %v", got, err)
	}
	if c, d := checks.Load(), dials.Load(); c != 2 || d != 2 {
		t.Errorf("a second connection: %d checks, %d dials in all; want 2 of each", c, d)
	}
}

// TestPauseAndResume: a paused server is stopped and not restarted (its
// exit is no crash); Resume starts it again, and after that a crash is
// restarted as before.
func TestPauseAndResume(t *testing.T) {
	p, restarted := startHelper(t)
	addr := p.cfg.Addr
	first := p.PID()
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if !p.Paused() || alive(first) {
		t.Fatalf("after Pause: paused %v, process %d alive %v", p.Paused(), first, alive(first))
	}
	if err := p.Pause(); err != nil { // twice is once
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // ten backoffs: a supervisor that took the exit for a crash would have restarted it
	if len(restarted) > 0 || ready(addr)(t.Context()) == nil {
		t.Fatal("a paused server was restarted")
	}
	if _, err := p.DialContext(t.Context(), "tcp", addr); err == nil {
		t.Fatal("DialContext reached a paused server")
	}
	if err := p.Resume(t.Context()); err != nil {
		t.Fatal(err)
	}
	if p.Paused() || p.PID() == first || ready(addr)(t.Context()) != nil {
		t.Fatalf("after Resume: paused %v, pid %d (was %d)", p.Paused(), p.PID(), first)
	}
	if len(restarted) > 0 {
		t.Fatal("Resume was reported as a crash restart")
	}
	if err := syscall.Kill(p.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("a crash after Resume was not restarted")
	}
	if p.Restarts() != 1 {
		t.Fatalf("restarts %d, want 1", p.Restarts())
	}
}
