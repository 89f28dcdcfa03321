package httpapi

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// errKarmaOff answers karma requests to a daemon that keeps no traces.
var errKarmaOff = ctxd.Errorf(ctxd.KindUnavailable, "karma is off: the daemon keeps no traces (karma.enabled = false, or a session store without karma)")

// karmaActor is the request's sigil, checked to hold scope, and the
// daemon's karma store; or the error answered.
func (srv karmaRoutes) karmaActor(w http.ResponseWriter, r *http.Request, scope string) (runcontext.Sigil, bool) {
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(s, scope)
	}
	if err == nil && srv.cfg.Karma == nil {
		err = errKarmaOff
	}
	if err != nil {
		writeError(w, err)
		return s, false
	}
	return s, true
}

// ownTrace is trace idText if it is sigil s's; another sigil's trace is
// not found, so its existence is not disclosed.
func (srv karmaRoutes) ownTrace(ctx context.Context, s runcontext.Sigil, idText string) (ctxd.Trace, []ctxd.KarmaEvent, error) {
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil || id <= 0 {
		return ctxd.Trace{}, nil, ctxd.Errorf(ctxd.KindInvalid, "trace id %q must be a positive number", idText)
	}
	t, events, err := srv.cfg.Karma.Trace(ctx, id)
	if err == nil && t.Sigil != s.Name {
		err = ctxd.Errorf(ctxd.KindNotFound, "no trace %d of sigil %q", id, s.Name)
	}
	if err != nil {
		return t, nil, karmaError(err)
	}
	return t, events, nil
}

// karmaError keeps an error's kind, or makes it internal.
func karmaError(err error) error {
	var e *ctxd.Error
	if errors.As(err, &e) {
		return err
	}
	return ctxd.Errorf(ctxd.KindInternal, "karma: %w", err)
}

// handleKarmaList is GET /v1/karma: the sigil's traces, newest first,
// filtered by session, status, pinned, q (full text) and at (the record
// as it stood then, RFC 3339).
func (srv karmaRoutes) handleKarmaList(w http.ResponseWriter, r *http.Request) {
	s, ok := srv.karmaActor(w, r, sigils.ScopeKarmaRead)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := ctxd.TraceFilter{Sigil: s.Name, Session: q.Get("session"), Status: q.Get("status"), Pinned: q.Get("pinned") == "true", Text: q.Get("q")}
	switch f.Status {
	case "", ctxd.TraceRecorded, ctxd.TraceVerified, ctxd.TraceRejected:
	default:
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, "status %q is not one of recorded, verified, rejected", f.Status))
		return
	}
	if at := q.Get("at"); at != "" {
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			writeError(w, ctxd.Errorf(ctxd.KindInvalid, "at %q must be an RFC 3339 time, such as 2026-11-25T10:00:00Z", at))
			return
		}
		f.At = t
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, ctxd.Errorf(ctxd.KindInvalid, "limit %q must be a number from 1 to 1000", l))
			return
		}
		f.Limit = n
	}
	if f.Session != "" {
		internal, err := srv.sessionFor(r.Context(), s.Name, f.Session)
		if err != nil {
			writeError(w, err)
			return
		}
		f.Session = internal
	}
	var list []ctxd.Trace
	var err error
	version, files := srv.currentCode()
	switch q.Get("stale") {
	case "", "false":
		list, err = srv.cfg.Karma.Traces(r.Context(), f)
	case "true":
		// What needs verifying again: the traces the karma block may hold
		// whose code changed since they were verified.
		if f.Status != "" || f.Pinned || f.Text != "" || !f.At.IsZero() || f.Limit != 0 {
			writeError(w, ctxd.Errorf(ctxd.KindInvalid, "stale=true lists the traces the karma block may hold now that are stale; it combines with session only, not status, pinned, q, at or limit"))
			return
		}
		if version == "" {
			writeError(w, ctxd.Errorf(ctxd.KindConflict, "stale=true: no codex is loaded, so no trace can be stale against it"))
			return
		}
		list, err = srv.cfg.Karma.Eligible(r.Context(), s.Name)
		list = slices.DeleteFunc(list, func(t ctxd.Trace) bool {
			return karma.Stale(t, version, files) == "" || f.Session != "" && t.Session != f.Session
		})
	default:
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, "stale %q must be true or false", q.Get("stale")))
		return
	}
	if err != nil {
		writeError(w, karmaError(err))
		return
	}
	if list == nil {
		list = []ctxd.Trace{}
	}
	for i := range list {
		list[i].Session = ctxd.ClientSessionID(list[i].Session) // the id its client named
		list[i].Stale = karma.Stale(list[i], version, files)
	}
	writeJSON(w, http.StatusOK, map[string]any{"sigil": s.Name, "traces": list})
}

// handleKarmaTrace is GET /v1/karma/{id}: one trace and its events.
func (srv karmaRoutes) handleKarmaTrace(w http.ResponseWriter, r *http.Request) {
	s, ok := srv.karmaActor(w, r, sigils.ScopeKarmaRead)
	if !ok {
		return
	}
	t, events, err := srv.ownTrace(r.Context(), s, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if events == nil {
		events = []ctxd.KarmaEvent{}
	}
	t.Session = ctxd.ClientSessionID(t.Session) // the id its client named
	version, files := srv.currentCode()
	t.Stale = karma.Stale(t, version, files)
	writeJSON(w, http.StatusOK, ctxd.TraceHistory{Trace: t, Events: events})
}

// handleKarmaJudge is POST /v1/karma/{id}/{action}: verify, reject, pin,
// unpin, or supersede (by another of the sigil's traces). The answer
// comes once the event is durable.
func (srv karmaRoutes) handleKarmaJudge(w http.ResponseWriter, r *http.Request) {
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	var body ctxd.KarmaJudgement
	if r.ContentLength != 0 {
		if err := srv.decodeJSON(w, r, &body, `{"note": "...", "by": TRACE}`); err != nil {
			writeError(w, err)
			return
		}
	}
	after, err := srv.judge(r.Context(), s, r.PathValue("id"), r.PathValue("action"), body)
	if err != nil {
		writeError(w, err)
		return
	}
	after.Session = ctxd.ClientSessionID(after.Session)
	writeJSON(w, http.StatusOK, after)
}

// judge applies one judgement of sigil s to its trace idText and returns
// the trace after it, once the event is durable. s needs karma:write; a
// trace of another sigil is not found.
func (srv karmaRoutes) judge(ctx context.Context, s runcontext.Sigil, idText, action string, j ctxd.KarmaJudgement) (ctxd.Trace, error) {
	if err := requireScope(s, sigils.ScopeKarmaWrite); err != nil {
		return ctxd.Trace{}, err
	}
	if srv.cfg.Karma == nil {
		return ctxd.Trace{}, errKarmaOff
	}
	switch action {
	case ctxd.KarmaVerify, ctxd.KarmaReject, ctxd.KarmaPin, ctxd.KarmaUnpin, ctxd.KarmaSupersede:
	default:
		return ctxd.Trace{}, ctxd.Errorf(ctxd.KindNotFound, "no karma action %q: verify, reject, pin, unpin or supersede", action)
	}
	t, events, err := srv.ownTrace(ctx, s, idText)
	if err != nil {
		return t, err
	}
	// Bounded: a trace's history is read whole (GET /v1/karma/{id}) and
	// every note is kept for good.
	if n := srv.cfg.KarmaBounds.MaxNoteBytes; n > 0 && len(j.Note) > n {
		return t, ctxd.Errorf(ctxd.KindTooLarge, "note: %d bytes, over the %d of karma.max_note_bytes", len(j.Note), n)
	}
	if n := srv.cfg.KarmaBounds.MaxJudgements; n > 0 && len(events) >= n {
		return t, ctxd.Errorf(ctxd.KindTooMany, "trace %d has %d judgements, the most karma.max_judgements allows: it cannot be judged again", t.ID, len(events))
	}
	if action == ctxd.KarmaSupersede {
		if j.By == 0 {
			return t, ctxd.Errorf(ctxd.KindInvalid, `supersede: "by" (the trace that replaces it) is required`)
		}
		if _, _, err := srv.ownTrace(ctx, s, strconv.FormatInt(j.By, 10)); err != nil {
			return t, err
		}
	} else if j.By != 0 {
		return t, ctxd.Errorf(ctxd.KindInvalid, `"by" belongs to supersede only, not %s`, action)
	}
	ev := ctxd.KarmaEvent{Trace: t.ID, Action: action, Sigil: s.Name, Note: j.Note, Other: j.By, At: time.Now()}
	version, files := srv.currentCode()
	if action == ctxd.KarmaVerify && version != "" {
		// Verified against the code loaded now: the trace holds for it.
		ev.Binding = rebind(t.Bound(), version, files)
	}
	after, err := srv.cfg.Karma.KarmaEvent(ctx, ev)
	if err != nil {
		return t, karmaError(err)
	}
	after.Stale = karma.Stale(after, version, files)
	srv.log.Info("karma", "action", action, "trace", t.ID, "sigil", s.Name)
	return after, nil
}

// handleSessionKarma is GET /v1/sessions/{id}/karma: every karma epoch of
// the session that the request's sigil was shown, oldest first.
func (srv karmaRoutes) handleSessionKarma(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	s, ok := srv.karmaActor(w, r, sigils.ScopeKarmaRead)
	if !ok {
		return
	}
	internal, err := srv.sessionFor(r.Context(), s.Name, id)
	if err != nil {
		writeError(w, err)
		return
	}
	all, err := srv.cfg.Karma.KarmaSnapshots(r.Context(), internal)
	if err != nil {
		writeError(w, karmaError(err))
		return
	}
	snaps := []ctxd.KarmaSnapshot{}
	for _, sn := range all {
		if sn.Sigil == s.Name {
			snaps = append(snaps, sn)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"session": id, "snapshots": snaps})
}

// currentCode is the loaded codex's version and its files' hashes by path
// ("" and nil when no codex is loaded or the request path is not up).
func (srv karmaRoutes) currentCode() (string, map[string]string) {
	e, err := srv.core.Engine()
	if err != nil || e == nil {
		return "", nil
	}
	files, ok := e.Codex.Files()
	if !ok {
		return "", nil
	}
	sums := make(map[string]string, len(files))
	for _, f := range files {
		sums[f.Path] = f.SHA256
	}
	return ctxd.CodexVersion(files), sums
}

// rebind is binding b moved to the codex version now loaded: its files
// with the content they have now (those gone are dropped).
func rebind(b ctxd.TraceBinding, version string, files map[string]string) *ctxd.TraceBinding {
	nb := ctxd.TraceBinding{Codex: version, Whole: b.Whole}
	for _, f := range b.Files {
		if sum, ok := files[f.Path]; ok {
			nb.Files = append(nb.Files, ctxd.TraceFile{Path: f.Path, SHA256: sum, Cited: f.Cited})
		}
	}
	return &nb
}
