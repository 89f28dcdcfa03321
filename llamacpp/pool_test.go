package llamacpp

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/modelgen"
)

// TestConnectionsAreReused: one client's requests, one after another, share
// their connections: answers it reads in part or not at all (/health,
// erase) go back to the pool like the rest. A streamed completion asks for
// its connection to be closed (llama-server closes it anyway, unannounced,
// and a pooled one would be taken by the next request as it closes), and
// the client then makes a new one at once (refill), off any request's
// time to first token, so that no completion waits for a dial. A client
// that makes a connection per request again (through a managed server's
// dialer, a dial and an ownership check each), or whose completions dial
// their own, fails this test.
func TestConnectionsAreReused(t *testing.T) {
	t.Parallel()
	var conns, keptStreams, coldCompletions atomic.Int64
	var mu sync.Mutex
	served := map[string]int{} // requests served, by the client's end of each connection
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		before := served[r.RemoteAddr]
		served[r.RemoteAddr]++
		mu.Unlock()
		switch r.URL.Path {
		case "/completion":
			if !r.Close {
				keptStreams.Add(1)
			}
			if before == 0 {
				coldCompletions.Add(1)
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"content\":\"hello\",\"stop\":false}\n\n")
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: {\"content\":\"!\",\"stop\":true,\"stop_type\":\"eos\",\"timings\":{\"cache_n\":3,\"prompt_n\":1}}\n\n")
		case "/props":
			fmt.Fprint(w, `{"total_slots":1,"default_generation_settings":{"n_ctx":512}}`)
		default: // llama-server answers /health and slot actions with small JSON bodies
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
	c, dials := countingClient(t, srv.URL)
	ctx := t.Context()
	const completions = 5
	for i := range completions {
		for range 3 {
			if err := c.Health(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.EraseSlot(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		gen, err := c.Generate(ctx, ctxd.GenerateRequest{Tokens: []int{1, 2, 3}}, nil)
		if err != nil || gen.Text != "hello!" || gen.DoneReason != ctxd.DoneStop || gen.BackendCached != 3 {
			t.Fatalf("generation %d: %+v, %v", i, gen, err)
		}
	}
	if n := keptStreams.Load(); n != 0 {
		t.Errorf("%d completions did not ask for their connection to close", n)
	}
	// One connection for the first requests, and one made after each
	// completion: the next requests, the next completion among them, take
	// it.
	if n, d := conns.Load(), dials.Load(); n != completions+1 || d != completions+1 {
		t.Errorf("%d requests, %d of them completions, made %d connections (%d dials), want %d: answers do not go back to the pool",
			1+completions*7, completions, n, d, completions+1)
	}
	if n := coldCompletions.Load(); n != 0 {
		t.Errorf("%d of %d completions went out on a connection made for them: each waited for a dial", n, completions)
	}
}

// TestBackToBackOnTheRealServer: the real llama-server closes a
// connection after a streamed completion without announcing it. Requests
// sent right after one must not go out on that connection: while
// completions went back to the pool, one in a few hundred failed with "use
// of closed network connection" (a race this test may not hit). Each
// completion takes a connection; the other requests share one.
func TestBackToBackOnTheRealServer(t *testing.T) {
	model := ollamatest.Model(t, modelgen.DefaultConfig())
	base := llamaservertest.Start(t, model, "-c", "512", "-np", "1", "--slot-save-path", t.TempDir())
	c, dials := countingClient(t, base)
	ctx := t.Context()
	const completions = 30
	for i := range completions {
		if _, err := c.Generate(ctx, ctxd.GenerateRequest{Tokens: []int{1, 100 + i, 200}, MaxTokens: 2}, nil); err != nil {
			t.Fatalf("completion %d: %v", i, err)
		}
		if _, err := c.SaveSlot(ctx, 0, "s.bin"); err != nil {
			t.Fatalf("slot save after completion %d: %v", i, err)
		}
		if err := c.Health(ctx); err != nil {
			t.Fatalf("health after completion %d: %v", i, err)
		}
	}
	if d := dials.Load(); d > completions+1 {
		t.Errorf("%d requests, %d of them completions, made %d connections; want at most %d", 1+3*completions, completions, d, completions+1)
	}
}

// countingClient is a client of base that counts its dials, after its
// first request (props) has made one.
func countingClient(t *testing.T, base string) (*Client, *atomic.Int64) {
	t.Helper()
	dials := new(atomic.Int64)
	c, err := New(base, Options{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Props(t.Context()); err != nil {
		t.Fatal(err)
	}
	return c, dials
}
