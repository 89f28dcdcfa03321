package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sqlite"
)

// Event is one line of an answer stream.
type Event struct {
	Type    string                `json:"type"` // "token", "summary" or "error"
	Text    string                `json:"text,omitempty"`
	Summary *orchestrator.Summary `json:"summary,omitempty"`
	Error   string                `json:"error,omitempty"`
	Status  int                   `json:"status,omitempty"`
}

// AskRequest is the body of POST /v1/ask.
type AskRequest struct {
	Session string `json:"session"`
	Query   string `json:"query"`
	Sigil   string `json:"sigil,omitempty"`
	Pin     bool   `json:"pin,omitempty"` // keep this turn verbatim: never compacted or condensed
}

func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", d.handleHealth)
	mux.HandleFunc("GET /v1/status", d.handleStatus)
	mux.HandleFunc("GET /v1/schema", d.handleSchema)
	mux.HandleFunc("POST /v1/ask", d.handleAsk)
	mux.HandleFunc("GET /v1/sessions", d.handleSessions)
	mux.HandleFunc("GET /v1/codex", d.handleCodexStats)
	mux.HandleFunc("POST /v1/codex/load", d.handleCodexLoad)
	mux.HandleFunc("GET /v1/codex/search", d.handleCodexSearch)
	mux.HandleFunc("GET /v1/sessions/{id}", d.handleSession)
	mux.HandleFunc("DELETE /v1/sessions/{id}", d.handleDeleteSession)
	mux.HandleFunc("GET /v1/sessions/{id}/prompt", d.handleLastPrompt)
	// Method-less patterns for the same paths catch the wrong methods:
	// the method-specific ones above take precedence.
	for path, allow := range map[string]string{
		"/v1/health": "GET", "/v1/status": "GET", "/v1/schema": "GET", "/v1/ask": "POST",
		"/v1/sessions": "GET", "/v1/sessions/{id}": "GET, DELETE",
		"/v1/codex": "GET", "/v1/codex/load": "POST", "/v1/codex/search": "GET",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s; routes are under /v1/ (health, status, schema, ask, sessions, codex)", r.Method, r.URL.Path))
	})
	return d.recoverer(mux)
}

// recoverer keeps a panic in one handler from taking the daemon down.
func (d *Daemon) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				d.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
				writeError(w, http.StatusInternalServerError, "internal error; see the daemon log")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	d.mu.RLock()
	ready, initErr := d.orch != nil, d.initErr
	d.mu.RUnlock()
	if ready {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
		return
	}
	body := map[string]string{"status": "starting"}
	if initErr != nil {
		body["error"] = initErr.Error()
	}
	writeJSON(w, http.StatusServiceUnavailable, body)
}

// Status is the body of GET /v1/status.
type Status struct {
	Version      string                 `json:"version"`
	Ready        bool                   `json:"ready"`
	Error        string                 `json:"error,omitempty"`
	Backend      BackendInfo            `json:"backend"`
	Codex        *CodexStats            `json:"codex,omitempty"`
	Limits       governor.Limits        `json:"limits"`
	Window       *governor.WindowPlan   `json:"window,omitempty"`
	Model        *governor.ModelFacts   `json:"model,omitempty"`
	LastRequest  *orchestrator.Summary  `json:"last_request,omitempty"`
	Environment  runcontext.Environment `json:"environment"`
	MemorySource string                 `json:"memory_source"`
	Sessions     int                    `json:"sessions"`
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	d.mu.RLock()
	st := Status{Version: d.version, Ready: d.orch != nil, Backend: d.backend}
	if d.initErr != nil {
		st.Error = d.initErr.Error()
	}
	if d.server != nil {
		st.Backend.Restarts = d.server.Restarts()
	}
	st.Limits = d.limits
	if d.orch != nil {
		plan, facts := d.plan, d.facts
		st.Window, st.Model, st.LastRequest = &plan, &facts, d.orch.LastSummary()
	}
	d.mu.RUnlock()
	d.mu.RLock()
	if d.codex != nil {
		cs := d.codex.stats
		st.Codex = &cs
	}
	d.mu.RUnlock()
	var rd hostenv.Reading
	st.Environment, rd = d.probe.Environment()
	st.MemorySource = rd.Source
	if list, err := d.store.Sessions(r.Context()); err == nil {
		st.Sessions = len(list)
	}
	writeJSON(w, http.StatusOK, st)
}

func (d *Daemon) handleSchema(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/schema+json")
	_, _ = w.Write(runcontext.Schema())
}

func (d *Daemon) handleSessions(w http.ResponseWriter, r *http.Request) {
	list, err := d.store.Sessions(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if list == nil {
		list = []sqlite.SessionInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": list})
}

// sessionID is the {id} of a session route, or a 400 naming the pattern.
func sessionID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if !orchestrator.SessionIDPattern.MatchString(id) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("session %q must match %s", id, orchestrator.SessionIDPattern))
		return "", false
	}
	return id, true
}

func (d *Daemon) handleSession(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	s, err := d.store.Session(r.Context(), id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if s.Turns == nil {
		s.Turns = []runcontext.Turn{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"session": id, "epoch": s.Epoch, "turns": s.Turns})
}

// PromptBlock is where one block sits in a rendered prompt, in bytes.
type PromptBlock struct {
	Name   string `json:"name"`
	Offset int    `json:"offset"`
	Bytes  int    `json:"bytes"`
}

// LastPrompt is GET /v1/sessions/{id}/prompt: the exact text the session's
// last request sent to the backend, and where each block starts in it.
type LastPrompt struct {
	Session string        `json:"session"`
	Prompt  string        `json:"prompt"`
	Blocks  []PromptBlock `json:"blocks"`
}

func (d *Daemon) handleLastPrompt(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	o := d.orchestrator()
	if o == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("session %q sent no prompt since the daemon started (the backend is not ready)", id))
		return
	}
	rendered, ok := o.LastPrompt(id)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("session %q sent no prompt since the daemon started", id))
		return
	}
	lp := LastPrompt{Session: id, Prompt: rendered.Prompt()}
	for k, name := range runcontext.BlockNames {
		lp.Blocks = append(lp.Blocks, PromptBlock{Name: name, Offset: rendered.Offset(k), Bytes: len(rendered.Blocks[k])})
	}
	writeJSON(w, http.StatusOK, lp)
}

func (d *Daemon) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	id, ok := sessionID(w, r)
	if !ok {
		return
	}
	if err := d.store.DeleteSession(r.Context(), id); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if o := d.orchestrator(); o != nil {
		o.Forget(id)
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeAsk reads and checks the body of an ask request.
func (d *Daemon) decodeAsk(w http.ResponseWriter, r *http.Request) (AskRequest, int, error) {
	var req AskRequest
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return req, http.StatusUnsupportedMediaType, fmt.Errorf("content type %q: send application/json", ct)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, d.cfg.Daemon.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return req, http.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the cap of %d bytes (daemon.max_body_bytes)", mbe.Limit)
		case errors.Is(err, io.EOF):
			return req, http.StatusBadRequest, errors.New("empty body: send {\"session\": ..., \"query\": ...}")
		default:
			return req, http.StatusBadRequest, fmt.Errorf("malformed JSON body: %v", err)
		}
	}
	if dec.More() {
		return req, http.StatusBadRequest, errors.New("malformed JSON body: more than one JSON value")
	}
	if req.Session == "" {
		return req, http.StatusBadRequest, errors.New("session: required")
	}
	if strings.TrimSpace(req.Query) == "" {
		return req, http.StatusBadRequest, errors.New("query: required and must not be blank")
	}
	return req, 0, nil
}

func (d *Daemon) handleAsk(w http.ResponseWriter, r *http.Request) {
	req, status, err := d.decodeAsk(w, r)
	if err != nil {
		writeError(w, status, err.Error())
		return
	}
	orch := d.orchestrator()
	if orch == nil {
		d.mu.RLock()
		msg := "backend is starting"
		if d.initErr != nil {
			msg = "backend not ready: " + d.initErr.Error()
		}
		d.mu.RUnlock()
		writeError(w, http.StatusServiceUnavailable, msg)
		return
	}

	s := &stream{w: w}
	sum, err := orch.Ask(r.Context(), orchestrator.Request{Session: req.Session, Query: req.Query, Sigil: req.Sigil, Pin: req.Pin}, s.token)
	if err != nil {
		status, msg := errorStatus(err)
		if !s.started {
			writeError(w, status, msg)
			return
		}
		s.send(Event{Type: "error", Error: msg, Status: status})
		return
	}
	s.send(Event{Type: "summary", Summary: sum})
}

// errorStatus maps an orchestrator error to an HTTP status and message.
func errorStatus(err error) (int, string) {
	var le *governor.LimitError
	switch {
	case errors.Is(err, orchestrator.ErrBadRequest):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, orchestrator.ErrForbidden):
		return http.StatusForbidden, err.Error()
	case errors.As(err, &le):
		return http.StatusUnprocessableEntity, "request does not fit: " + err.Error()
	case errors.Is(err, ollama.ErrModelNotFound):
		return http.StatusBadGateway, err.Error()
	case errors.Is(err, ollama.ErrUnavailable):
		return http.StatusServiceUnavailable, err.Error()
	}
	return http.StatusBadGateway, err.Error()
}

// stream writes NDJSON events, committing the 200 status with the first.
type stream struct {
	w       http.ResponseWriter
	started bool
}

func (s *stream) token(text string) error {
	return s.send(Event{Type: "token", Text: text})
}

func (s *stream) send(e Event) error { return s.sendAny(e) }

// sendAny writes one NDJSON event, committing the 200 status with the first.
func (s *stream) sendAny(e any) error {
	if !s.started {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.Header().Set("Cache-Control", "no-store")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("client went away: %w", err)
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}
