package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/daemontest"
)

// socketClient is an HTTP client on the fixture's socket that shows the
// response's headers.
func (f *fixture) raw(t *testing.T, method, path string, h http.Header, body string) *http.Response {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", f.cfg.Daemon.Socket)
	}}}
	req, err := http.NewRequest(method, "http://ctxd"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		req.Header = h
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestMetricsAndRequestIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) { c.Daemon.MetricsListen = "127.0.0.1:0" }})

	// A client's id is kept, echoed and carried in the summary.
	resp := f.raw(t, "POST", "/v1/ask", http.Header{"X-Request-Id": {"agent-7.turn-1"}, "Content-Type": {"application/json"}},
		`{"session":"m","query":"What does Serve do?"}`)
	if got := resp.Header.Get("X-Request-Id"); got != "agent-7.turn-1" {
		t.Errorf("X-Request-Id echoed as %q", got)
	}
	var sum *ctxd.Summary
	dec := json.NewDecoder(resp.Body)
	for sum == nil {
		var ev ctxd.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("the answer's stream: %v", err)
		}
		sum = ev.Summary
	}
	if sum.RequestID != "agent-7.turn-1" {
		t.Errorf("summary's request_id %q", sum.RequestID)
	}
	if sum.TTFTMillis < sum.Timing.BackendTTFTMs+sum.Timing.QueueWaitMs {
		t.Errorf("ttft_ms %.3f from arrival is less than its queue and backend parts: %+v", sum.TTFTMillis, sum.Timing)
	}
	// An id that could forge a log line is replaced by the daemon's own.
	resp = f.raw(t, "GET", "/v1/health", http.Header{"X-Request-Id": {"a b level=ERROR"}}, "")
	if got := resp.Header.Get("X-Request-Id"); got == "" || strings.ContainsAny(got, " \n=") {
		t.Errorf("a bad client id gave %q", got)
	}
	if code, _ := f.do(t, "POST", "/v1/ask", "application/json", `{"session":"m"`); code != 400 {
		t.Fatalf("malformed ask: %d", code)
	}
	f.ask(t, "m", "And what else?")

	// A request is counted when its handler returns, which may be just
	// after its client read the answer's last line.
	var body string
	daemontest.WaitFor(t, func() bool {
		var code int
		code, body = f.do(t, "GET", "/metrics", "", "")
		return code == 200 && strings.Contains(body, `ctxd_requests_total{code="200",outcome="ok",route="POST /v1/ask"} 2`)
	})
	for _, want := range []string{
		`ctxd_requests_total{code="200",outcome="ok",route="POST /v1/ask"} 2`,
		`ctxd_requests_total{code="400",outcome="invalid",route="POST /v1/ask"} 1`,
		`ctxd_requests_total{code="200",outcome="ok",route="GET /v1/health"} 1`,
		`ctxd_ttft_seconds_count 2`,
		`ctxd_ttft_part_seconds_count{part="backend"} 2`,
		`ctxd_answers_total{mode="cag"} 2`,
		`ctxd_ready 1`,
		`ctxd_codex_mode{mode="cag"} 1`,
		`ctxd_slots 1`,
		`ctxd_prompt_tokens_total{kind="reused"}`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The loopback listener serves the same metrics, and nothing else.
	addr := f.srv.MetricsAddr()
	if addr == "" {
		t.Fatal("no metrics listener")
	}
	for path, want := range map[string]int{"/metrics": 200, "/v1/status": 404} {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != want || want == 200 && !strings.Contains(string(b), "ctxd_ready 1") {
			t.Errorf("metrics listener %s: %d (want %d)", path, r.StatusCode, want)
		}
	}
}
