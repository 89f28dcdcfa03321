package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/logtest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/otheruid"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/sockowner"
)

// impostorEnv makes the test binary the impostor of TestImpostorHelper:
// its value is the address whose port it takes.
const impostorEnv = "CTXD_TEST_IMPOSTOR"

// impostorUID is the other user the impostor runs as.
const impostorUID = otheruid.UID

// TestManagedBackendHijackRefused: another local user waits for the
// managed server's port; the server crashes, the other user's process
// binds the port first and answers the readiness check. The supervisor
// must not take it for the restarted server, and the client must send it
// nothing (no prompt, no API key); once the port is free again, the
// restart succeeds and the client talks to the new server.
//
// It needs root, to run the impostor as another user with setpriv.
func TestManagedBackendHijackRefused(t *testing.T) {
	needOllama(t)
	otheruid.Skip(t)
	exe := otheruid.Binary(t)
	for _, kind := range []string{"ollama", "llamacpp"} {
		t.Run(kind, func(t *testing.T) {
			if kind == "llamacpp" {
				needLlamaServer(t)
			}
			log := logtest.New()
			restarted := make(chan struct{}, 10)
			srv := startManaged(t, kind, log, func() { restarted <- struct{}{} })

			imp := startImpostor(t, exe, srv.addr)
			if err := syscall.Kill(srv.pid(), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			select {
			case <-imp.bound:
			case <-restarted:
				t.Skip("the restart bound the port before the impostor: nothing to refuse this time")
			case <-time.After(60 * time.Second):
				t.Fatal("the impostor did not bind the port within 60s")
			}
			deadline := time.After(2 * time.Minute)
			for {
				if msg, ok := log.Find("held by another process"); ok {
					t.Log(msg)
					if want := fmt.Sprintf("pid %d of uid %d", imp.cmd.Process.Pid, impostorUID); !strings.Contains(msg, want) {
						t.Errorf("the refusal does not name the impostor (%q)", want)
					}
					break
				}
				select {
				case <-restarted:
					t.Fatalf("the supervisor took the impostor (uid %d) on %s for the restarted server", impostorUID, srv.addr)
				case <-deadline:
					t.Fatalf("no refusal logged within 2 minutes")
				case <-time.After(20 * time.Millisecond):
				}
			}
			if n := srv.restarts(); n != 0 {
				t.Errorf("%d restarts with the impostor on the port", n)
			}
			if err := srv.ask(t.Context()); err == nil {
				t.Error("the client's request succeeded with the impostor on the port")
			} else {
				t.Logf("the client's request: %v", err)
				if ctxd.KindOf(err) != ctxd.KindUnavailable {
					t.Errorf("kind %q, want %q", ctxd.KindOf(err), ctxd.KindUnavailable)
				}
			}

			// What the supervisor's dialer checks on each connection: the
			// server end of a connection to the impostor is another user's.
			conn, err := net.Dial("tcp", srv.addr)
			if err != nil {
				t.Fatal(err)
			}
			err = sockowner.Owner{PGID: syscall.Getpgrp(), UID: os.Geteuid()}.CheckConn(conn)
			conn.Close()
			if !errors.Is(err, sockowner.ErrNotOwned) || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", impostorUID)) {
				t.Errorf("a connection to the impostor: %v, want it refused naming uid %d", err, impostorUID)
			} else {
				t.Logf("a connection to the impostor: %v", err)
			}

			imp.stop()
			select {
			case <-restarted:
			case <-deadline:
				t.Fatal("not restarted within 2 minutes once the port was free")
			}
			if err := srv.ask(t.Context()); err != nil {
				t.Errorf("the restarted server: %v", err)
			}
			for _, r := range imp.requests() {
				if r.auth || (r.path != "/" && r.path != "/health") {
					t.Errorf("the impostor received %s %s (authorization header: %v); only the readiness check may reach it", r.method, r.path, r.auth)
				}
			}
		})
	}
}

// managed is a supervised server under test, of either kind.
type managed struct {
	addr     string // host:port
	pid      func() int
	restarts func() int
	ask      func(context.Context) error // a request through ctxd's managed client
}

func startManaged(t *testing.T, kind string, log *logtest.Recorder, onRestart func()) managed {
	t.Helper()
	dir := t.TempDir()
	env := []string{"PATH=" + os.Getenv("PATH")}
	logger := slog.New(log)
	switch kind {
	case "ollama":
		srv, err := ollama.Start(t.Context(), ollama.ServeConfig{
			Binary: ollamatest.Binary(t), Addr: "127.0.0.1:0", Env: env, Logger: logger, OnRestart: onRestart,
			ModelsDir: filepath.Join(dir, "models"), HomeDir: filepath.Join(dir, "home"), LogPath: filepath.Join(dir, "ollama.log"),
			Backoff: 300 * time.Millisecond, MaxBackoff: time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		c := ollama.New(srv.URL(), "no-model", ollama.Options{Dial: srv.DialContext})
		return managed{addr: srv.URL().Host, pid: srv.PID, restarts: srv.Restarts, ask: func(ctx context.Context) error {
			_, err := c.Generate(ctx, ctxd.GenerateRequest{Prompt: "SECRET PROMPT", MaxTokens: 1}, nil)
			if err != nil && ctxd.KindOf(err) == ctxd.KindBackend {
				return nil // the server answered: the model is not there
			}
			return err
		}}
	default:
		srv, err := llamacpp.Start(t.Context(), llamacpp.ServeConfig{
			Binary: llamaservertest.Binary(t), Addr: "127.0.0.1:0", Model: modelPath(t, testModel()),
			CtxPerSlot: 512, Slots: 1, SlotSavePath: filepath.Join(dir, "slots"),
			LogPath: filepath.Join(dir, "llama-server.log"), Env: env, Logger: logger, OnRestart: onRestart,
		}, llamacpp.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Process.Close() })
		u, err := url.Parse(srv.Client.Addr())
		if err != nil {
			t.Fatal(err)
		}
		return managed{addr: u.Host, pid: srv.PID, restarts: srv.Restarts, ask: func(ctx context.Context) error {
			_, err := srv.Client.Props(ctx) // sends the API key
			return err
		}}
	}
}

// impostor is the other user's process.
type impostor struct {
	cmd   *exec.Cmd
	bound chan struct{} // closed once it holds the port
	stop  func()

	mu   sync.Mutex
	seen []impostorRequest
}

type impostorRequest struct {
	method, path string
	auth         bool // it carried an Authorization header
}

func (i *impostor) requests() []impostorRequest {
	i.mu.Lock()
	defer i.mu.Unlock()
	return append([]impostorRequest(nil), i.seen...)
}

// startImpostor runs the impostor as the other user: it tries to bind
// addr's port until it can (the server holds it until it crashes).
func startImpostor(t *testing.T, exe, addr string) *impostor {
	t.Helper()
	cmd := otheruid.Command(exe, "TestImpostorHelper")
	cmd.Env = []string{impostorEnv + "=" + addr}
	cmd.Stderr = testWriter{t}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	imp := &impostor{cmd: cmd, bound: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 1 && f[0] == "bound":
				close(imp.bound)
			case len(f) == 4 && f[0] == "request":
				imp.mu.Lock()
				imp.seen = append(imp.seen, impostorRequest{method: f[1], path: f[2], auth: f[3] == "auth"})
				imp.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	imp.stop = func() {
		once.Do(func() {
			stdin.Close() // it exits when its stdin closes
			<-done
			cmd.Wait()
		})
	}
	t.Cleanup(imp.stop)
	return imp
}

// TestImpostorHelper is the impostor when the test binary runs with
// impostorEnv set (as another user); otherwise it does nothing.
func TestImpostorHelper(t *testing.T) {
	addr := os.Getenv(impostorEnv)
	if addr == "" {
		return
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	var ln net.Listener
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var err error
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "impostor: %s did not come free within 2m: %v\n", addr, err)
			os.Exit(1)
		}
		time.Sleep(time.Millisecond)
	}
	var mu sync.Mutex
	fmt.Println("bound")
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := "noauth"
		if r.Header.Get("Authorization") != "" {
			auth = "auth"
		}
		mu.Lock()
		fmt.Println("request", r.Method, r.URL.Path, auth)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok","version":"impostor"}`)
	}))
}
