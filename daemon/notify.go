package daemon

import (
	"context"
	"fmt"
	"strings"

	"github.com/ctxd/ctxd/httpapi"
)

// This file is what a service manager asks of the daemon: is it alive,
// and how is it, in a line (systemd's WATCHDOG=1 and STATUS=; main sends
// them).

// Alive reports whether the daemon's request path answers: it reads the
// status in process, directly (no HTTP, no JSON). That takes the locks
// requests take (the scheduler's, the orchestrator's, the codex
// service's, the hardware probe's), so a daemon wedged on any of them
// does not answer, and its caller (a watchdog) stops vouching for it. The
// session store is not among them: status reads its count from the
// background, and a slow store slows requests, it does not wedge the
// daemon. It does not dial the socket: a socket whose connection cap is
// full (a flood of idle clients) is a daemon under load, not a dead one,
// and restarting it would drop every agent's connection. Alive returns
// ctx's error if ctx ends first; the check then finishes in the
// background.
func (d *Daemon) Alive(ctx context.Context) error {
	_, err := d.snapshot(ctx)
	return err
}

// StatusLine says in one line how the daemon is, for systemd's STATUS=
// (what `systemctl status ctxd` shows): the backend and its model, the
// window, the codex and the sessions once ready; why not yet ready
// before. Its error is Alive's: the line could not be read.
func (d *Daemon) StatusLine(ctx context.Context) (string, error) {
	st, err := d.snapshot(ctx)
	if err != nil {
		return "", err
	}
	return statusLine(st), nil
}

// snapshot is the status, read in process within ctx. Until the daemon
// has opened its store and hardware probe (Run's first steps) there is
// nothing to read: a zero status that says "starting".
func (d *Daemon) snapshot(ctx context.Context) (httpapi.Status, error) {
	// Run sets the store and the probe before it starts bringing the
	// backend up; d.ready and d.initErr are stored after, so either being
	// set means they are (and visible to this goroutine).
	if d.ready.Load() == nil && d.initErr.Load() == nil {
		return httpapi.Status{}, nil
	}
	done := make(chan httpapi.Status, 1)
	go func() { done <- d.Status(ctx) }()
	select {
	case st := <-done:
		return st, nil
	case <-ctx.Done():
		return httpapi.Status{}, fmt.Errorf("daemon: status did not answer in process: %w", context.Cause(ctx))
	}
}

// statusLine is st in a line: "ready · ollama 0.6.5 qwen3 · num_ctx 8192
// × 2 slots · codex ctxd 812 files rag · 3 sessions, 2 slots warm, 1
// busy, 0 queued", or "starting: backend not ready: …".
func statusLine(st httpapi.Status) string {
	if !st.Ready {
		if st.Error != "" {
			return oneLine("starting: backend not ready: " + st.Error)
		}
		return "starting: bringing the backend up"
	}
	b := st.Backend
	parts := []string{"ready", strings.TrimSpace(fmt.Sprintf("%s %s %s", b.Kind, b.Version, b.Model))}
	window := fmt.Sprintf("num_ctx %d", b.NumCtx)
	if st.Window != nil {
		window = fmt.Sprintf("num_ctx %d × %s", st.Window.NumCtx, plural(st.Window.Slots, "slot"))
	}
	parts = append(parts, window)
	if b.Restarts > 0 {
		parts = append(parts, fmt.Sprintf("backend restarted %d×", b.Restarts))
	}
	if c := st.Codex; c != nil {
		parts = append(parts, fmt.Sprintf("codex %s %s %s", c.Name, plural(c.Files, "file"), c.Plan.Mode))
	} else {
		parts = append(parts, "no codex")
	}
	load := plural(st.Sessions, "session")
	if s := st.Scheduler; s != nil {
		warm := 0
		for _, sl := range s.Slots {
			if sl.HeldTokens > 0 {
				warm++
			}
		}
		load += fmt.Sprintf(", %s warm, %d busy, %d queued", plural(warm, "slot"), s.Busy, len(s.Waiting)+s.InSessions)
	}
	parts = append(parts, load)
	if r := st.Reload; r != nil && !r.OK {
		parts = append(parts, "last reload refused: "+r.Error)
	}
	return oneLine(strings.Join(parts, " · "))
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oneLine keeps a status to one line of reasonable length: systemd shows
// it in `systemctl status`, and a newline would end the STATUS= field.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	const max = 400
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return s
}
