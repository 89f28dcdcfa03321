package ollama_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
)

func TestRealServer(t *testing.T) {
	srv := ollamatest.Start(t)
	cfg := modelgen.DefaultConfig()
	c := ollamatest.Client(t, srv, "tiny", cfg, ollama.Options{NumCtx: 2048, NumBatch: 512})
	ctx := context.Background()

	facts, err := c.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if facts.Architecture != "llama" || facts.ContextLength != cfg.ContextLength || facts.GGUFPath == "" {
		t.Fatalf("facts %+v", facts)
	}
	if err := c.Load(ctx); err != nil {
		t.Fatal(err)
	}
	var pieces []string
	res, err := c.Generate(ctx, ctxd.GenerateRequest{Prompt: "### USER\nhello there\n### ASSISTANT\n", MaxTokens: 8}, func(s string) error {
		pieces = append(pieces, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.PromptEvalCount == 0 || res.EvalCount == 0 || res.TTFT <= 0 {
		t.Errorf("result lacks metrics: %+v", res)
	}
	if strings.Join(pieces, "") != res.Text {
		t.Errorf("streamed pieces %q do not make the text %q", pieces, res.Text)
	}
	if res.EvalCount > 8 {
		t.Errorf("eval count %d exceeds num_predict 8", res.EvalCount)
	}

	missing := ollama.New(srv.URL(), "no-such-model", ollama.Options{})
	if _, err := missing.Generate(ctx, ctxd.GenerateRequest{Prompt: "x", MaxTokens: 1}, nil); !errors.Is(err, ollama.ErrModelNotFound) || ctxd.KindOf(err) != ctxd.KindBackend {
		t.Errorf("missing model: %v (kind %q), want ErrModelNotFound of kind backend", err, ctxd.KindOf(err))
	}
}

func TestSupervisorRestartsACrashedServer(t *testing.T) {
	bin := ollamatest.Binary(t)
	dir := t.TempDir()
	restarted := make(chan struct{}, 1)
	srv, err := ollama.Start(context.Background(), ollama.ServeConfig{
		Binary: bin, Addr: "127.0.0.1:0",
		ModelsDir: dir + "/models", HomeDir: dir + "/home", LogPath: dir + "/ollama.log",
		OnRestart: func() { restarted <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	old := srv.PID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("server not restarted within 60s")
	}
	if srv.Restarts() != 1 || srv.PID() == old {
		t.Errorf("restarts %d, pid %d (was %d)", srv.Restarts(), srv.PID(), old)
	}
	c := ollama.New(srv.URL(), "m", ollama.Options{})
	if err := c.Ping(context.Background()); err != nil {
		t.Errorf("restarted server does not answer on the same URL: %v", err)
	}
}

// TestCrashKillsRunners: when `ollama serve` crashes, the runner it
// started (which holds the model in memory) dies with it, before the
// restart; and the managed client reaches the restarted server through the
// supervisor's checked dialer.
func TestCrashKillsRunners(t *testing.T) {
	bin := ollamatest.Binary(t)
	dir := t.TempDir()
	restarted := make(chan struct{}, 1)
	srv, err := ollama.Start(context.Background(), ollama.ServeConfig{
		Binary: bin, Addr: "127.0.0.1:0", Backoff: 10 * time.Millisecond,
		ModelsDir: dir + "/models", HomeDir: dir + "/home", LogPath: dir + "/ollama.log",
		OnRestart: func() { restarted <- struct{}{} },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := ollamatest.Client(t, srv, "tiny", modelgen.DefaultConfig(), ollama.Options{NumCtx: 512, Dial: srv.DialContext})
	if err := c.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	serve := srv.PID()
	runners := groupMembers(t, serve)
	if len(runners) == 0 {
		t.Fatalf("no runner in ollama serve's process group %d after a load", serve)
	}
	if err := syscall.Kill(serve, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-restarted:
	case <-time.After(60 * time.Second):
		t.Fatal("server not restarted within 60s")
	}
	// SIGKILL was sent before the restart; the kernel finishes the job.
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		left := slices.DeleteFunc(slices.Clone(runners), func(pid int) bool { return !alive(pid) })
		if len(left) == 0 {
			break
		}
		if time.Since(start) > 10*time.Second {
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("runners %v outlived the crashed ollama serve %d", left, serve)
		}
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Errorf("the restarted server, through the checked dialer: %v", err)
	}
}

// groupMembers are the processes of process group pgid other than its
// leader.
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pgid {
			continue
		}
		if f := statFields(pid); len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

// statFields are the fields of /proc/PID/stat after the command.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	f := statFields(pid)
	return len(f) > 0 && f[0] != "Z"
}

// TestCloseDuringRestartBackoff: a server that crashed is restarted after
// a backoff; Close must not wait it out.
func TestCloseDuringRestartBackoff(t *testing.T) {
	bin := ollamatest.Binary(t)
	dir := t.TempDir()
	crashed := make(chan struct{})
	var once sync.Once
	log := slog.New(handlerFunc(func(r slog.Record) {
		if strings.Contains(r.Message, "restarting") {
			once.Do(func() { close(crashed) })
		}
	}))
	srv, err := ollama.Start(context.Background(), ollama.ServeConfig{
		Binary: bin, Addr: "127.0.0.1:0", Backoff: time.Hour, Logger: log,
		ModelsDir: dir + "/models", HomeDir: dir + "/home", LogPath: dir + "/ollama.log",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-crashed // the supervisor now waits an hour before restarting
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited on the restart backoff")
	}
	if srv.Restarts() != 0 {
		t.Errorf("restarted %d times during Close", srv.Restarts())
	}
}

// handlerFunc is a slog handler that hands every record to a function.
type handlerFunc func(slog.Record)

func (h handlerFunc) Enabled(context.Context, slog.Level) bool      { return true }
func (h handlerFunc) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h handlerFunc) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h handlerFunc) WithGroup(string) slog.Handler                 { return h }

func TestServerDown(t *testing.T) {
	c := ollama.New(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, "m", ollama.Options{})
	if err := c.Ping(context.Background()); !errors.Is(err, ollama.ErrUnavailable) || ctxd.KindOf(err) != ctxd.KindUnavailable {
		t.Errorf("ping to a closed port: %v, want ErrUnavailable of kind unavailable", err)
	}
}

func TestStartRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	_, err := ollama.Start(context.Background(), ollama.ServeConfig{Binary: dir + "/nope", Addr: "127.0.0.1:0", ModelsDir: dir, HomeDir: dir, LogPath: dir + "/log"})
	if err == nil || !strings.Contains(err.Error(), "make ollama") {
		t.Errorf("missing binary: %v", err)
	}
	bin := ollamatest.Binary(t)
	_, err = ollama.Start(context.Background(), ollama.ServeConfig{Binary: bin, Addr: "0.0.0.0:0", ModelsDir: dir, HomeDir: dir, LogPath: dir + "/log"})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("non-loopback addr: %v", err)
	}
}

// TestStreamWithoutFinalMessageIsIncomplete replays what Ollama v0.6.5
// sends when it aborts a generation at its token repeat limit: content
// lines, then the end of the body with no "done" line.
func TestStreamWithoutFinalMessageIsIncomplete(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for range 3 {
			fmt.Fprintln(w, `{"model":"m","response":" again","done":false}`)
		}
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	res, err := ollama.New(u, "m", ollama.Options{}).Generate(context.Background(), ctxd.GenerateRequest{Prompt: "p", MaxTokens: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.DoneReason != ctxd.DoneIncomplete || res.Text != " again again again" || res.TTFT <= 0 {
		t.Errorf("got done reason %q, text %q, ttft %v; want %q and the streamed text", res.DoneReason, res.Text, res.TTFT, ctxd.DoneIncomplete)
	}
}

// TestBrokenOrCancelledStreamIsAnError: a stream that breaks (the server
// dies mid-answer) or whose request is cancelled is an error, never an
// incomplete answer to record.
func TestBrokenOrCancelledStreamIsAnError(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"model":"m","response":"partial","done":false}`)
		w.(http.Flusher).Flush()
		select { // hold the stream open until the client cancels
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	u, _ := url.Parse(srv.URL)
	c := ollama.New(u, "m", ollama.Options{})

	ctx, cancel := context.WithCancel(context.Background())
	res, err := c.Generate(ctx, ctxd.GenerateRequest{Prompt: "p"}, func(string) error { cancel(); return nil })
	if !errors.Is(err, context.Canceled) || res.Text != "partial" {
		t.Errorf("cancelled stream: %q, %v; want the partial text and context.Canceled", res.Text, err)
	}

	empty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable) // an error status with no body
	}))
	defer empty.Close()
	eu, _ := url.Parse(empty.URL)
	res, err = ollama.New(eu, "m", ollama.Options{}).Generate(context.Background(), ctxd.GenerateRequest{Prompt: "p"}, nil)
	if err == nil || !strings.Contains(err.Error(), "503") || ctxd.KindOf(err) != ctxd.KindBackend {
		t.Errorf("503 without a body: done %q, err %v (kind %q); want a backend error", res.DoneReason, err, ctxd.KindOf(err))
	}

	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		line := `{"model":"m","response":"partial","done":false}` + "\n"
		fmt.Fprintf(buf, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(line), line)
		buf.Flush()
		conn.Close() // no final chunk: the connection drops mid-stream
	}))
	defer broken.Close()
	bu, _ := url.Parse(broken.URL)
	res, err = ollama.New(bu, "m", ollama.Options{}).Generate(context.Background(), ctxd.GenerateRequest{Prompt: "p"}, nil)
	if err == nil || res.DoneReason == ctxd.DoneIncomplete {
		t.Errorf("broken stream: done %q, err %v; want an error", res.DoneReason, err)
	}
}

// TestOptionsAreSentAsConfigured: the load options go out on every request
// unchanged, and keep_alive is forever unless set (0 unloads after each
// request, as configured).
func TestOptionsAreSentAsConfigured(t *testing.T) {
	bodies := make(chan map[string]any, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		bodies <- body
		fmt.Fprintln(w, `{"model":"m","response":"ok","done":true,"done_reason":"stop"}`)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	zero := time.Duration(0)
	for _, c := range []struct {
		keepAlive *time.Duration
		want      string // keep_alive as sent: -1 is forever
	}{
		{nil, "-1"},
		{&zero, `"0s"`},
	} {
		cl := ollama.New(u, "m", ollama.Options{NumCtx: 4096, NumBatch: 256, KeepAlive: c.keepAlive, Temperature: 0.5})
		if _, err := cl.Generate(context.Background(), ctxd.GenerateRequest{Prompt: "p", MaxTokens: 9, NumKeep: 3}, nil); err != nil {
			t.Fatal(err)
		}
		body := <-bodies
		opts, _ := body["options"].(map[string]any)
		if opts["num_ctx"] != 4096.0 || opts["num_batch"] != 256.0 || opts["num_predict"] != 9.0 || opts["num_keep"] != 3.0 || opts["temperature"] != 0.5 || body["raw"] != true {
			t.Errorf("options sent: %v", body)
		}
		if raw, _ := json.Marshal(body["keep_alive"]); string(raw) != c.want {
			t.Errorf("keep_alive %s sent for %v, want %s", raw, c.keepAlive, c.want)
		}
	}
}
