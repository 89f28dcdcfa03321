package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/httpapi"
)

// live is the part of the configuration a reload may change while the
// daemon runs, swapped whole.
type live struct {
	cfg      config.Config   // the configuration last loaded (at start, or by a reload)
	codexLim governor.Limits // the codex's own limits (.ctxd.toml); they only tighten
	reloaded bool            // put in force by a reload, not read at start
}

// reloadable are the keys a reload puts in force at once; any other key
// that changed is reported as needing a restart. "sigils" stands for
// every key under it.
var reloadable = []string{"sigils", "daemon.default_sigil", "daemon.log_level",
	"limits.max_chars", "limits.answer_reserve", "limits.max_depth", "limits.compact_to"}

// Reload reads the configuration again (Options.Reread: the config file,
// as the command line and environment said at start) and the codex's
// .ctxd.toml, and puts them in force atomically: the sigils (tokens,
// revocations, scopes), the log level and the limits change together, for
// requests that begin after it, or, if anything in the new files is
// wrong, nothing changes and the status says why. Keys that cannot change
// while the daemon runs (the backend, the socket, the codex path) are
// listed as needing a restart. SIGHUP and POST /v1/reload call it.
func (d *Daemon) Reload(ctx context.Context) httpapi.ReloadStatus {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	st := httpapi.ReloadStatus{At: time.Now(), File: d.opts.ConfigPath}
	done := func(err error) httpapi.ReloadStatus {
		if err != nil {
			st.Error = err.Error()
			d.log.Error("reload refused: the running configuration stays in force", "file", st.File, "err", err)
		} else {
			st.OK = true
			d.log.Info("reloaded", "file", st.File, "applied", strings.Join(st.Applied, " "), "needs_restart", strings.Join(st.NeedsRestart, " "))
			if len(st.NeedsRestart) > 0 {
				d.log.Warn("the reloaded configuration changed keys that take effect only at the next start", "keys", strings.Join(st.NeedsRestart, " "))
			}
		}
		d.lastReload.Store(&st)
		return st
	}
	if d.opts.Reread == nil {
		return done(fmt.Errorf("reload: this daemon was started without a way to read its configuration again"))
	}
	cfg, err := d.opts.Reread()
	if err != nil {
		return done(fmt.Errorf("reload: %w", err))
	}
	if err := cfg.Validate(); err != nil {
		return done(fmt.Errorf("reload: %w", err))
	}
	reg, err := cfg.SigilRegistry()
	if err != nil {
		return done(fmt.Errorf("reload: %w", err))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Daemon.LogLevel)); err != nil {
		return done(fmt.Errorf("reload: daemon.log_level: %w", err))
	}
	// The codex's settings are those of the codex running now: a new
	// codex.path takes effect at the next start, and so do its settings.
	var codexLim governor.Limits
	if d.cfg.Codex.Path != "" {
		if codexLim, err = codexLimits(d.cfg.Codex.Path); err != nil {
			return done(fmt.Errorf("reload: %w", err))
		}
	}
	old := d.live.Load()
	next := &live{cfg: cfg, codexLim: codexLim, reloaded: true}
	// The limits go first: they are the part that can still fail (the
	// codex may not plan under them), and then nothing else changes.
	if e := d.ready.Load(); e != nil {
		if err := d.applyLimits(ctx, e, next); err != nil {
			return done(fmt.Errorf("reload: %w", err))
		}
	}
	if ps := d.personas.Load(); ps != nil {
		for _, name := range ps.pool.Names()[1:] { // the default is ready's
			if e, ok := ps.pool.Peek(name); ok {
				if err := d.applyLimits(ctx, e, next); err != nil {
					return done(fmt.Errorf("reload: persona %q: %w", name, err))
				}
			}
		}
	}
	d.sigils.Replace(reg)
	d.level.Set(level)
	d.live.Store(next)
	for _, k := range changedKeys(old.cfg, cfg) {
		if slices.Contains(reloadable, k) {
			st.Applied = append(st.Applied, k)
		} else {
			st.NeedsRestart = append(st.NeedsRestart, k)
		}
	}
	if codexLim != old.codexLim {
		st.Applied = append(st.Applied, "codex "+codex.SettingsFile)
	}
	return done(nil)
}

// applyLimits puts l's limits in force on a running request path: the
// orchestrator's (for requests that begin after it) and the codex's,
// which is planned again if the plan depends on what changed. It changes
// nothing if the limits do not fit the model's window or the codex cannot
// be planned under them. The caller holds reloadMu.
func (d *Daemon) applyLimits(ctx context.Context, e *engine.Engine, l *live) error {
	limits := l.limits(e.Model.Window.NumCtx)
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("the new limits do not fit the model's window: %w", err)
	}
	if limits == e.Orch.Limits() {
		return nil
	}
	return e.SetLimits(ctx, limits)
}

// limits are the governor's limits for a model window of numCtx tokens.
func (l *live) limits(numCtx int) governor.Limits {
	c := l.cfg.Limits
	return governor.Limits{MaxChars: c.MaxChars, NumCtx: numCtx, AnswerReserve: c.AnswerReserve,
		MaxDepth: c.MaxDepth, CompactTo: c.CompactTo}.Tighten(l.codexLim)
}

// codexLimits reads the limits of the codex's settings file (none: zero).
func codexLimits(path string) (governor.Limits, error) {
	settings, found, err := codex.LoadSettings(path, nil)
	if err != nil || !found {
		return governor.Limits{}, err
	}
	l := settings.Limits
	return governor.Limits{MaxChars: l.MaxChars, AnswerReserve: l.AnswerReserve, MaxDepth: l.MaxDepth, CompactTo: l.CompactTo}, nil
}

// changedKeys names the keys ("section.key", or "sigils") whose values
// differ between two configurations, sorted.
func changedKeys(a, b config.Config) []string {
	var keys []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		section := strings.Split(t.Field(i).Tag.Get("toml"), ",")[0]
		fa, fb := va.Field(i), vb.Field(i)
		if fa.Kind() != reflect.Struct {
			if !reflect.DeepEqual(fa.Interface(), fb.Interface()) {
				keys = append(keys, section)
			}
			continue
		}
		ft := fa.Type()
		for j := range ft.NumField() {
			if !ft.Field(j).IsExported() {
				continue
			}
			if !reflect.DeepEqual(fa.Field(j).Interface(), fb.Field(j).Interface()) {
				name := strings.Split(ft.Field(j).Tag.Get("toml"), ",")[0]
				if name == "" {
					name = strings.ToLower(ft.Field(j).Name)
				}
				keys = append(keys, section+"."+name)
			}
		}
	}
	slices.Sort(keys)
	return keys
}
