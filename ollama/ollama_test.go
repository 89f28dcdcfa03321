package ollama_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
)

func TestRealServer(t *testing.T) {
	srv := ollamatest.Start(t)
	cfg := modelgen.DefaultConfig()
	c := ollamatest.Client(t, srv, "tiny", cfg, ollama.LoadOptions{NumCtx: 2048, NumBatch: 512})
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
	res, err := c.Generate(ctx, "### USER\nhello there\n### ASSISTANT\n", ollama.Sampling{MaxTokens: 8}, func(s string) error {
		pieces = append(pieces, s)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Metrics.PromptEvalCount == 0 || res.Metrics.EvalCount == 0 || res.TTFT <= 0 {
		t.Errorf("result lacks metrics: %+v", res)
	}
	if strings.Join(pieces, "") != res.Text {
		t.Errorf("streamed pieces %q do not make the text %q", pieces, res.Text)
	}
	if res.Metrics.EvalCount > 8 {
		t.Errorf("eval count %d exceeds num_predict 8", res.Metrics.EvalCount)
	}

	missing := ollama.New(srv.URL(), "no-such-model", ollama.LoadOptions{})
	if _, err := missing.Generate(ctx, "x", ollama.Sampling{MaxTokens: 1}, nil); !errors.Is(err, ollama.ErrModelNotFound) {
		t.Errorf("missing model: %v, want ErrModelNotFound", err)
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
	c := ollama.New(srv.URL(), "m", ollama.LoadOptions{})
	if err := c.Ping(context.Background()); err != nil {
		t.Errorf("restarted server does not answer on the same URL: %v", err)
	}
}

func TestServerDown(t *testing.T) {
	c := ollama.New(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, "m", ollama.LoadOptions{})
	if err := c.Ping(context.Background()); !errors.Is(err, ollama.ErrUnavailable) {
		t.Errorf("ping to a closed port: %v, want ErrUnavailable", err)
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
	res, err := ollama.New(u, "m", ollama.LoadOptions{}).Generate(context.Background(), "p", ollama.Sampling{MaxTokens: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.DoneReason != ollama.DoneIncomplete || res.Text != " again again again" || res.TTFT <= 0 {
		t.Errorf("got done reason %q, text %q, ttft %v; want %q and the streamed text", res.DoneReason, res.Text, res.TTFT, ollama.DoneIncomplete)
	}
}
