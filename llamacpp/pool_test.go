package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/ctxd/ctxd"
)

// streamServer answers /completion as llama-server does: events, the
// final one with stop set, then the end of the stream (the chunked
// encoding's last chunk) in a write of its own. It sends that end only
// once the client has taken the final event's content ("!"), so it can
// never arrive in the same read as the final event: a client that stops
// reading at the final event never sees it. Other paths answer small JSON
// bodies (llama-server sends {"status":"ok"} for /health). It counts the
// connections clients make to it.
func streamServer(t *testing.T) (srv *httptest.Server, conns *atomic.Int64, tookLast chan struct{}) {
	t.Helper()
	conns = new(atomic.Int64)
	tookLast = make(chan struct{}, 1)
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/completion":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"content\":\"hello\",\"stop\":false}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: {\"content\":\"!\",\"stop\":true,\"stop_type\":\"eos\",\"timings\":{\"cache_n\":3,\"prompt_n\":1}}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-tookLast:
			case <-r.Context().Done():
			}
		case "/props":
			fmt.Fprint(w, `{"total_slots":1,"default_generation_settings":{"n_ctx":512}}`)
		default:
			fmt.Fprint(w, `{"status":"ok"}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, conns, tookLast
}

// TestConnectionsAreReused: one client's requests, one after another, all
// go over one connection: streamed completions (read to their end after
// the final event) and answers the client reads partly or not at all
// (/health, erase). A client that makes a connection per request again
// (through a managed server's dialer, a dial and an ownership check each)
// fails it. (The real llama-server closes a connection after a streamed
// completion; this server does not, so the test sees the client's side.)
func TestConnectionsAreReused(t *testing.T) {
	t.Parallel()
	srv, conns, tookLast := streamServer(t)
	var dials atomic.Int64
	c, err := New(srv.URL, Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.Props(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		gen, err := c.Generate(ctx, ctxd.GenerateRequest{Tokens: []int{1, 2, 3}}, func(s string) error {
			if s == "!" {
				tookLast <- struct{}{}
			}
			return nil
		})
		if err != nil || gen.Text != "hello!" || gen.DoneReason != ctxd.DoneStop || gen.BackendCached != 3 {
			t.Fatalf("generation %d: %+v, %v", i, gen, err)
		}
		if err := c.Health(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.EraseSlot(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if n, d := conns.Load(), dials.Load(); n != 1 || d != 1 {
		t.Errorf("16 requests in turn made %d connections (%d dials), want 1: a connection is not going back to the pool", n, d)
	}
}

// TestStoppedGenerationClosesItsConnection: a generation ctxd stops (its
// caller's onToken fails, as when the agent hangs up) closes its
// connection rather than waiting for the rest of the stream, which is
// what tells llama-server to stop generating; the next request makes a
// new one.
func TestStoppedGenerationClosesItsConnection(t *testing.T) {
	t.Parallel()
	srv, conns, _ := streamServer(t)
	c, err := New(srv.URL, Options{})
	if err != nil {
		t.Fatal(err)
	}
	hangUp := errors.New("the agent hung up")
	_, err = c.Generate(t.Context(), ctxd.GenerateRequest{Tokens: []int{1}}, func(string) error { return hangUp })
	if !errors.Is(err, hangUp) {
		t.Fatalf("Generate: %v, want the onToken error", err)
	}
	// The server's handler waits for a final event the client never took:
	// only the closed connection ends it.
	if err := c.Health(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the stopped generation's connection was kept", n)
	}
}
