package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
)

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
	var st httpapi.Status
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
	reload := func() httpapi.ReloadStatus {
		t.Helper()
		code, body := f.do(t, "POST", "/v1/reload", "", "")
		var st httpapi.ReloadStatus
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
	var status httpapi.Status
	if err := f.client.Status(t.Context(), &status); err != nil {
		t.Fatal(err)
	}
	if status.Limits.AnswerReserve != 48 || status.Reload == nil || !status.Reload.OK {
		t.Errorf("status after the reload: limits %+v, reload %+v", status.Limits, status.Reload)
	}
	if i := slices.IndexFunc(status.Sigils, func(s httpapi.SigilStatus) bool { return s.Name == "coder" }); i < 0 || !status.Sigils[i].Revoked {
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
				open: func(ctx context.Context, _ func()) (*bringup.Model, error) {
					select {
					case <-release:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					return daemontest.Model(backend, fake.Tokenizer{}, 20000, 1), nil
				}})
			mu.Lock()
			next = f.cfg
			next.Limits.AnswerReserve = c.reserve
			mu.Unlock()
			if st := f.daemon.Reload(t.Context()); !st.OK {
				t.Fatalf("a reload before the window is known: %+v", st)
			}
			close(release)
			daemontest.WaitFor(t, func() bool { code, _ := f.do(t, "GET", "/v1/health", "", ""); return code == 200 })
			var st httpapi.Status
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
