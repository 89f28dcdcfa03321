package daemon

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// karmaActor is the request's sigil, checked to hold scope, and the
// daemon's karma store; or the error answered.
func (d *Daemon) karmaActor(w http.ResponseWriter, r *http.Request, scope string) (runcontext.Sigil, bool) {
	s, err := d.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(s, scope)
	}
	if err == nil && d.karma == nil {
		err = ctxd.Errorf(ctxd.KindUnavailable, "karma is off: the daemon keeps no traces (karma.enabled = false, or a session store without karma)")
	}
	if err != nil {
		writeError(w, err)
		return s, false
	}
	return s, true
}

// ownTrace is trace {id} if it is sigil s's; another sigil's trace is
// answered as not found, so its existence is not disclosed.
func (d *Daemon) ownTrace(w http.ResponseWriter, r *http.Request, s runcontext.Sigil, idText string) (ctxd.Trace, []ctxd.KarmaEvent, bool) {
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil || id <= 0 {
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, "trace id %q must be a positive number", idText))
		return ctxd.Trace{}, nil, false
	}
	t, events, err := d.karma.Trace(r.Context(), id)
	if err == nil && t.Sigil != s.Name {
		err = ctxd.Errorf(ctxd.KindNotFound, "no trace %d of sigil %q", id, s.Name)
	}
	if err != nil {
		writeError(w, karmaError(err))
		return t, nil, false
	}
	return t, events, true
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
func (d *Daemon) handleKarmaList(w http.ResponseWriter, r *http.Request) {
	s, ok := d.karmaActor(w, r, sigils.ScopeKarmaRead)
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
	list, err := d.karma.Traces(r.Context(), f)
	if err != nil {
		writeError(w, karmaError(err))
		return
	}
	if list == nil {
		list = []ctxd.Trace{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sigil": s.Name, "traces": list})
}

// handleKarmaTrace is GET /v1/karma/{id}: one trace and its events.
func (d *Daemon) handleKarmaTrace(w http.ResponseWriter, r *http.Request) {
	s, ok := d.karmaActor(w, r, sigils.ScopeKarmaRead)
	if !ok {
		return
	}
	t, events, ok := d.ownTrace(w, r, s, r.PathValue("id"))
	if !ok {
		return
	}
	if events == nil {
		events = []ctxd.KarmaEvent{}
	}
	writeJSON(w, http.StatusOK, ctxd.TraceHistory{Trace: t, Events: events})
}

// handleKarmaJudge is POST /v1/karma/{id}/{action}: verify, reject, pin,
// unpin, or supersede (by another of the sigil's traces). The answer
// comes once the event is durable.
func (d *Daemon) handleKarmaJudge(w http.ResponseWriter, r *http.Request) {
	s, ok := d.karmaActor(w, r, sigils.ScopeKarmaWrite)
	if !ok {
		return
	}
	action := r.PathValue("action")
	switch action {
	case ctxd.KarmaVerify, ctxd.KarmaReject, ctxd.KarmaPin, ctxd.KarmaUnpin, ctxd.KarmaSupersede:
	default:
		writeError(w, ctxd.Errorf(ctxd.KindNotFound, "no karma action %q: verify, reject, pin, unpin or supersede", action))
		return
	}
	var body ctxd.KarmaJudgement
	if r.ContentLength != 0 {
		if err := d.decodeJSON(w, r, &body, `{"note": "...", "by": TRACE}`); err != nil {
			writeError(w, err)
			return
		}
	}
	t, _, ok := d.ownTrace(w, r, s, r.PathValue("id"))
	if !ok {
		return
	}
	if action == ctxd.KarmaSupersede {
		if body.By == 0 {
			writeError(w, ctxd.Errorf(ctxd.KindInvalid, `supersede: "by" (the trace that replaces it) is required`))
			return
		}
		if _, _, ok := d.ownTrace(w, r, s, strconv.FormatInt(body.By, 10)); !ok {
			return
		}
	} else if body.By != 0 {
		writeError(w, ctxd.Errorf(ctxd.KindInvalid, `"by" belongs to supersede only, not %s`, action))
		return
	}
	after, err := d.karma.KarmaEvent(r.Context(), ctxd.KarmaEvent{Trace: t.ID, Action: action, Sigil: s.Name, Note: body.Note, Other: body.By, At: time.Now()})
	if err != nil {
		writeError(w, karmaError(err))
		return
	}
	d.log.Info("karma", "action", action, "trace", t.ID, "sigil", s.Name)
	writeJSON(w, http.StatusOK, after)
}

// handleSessionKarma is GET /v1/sessions/{id}/karma: every karma epoch of
// the session that the request's sigil was shown, oldest first.
func (d *Daemon) handleSessionKarma(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	s, ok := d.karmaActor(w, r, sigils.ScopeKarmaRead)
	if !ok {
		return
	}
	all, err := d.karma.KarmaSnapshots(r.Context(), id)
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
