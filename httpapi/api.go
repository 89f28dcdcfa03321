package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/frontdoor"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// allowed lists each route's methods; a route's other methods get 405.
var allowed = map[string]string{
	"/v1/health": "GET", "/v1/status": "GET", "/v1/schema": "GET", "/v1/ask": "POST",
	"/v1/sessions": "GET", "/v1/sessions/{id}": "GET, DELETE", "/v1/sessions/{id}/prompt": "GET",
	"/v1/codex": "GET", "/v1/codex/load": "POST", "/v1/codex/search": "GET",
	"/v1/codex/files": "GET", "/v1/codex/files/{path...}": "GET", "/v1/sigil": "GET",
	"/v1/ws": "GET", "/v1/mcp": "GET, POST, DELETE",
	"/v1/karma": "GET", "/v1/karma/{id}": "GET", "/v1/karma/{id}/{action}": "POST", "/v1/sessions/{id}/karma": "GET",
	"/metrics": "GET", "/v1/log/level": "GET, PUT", "/v1/reload": "POST",
	"/dashboard": "GET", "/dashboard/{file...}": "GET", "/v1/dashboard/events": "GET", "/v1/dashboard/token": "POST",
}

// routes is every route of both listeners: the native API under /v1/ and
// the front doors (OpenAI under /v1/, Ollama under /api/). tokens says
// whether every request must carry a sigil's token (the TCP listener).
// The MCP endpoint's in-process requests run through the same routes.
func (srv *Server) routes(tokens bool) http.Handler {
	mcp := srv.mcp
	own, sess, cdx, krm, ws := daemonRoutes{srv}, sessionRoutes{srv}, codexRoutes{srv}, karmaRoutes{srv}, wsRoutes{srv}
	mux := http.NewServeMux()
	srv.doors().Register(mux)
	mux.HandleFunc("GET /v1/health", own.handleHealth)
	mux.HandleFunc("GET /v1/status", own.handleStatus)
	mux.HandleFunc("GET /v1/schema", own.handleSchema)
	mux.HandleFunc("POST /v1/ask", sess.handleAsk)
	mux.HandleFunc("GET /v1/sessions", sess.handleSessions)
	mux.HandleFunc("GET /v1/sessions/{id}", sess.handleSession)
	mux.HandleFunc("DELETE /v1/sessions/{id}", sess.handleDeleteSession)
	mux.HandleFunc("GET /v1/sessions/{id}/prompt", sess.handleLastPrompt)
	mux.HandleFunc("GET /v1/codex", cdx.handleCodexStats)
	mux.HandleFunc("POST /v1/codex/load", cdx.handleCodexLoad)
	mux.HandleFunc("GET /v1/codex/search", cdx.handleCodexSearch)
	mux.HandleFunc("GET /v1/codex/files", cdx.handleCodexFiles)
	mux.HandleFunc("GET /v1/codex/files/{path...}", cdx.handleCodexFile)
	mux.HandleFunc("GET /v1/sigil", own.handleSigil)
	mux.HandleFunc("GET /v1/karma", krm.handleKarmaList)
	mux.HandleFunc("GET /v1/karma/{id}", krm.handleKarmaTrace)
	mux.HandleFunc("POST /v1/karma/{id}/{action}", krm.handleKarmaJudge)
	mux.HandleFunc("GET /v1/sessions/{id}/karma", krm.handleSessionKarma)
	mux.HandleFunc("GET /v1/ws", ws.handleWS)
	mux.Handle("GET /metrics", srv.cfg.Metrics.Handler())
	mux.HandleFunc("GET /v1/log/level", own.handleLogLevel)
	mux.HandleFunc("PUT /v1/log/level", own.handleLogLevel)
	mux.HandleFunc("POST /v1/reload", own.handleReload)
	dashRoutes{srv}.register(mux, true)
	for _, m := range []string{"GET", "POST", "DELETE"} {
		mux.Handle(m+" /v1/mcp", mcp)
	}
	// Method-less patterns for the same paths catch the wrong methods:
	// the method-specific ones above take precedence.
	for path, allow := range allowed {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, ctxd.Errorf(ctxd.KindMethod, "%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, ctxd.Errorf(ctxd.KindUnknownRoute, "no route %s %s; ctxd's own routes are under /v1/ (health, status, schema, ask, sessions, codex, sigil, karma, ws, mcp, log/level, reload, dashboard), /metrics and the dashboard's page at /dashboard/, the OpenAI door's are /v1/chat/completions, /v1/completions and /v1/models, the Ollama door's under /api/", r.Method, r.URL.Path))
	})
	h := patterns(mux)
	return srv.instrument(srv.track(srv.authenticate(srv.recoverer(h), tokens))) // the recoverer logs paths: it sees none with a token
}

// recoverer keeps a panic in one handler from taking the daemon down. It
// answers in the error shape of the route's door; a panic after a stream
// started ends the stream with an error event of that door's shape.
func (srv *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackedWriter{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				srv.log.ErrorContext(r.Context(), "handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
				err := ctxd.Errorf(ctxd.KindInternal, "internal error; see the daemon log")
				if !tw.wrote {
					writeErrorFor(w, r, err) // in the door's shape on a door's path
					return
				}
				if frontdoor.WriteStreamError(w, r.URL.Path, err) {
					return
				}
				if b, merr := json.Marshal(errorEvent(err)); merr == nil {
					_, _ = w.Write(append(b, '\n'))
				}
			}
		}()
		next.ServeHTTP(tw, r)
	})
}

// trackedWriter notes whether anything was written.
type trackedWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackedWriter) WriteHeader(code int) {
	t.wrote = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackedWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (t *trackedWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// errorBody is every error answer: {"error": "...", "kind": "..."}.
type errorBody struct {
	Error string    `json:"error"`
	Kind  ctxd.Kind `json:"kind"`
}

// writeError answers with err's kind's status and its message.
func writeError(w http.ResponseWriter, err error) {
	k := ctxd.KindOf(err)
	writeJSON(w, k.Status(), errorBody{Error: err.Error(), Kind: k})
}

func (srv daemonRoutes) handleHealth(w http.ResponseWriter, r *http.Request) {
	if _, err := srv.core.Engine(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "starting", "error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// handleStatus reports the daemon's state, as much of it as the
// request's sigil may see (statusFor). It reads snapshots only: it never
// waits for a generation, a codex load or the session store.
func (srv daemonRoutes) handleStatus(w http.ResponseWriter, r *http.Request) {
	who, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, srv.statusFor(r.Context(), who))
}

func (srv daemonRoutes) handleSchema(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/schema+json")
	_, _ = w.Write(runcontext.Schema())
}

// handleSessions lists the sessions of the request's sigil
// (sessions:read); others' are not shown.
func (srv sessionRoutes) handleSessions(w http.ResponseWriter, r *http.Request) {
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(s, sigils.ScopeSessRead)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	all, err := srv.cfg.Store.Sessions(r.Context())
	if err != nil {
		writeError(w, ctxd.Errorf(ctxd.KindInternal, "%w", err))
		return
	}
	list := []ctxd.SessionInfo{}
	for _, si := range all {
		if srv.owns(s.Name, si.Sigil) {
			si.ID = ctxd.ClientSessionID(si.ID) // the id its client named
			list = append(list, si)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": list})
}

// owns reports whether sigil owns a session whose recorded owner is
// owner: its own, or one recorded before owners were, which is the
// default sigil's.
func (srv sessionRoutes) owns(sigil, owner string) bool {
	return owner == sigil || owner == "" && sigil == srv.cfg.Sigils.Default()
}

// ownSession is session id if the request's sigil holds scope and owns
// it; another sigil's session is not found (its existence is not
// disclosed), and so is one never seen.
func (srv sessionRoutes) ownSession(r *http.Request, id, scope string) (ctxd.Session, error) {
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(s, scope)
	}
	if err != nil {
		return ctxd.Session{}, err
	}
	internal, err := srv.sessionFor(r.Context(), s.Name, id)
	if err != nil {
		return ctxd.Session{}, err
	}
	sess, err := srv.cfg.Store.Session(r.Context(), internal)
	if err != nil {
		return sess, ctxd.Errorf(ctxd.KindInternal, "%w", err)
	}
	if sess.Count > 0 && !srv.owns(s.Name, sess.Owner) || sess.Count == 0 && sess.Owner != "" && sess.Owner != s.Name {
		return ctxd.Session{}, ctxd.Errorf(ctxd.KindNotFound, "sigil %q has no session %q", s.Name, id)
	}
	return sess, nil
}

// sigilName is the name of the sigil actor gave ("" on an error, which
// the caller has already had from it).
func sigilName(s runcontext.Sigil, _ error) string { return s.Name }

// sessionFor is the session sigil's session id names (ids are per sigil:
// ctxd.ScopedSessionID), as the store holds it.
func (srv *Server) sessionFor(ctx context.Context, sigil, id string) (string, error) {
	sess, err := srv.cfg.Store.Session(ctx, id)
	if err != nil {
		return "", ctxd.Errorf(ctxd.KindInternal, "%w", err)
	}
	return ctxd.ScopedSessionID(sess.Owner, sigil, srv.cfg.Sigils.Default(), id), nil
}

// sessionID is the {id} of a session route, or a 400 naming the pattern.
func sessionID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := ctxd.CheckSessionID(id); err != nil {
		writeError(w, err)
		return "", false
	}
	return id, true
}

// handleSession reads a session from the store: it sees the turns recorded
// so far and never waits for the session's running request.
func (srv sessionRoutes) handleSession(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	s, err := srv.ownSession(r, id, sigils.ScopeSessRead)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.Turns == nil {
		s.Turns = []ctxd.Turn{}
	}
	writeJSON(w, http.StatusOK, ctxd.SessionTurns{Session: id, Epoch: s.Epoch, Turns: s.Turns})
}

func (srv sessionRoutes) handleLastPrompt(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	e, _ := srv.core.Engine()
	if e == nil {
		writeError(w, ctxd.Errorf(ctxd.KindNotFound, "session %q sent no prompt since the daemon started (the backend is not ready)", id))
		return
	}
	// The prompt holds its sigil's karma and tools: only that sigil reads it.
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err == nil {
		err = requireScope(s, sigils.ScopeSessRead)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	caller := s.Name
	internal, err := srv.sessionFor(r.Context(), caller, id)
	if err != nil {
		writeError(w, err)
		return
	}
	rendered, sentAs, ok := e.Orch.LastPrompt(internal)
	if ok && sentAs != caller {
		ok = false
	}
	if !ok {
		writeError(w, ctxd.Errorf(ctxd.KindNotFound, "session %q sent no prompt as sigil %q since the daemon started", id, caller))
		return
	}
	lp := ctxd.LastPrompt{Session: id, Prompt: rendered.Prompt(), Stop: e.Orch.Stop()}
	for k, name := range runcontext.BlockNames {
		lp.Blocks = append(lp.Blocks, ctxd.PromptBlock{Name: name, Offset: rendered.Offset(k), Bytes: len(rendered.Blocks[k])})
	}
	writeJSON(w, http.StatusOK, lp)
}

// handleDeleteSession deletes through the orchestrator, which waits for the
// session's running request and forgets what it holds of the session.
func (srv sessionRoutes) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	_, err := srv.ownSession(r, id, sigils.ScopeSessWrite)
	var e *engine.Engine
	if err == nil {
		e, err = srv.core.Engine()
	}
	var internal string
	if err == nil {
		internal, err = srv.sessionFor(r.Context(), sigilName(srv.actor(r, r.URL.Query().Get("sigil"))), id)
	}
	if err == nil {
		err = e.Orch.DeleteSession(r.Context(), internal)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeJSON reads a JSON body into v: the right content type, at most
// daemon.max_body_bytes, one value, no unknown fields.
func (srv *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any, example string) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return ctxd.Errorf(ctxd.KindUnsupported, "content type %q: send application/json", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, srv.cfg.Daemon.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return ctxd.Errorf(ctxd.KindTooLarge, "request body is over the cap of %d bytes (daemon.max_body_bytes)", mbe.Limit)
		case errors.Is(err, io.EOF):
			return ctxd.Errorf(ctxd.KindInvalid, "empty body: send %s", example)
		default:
			return ctxd.Errorf(ctxd.KindInvalid, "malformed JSON body: %v", err)
		}
	}
	// Only white space may follow the value (dec.More is false before a
	// stray '}' or ']', so it cannot tell).
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return ctxd.Errorf(ctxd.KindTooLarge, "request body is over the cap of %d bytes (daemon.max_body_bytes)", mbe.Limit)
		}
		return ctxd.Errorf(ctxd.KindInvalid, "malformed JSON body: something follows the JSON value: send one")
	}
	return nil
}

// handleAsk answers POST /v1/ask; the orchestrator checks the request's
// fields.
func (srv sessionRoutes) handleAsk(w http.ResponseWriter, r *http.Request) {
	var req ctxd.AskRequest
	if err := srv.decodeJSON(w, r, &req, `{"session": ..., "query": ...}`); err != nil {
		writeError(w, err)
		return
	}
	scopes := req.Scopes
	if len(scopes) == 0 {
		scopes = requestScopes(r)
	}
	sigil, err := srv.actorScoped(r, req.Sigil, scopes)
	if err != nil {
		writeError(w, err)
		return
	}
	s := &stream{w: w, timeout: srv.cfg.Daemon.WriteTimeout.Duration}
	e, release, err := srv.persona(r.Context(), req.Persona, sigil.Name, func(msg string) {
		_ = s.send(ctxd.Event{Type: ctxd.EventProgress, Text: msg})
	})
	if err != nil {
		if s.started {
			_ = s.send(errorEvent(err))
		} else {
			writeError(w, err)
		}
		return
	}
	defer release()
	sum, err := e.Orch.AskAs(r.Context(), sigil, req, s.token)
	if err != nil {
		switch k := ctxd.KindOf(err); k {
		case ctxd.KindInternal, ctxd.KindNotRecorded:
			srv.log.ErrorContext(r.Context(), "ask failed", "session", req.Session, "kind", k, "err", err)
		case ctxd.KindBackend, ctxd.KindUnavailable:
			srv.log.WarnContext(r.Context(), "ask failed", "session", req.Session, "kind", k, "err", err)
		}
		if !s.started {
			writeError(w, err)
			return
		}
		noteOutcome(r.Context(), err)
		_ = s.send(errorEvent(err))
		return
	}
	_ = s.send(ctxd.Event{Type: ctxd.EventSummary, Summary: sum})
}

// stream writes NDJSON events, committing the 200 status with the first.
type stream struct {
	w       http.ResponseWriter
	timeout time.Duration // for the client to take one event (daemon.write_timeout)
	started bool
}

func (s *stream) token(text string) error {
	return s.send(ctxd.Event{Type: ctxd.EventToken, Text: text})
}

// send writes one NDJSON event. A write that fails means the client went
// away: the error is of kind KindCanceled.
func (s *stream) send(e any) error {
	if !s.started {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.Header().Set("Cache-Control", "no-store")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	b, err := json.Marshal(e)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "encode event: %w", err)
	}
	// A client that stops reading must not hold its backend slot (and
	// everyone queued behind it): a line it does not take in time ends
	// the request as if it had gone away.
	rc := http.NewResponseController(s.w)
	_ = rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	if err := rc.Flush(); err != nil {
		return ctxd.Errorf(ctxd.KindCanceled, "client went away or stopped reading: %w", err)
	}
	// No deadline between events: the connection may serve another
	// request later.
	_ = rc.SetWriteDeadline(time.Time{})
	return nil
}

// errorEvent is the final event of a stream that failed after it started.
func errorEvent(err error) ctxd.Event {
	k := ctxd.KindOf(err)
	return ctxd.Event{Type: ctxd.EventError, Error: err.Error(), Status: k.Status(), Kind: k}
}
