package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
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
	waitFor(t, func() bool {
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
	addr := f.daemon.MetricsAddr()
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

func TestLogLevelAtRuntime(t *testing.T) {
	t.Parallel()
	level := new(slog.LevelVar)
	f := newFixture(t, fixtureOptions{logLevel: level, config: func(c *config.Config) {
		c.Sigils["default"] = config.Sigil{Scopes: []string{"ask", "admin"}}
	}})
	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/v1/log/level", "", 200, `"info"`},
		{"PUT", "/v1/log/level", `{"level":"debug"}`, 200, `"debug"`},
		{"PUT", "/v1/log/level", `{"level":"loud"}`, 400, `loud`},
		{"PUT", "/v1/log/level?sigil=coder", `{"level":"error"}`, 403, `admin`},
		{"DELETE", "/v1/log/level", "", 405, "PUT"},
	} {
		code, body := f.do(t, c.method, c.path, "application/json", c.body)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s %s %s: %d %s; want %d and %s", c.method, c.path, c.body, code, body, c.code, c.want)
		}
	}
	if level.Level() != slog.LevelDebug {
		t.Errorf("the logger's level is %v after PUT debug", level.Level())
	}
	var st Status
	if err := f.client.Status(t.Context(), &st); err != nil || st.LogLevel != "debug" {
		t.Errorf("status log_level %q, %v", st.LogLevel, err)
	}
}

func TestReload(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var next config.Config
	var nextErr error
	set := func(c config.Config, err error) { mu.Lock(); next, nextErr = c, err; mu.Unlock() }
	level := new(slog.LevelVar)
	f := newFixture(t, fixtureOptions{logLevel: level, numCtx: 20000, config: func(c *config.Config) {
		c.Sigils["default"] = config.Sigil{Scopes: []string{"ask", "admin"}}
		c.Sigils["reader"] = config.Sigil{Scopes: []string{"ask"}}
	}, reread: func() (config.Config, error) { mu.Lock(); defer mu.Unlock(); return next, nextErr }})
	base := f.cfg
	clone := func() config.Config {
		c := base
		c.Sigils = map[string]config.Sigil{}
		for k, v := range base.Sigils {
			c.Sigils[k] = v
		}
		return c
	}
	reload := func() ReloadStatus {
		t.Helper()
		code, body := f.do(t, "POST", "/v1/reload", "", "")
		var st ReloadStatus
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("reload: %d %s", code, body)
		}
		if (code == 200) != st.OK {
			t.Errorf("reload answered %d with ok=%v", code, st.OK)
		}
		return st
	}
	askAs := func(sigil string) error {
		_, err := f.client.Ask(t.Context(), ctxd.AskRequest{Session: "r-" + sigil, Query: "hi", Sigil: sigil}, nil)
		return err
	}
	if err := askAs("coder"); err != nil {
		t.Fatal(err)
	}

	// Revoking a sigil, a new limit and a backend change: the first two in
	// force at once, the third reported as needing a restart.
	c := clone()
	c.Sigils["coder"] = config.Sigil{Scopes: []string{"ask"}, Revoked: true}
	c.Limits.AnswerReserve = 48
	c.Backend.Model = "another"
	c.Daemon.LogLevel = "warn"
	set(c, nil)
	st := reload()
	if !st.OK || !slices.Contains(st.Applied, "sigils") || !slices.Contains(st.Applied, "limits.answer_reserve") ||
		!slices.Equal(st.NeedsRestart, []string{"backend.model"}) {
		t.Fatalf("reload: %+v", st)
	}
	if err := askAs("coder"); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the revoked sigil still asks: %v", err)
	}
	if level.Level() != slog.LevelWarn {
		t.Errorf("log level %v after reloading warn", level.Level())
	}
	var status Status
	if err := f.client.Status(t.Context(), &status); err != nil {
		t.Fatal(err)
	}
	if status.Limits.AnswerReserve != 48 || status.Reload == nil || !status.Reload.OK {
		t.Errorf("status after the reload: limits %+v, reload %+v", status.Limits, status.Reload)
	}
	if i := slices.IndexFunc(status.Sigils, func(s SigilStatus) bool { return s.Name == "coder" }); i < 0 || !status.Sigils[i].Revoked {
		t.Errorf("status's sigils do not show coder revoked: %+v", status.Sigils)
	}

	// A bad file changes nothing: the revocation and the limit stay.
	bad := clone()
	bad.Daemon.LogLevel = "loud"
	bad.Sigils["coder"] = config.Sigil{Scopes: []string{"ask"}}
	set(bad, nil)
	if st := reload(); st.OK || !strings.Contains(st.Error, "daemon.log_level") {
		t.Errorf("a bad config was taken: %+v", st)
	}
	set(config.Config{}, os.ErrNotExist)
	if st := reload(); st.OK || !strings.Contains(st.Error, "not exist") {
		t.Errorf("a missing config was taken: %+v", st)
	}
	if err := askAs("coder"); err == nil {
		t.Error("a refused reload undid the revocation")
	}
	if err := f.client.Status(t.Context(), &status); err != nil || status.Limits.AnswerReserve != 48 || status.Reload.OK {
		t.Errorf("after a refused reload: limits %+v, reload %+v, %v", status.Limits, status.Reload, err)
	}

	// The codex's .ctxd.toml is read again too: a bad one is refused, a
	// good one tightens the limits.
	set(c, nil)
	settings := filepath.Join(base.Codex.Path, ".ctxd.toml")
	if err := os.WriteFile(settings, []byte("[limits]\nmax_depth = \"deep\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := reload(); st.OK || !strings.Contains(st.Error, ".ctxd.toml") {
		t.Errorf("a bad .ctxd.toml was taken: %+v", st)
	}
	if err := os.WriteFile(settings, []byte("[limits]\nmax_depth = 6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := reload(); !st.OK || !slices.Contains(st.Applied, "codex .ctxd.toml") {
		t.Errorf("reload with a good .ctxd.toml: %+v", st)
	}
	if err := f.client.Status(t.Context(), &status); err != nil || status.Limits.MaxDepth != 6 {
		t.Errorf("max_depth after the codex's settings: %+v, %v", status.Limits, err)
	}

	// Reloading needs the admin scope.
	if code, body := f.do(t, "POST", "/v1/reload?sigil=reader", "", ""); code != 403 || !strings.Contains(body, "admin") {
		t.Errorf("reload by a sigil without admin: %d %s", code, body)
	}
}

// TestReloadDuringStartUp: reloads that come before the backend is ready
// are in force once it is (the limits need the model's window to be
// checked); limits that do not fit the window then are reported, and the
// daemon comes up with the limits it started with instead of stopping.
func TestReloadDuringStartUp(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		reserve int
		want    int  // the answer reserve in force once ready
		ok      bool // status's last reload
	}{
		"limits that fit":       {reserve: 48, want: 48, ok: true},
		"limits that never fit": {reserve: 50000, want: 64, ok: false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			backend := fake.NewBackend()
			var mu sync.Mutex
			var next config.Config
			f := newFixture(t, fixtureOptions{noWait: true,
				reread: func() (config.Config, error) { mu.Lock(); defer mu.Unlock(); return next, nil },
				open: func(ctx context.Context, _ func()) (*Model, error) {
					select {
					case <-release:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					return &Model{Backend: backend, Tokenizer: fake.Tokenizer{}, TokenizerID: "fake",
						Info:   BackendInfo{Mode: "fake", URL: "fake://", Model: "fake", NumCtx: 20000, Slots: 1},
						Window: governor.WindowPlan{NumCtx: 20000, Slots: 1, CacheType: governor.CacheF16},
						Close:  func() error { return nil }}, nil
				}})
			mu.Lock()
			next = f.cfg
			next.Limits.AnswerReserve = c.reserve
			mu.Unlock()
			if st := f.daemon.Reload(t.Context()); !st.OK {
				t.Fatalf("a reload before the window is known: %+v", st)
			}
			close(release)
			waitFor(t, func() bool { code, _ := f.do(t, "GET", "/v1/health", "", ""); return code == 200 })
			var st Status
			if err := f.client.Status(t.Context(), &st); err != nil {
				t.Fatal(err)
			}
			if st.Limits.AnswerReserve != c.want || st.Reload == nil || st.Reload.OK != c.ok {
				t.Errorf("once ready: answer reserve %d (want %d), reload %+v (ok want %v)", st.Limits.AnswerReserve, c.want, st.Reload, c.ok)
			}
			f.ask(t, "after", "Still answering?")
		})
	}
}
