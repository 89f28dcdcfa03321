package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/mcpserver"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
)

// MCP over streamable HTTP (/v1/mcp): the server `ctxd mcp` runs over
// stdio, on the daemon's own listeners, for MCP clients that connect to a
// URL rather than launch a command. Its tools call the daemon's API in
// process, bound to the sigil of the HTTP request that opened the MCP
// session: its token's, else (on the socket) the one X-Ctxd-Sigil names,
// else the default. Each sigil has its own MCP sessions, so a session id
// is no way into another sigil's.

// mcpSessionTimeout ends an MCP session that has sent no request for so
// long: a client that went away leaves nothing behind for good.
const mcpSessionTimeout = 30 * time.Minute

// mcpHTTP serves /v1/mcp on both listeners.
type mcpHTTP struct {
	srv *Server
	api func() http.Handler // the daemon's routes behind authentication, counted as requests; set by routes

	mu      sync.Mutex
	bySigil map[string]mcpSigil // guarded by mu
	ids     map[string]string   // the sessions begun, by id: their sigil; guarded by mu
	pending map[string]int      // sessions being begun now, by sigil; guarded by mu
}

// mcpSigil is one sigil's MCP server and the handler of its sessions.
type mcpSigil struct {
	srv *mcpserver.Server
	h   http.Handler
}

// newMCPHTTP returns the MCP endpoint of a server.
func newMCPHTTP(srv *Server) *mcpHTTP {
	return &mcpHTTP{srv: srv, bySigil: map[string]mcpSigil{}, ids: map[string]string{}, pending: map[string]int{}}
}

// close ends every MCP session, once the daemon has stopped serving.
func (m *mcpHTTP) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.bySigil {
		for ss := range s.srv.MCP().Sessions() {
			_ = ss.Close()
		}
	}
}

func (m *mcpHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var sigil runcontext.Sigil
	var err error
	if len(requestScopes(r)) > 0 {
		// Sessions are kept per sigil, with the sigil's scopes: narrowing
		// is refused rather than ignored.
		err = ctxd.Errorf(ctxd.KindInvalid, "X-Ctxd-Scopes: the MCP endpoint serves a sigil's own scopes; make a sigil with fewer scopes instead")
	} else {
		sigil, err = m.srv.doorSigil(r)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if r.Method == http.MethodGet {
		// A stream of the server's own messages, open until the client
		// leaves: it ends when the daemon begins to stop, so that it does
		// not hold up the shutdown.
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		go func() {
			select {
			case <-m.srv.stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
		r = r.WithContext(ctx)
	}
	a, _ := r.Context().Value(authKey{}).(authInfo)
	h, err := m.sessions(r.Context(), authInfo{name: sigil.Name, byToken: a.byToken, token: a.token})
	begins := r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") == ""
	if err == nil && begins {
		err = m.room(sigil.Name) // a request without a session begins one
	}
	if err != nil {
		writeError(w, err)
		return
	}
	if !begins {
		h.ServeHTTP(w, r)
		return
	}
	cw := &sessionIDCapture{ResponseWriter: w}
	defer func() { // the place room reserved becomes the session, or is given back
		m.mu.Lock()
		m.pending[sigil.Name]--
		if cw.id != "" {
			m.ids[cw.id] = sigil.Name
		}
		m.mu.Unlock()
	}()
	h.ServeHTTP(cw, r)
}

// sessionIDCapture keeps the session id an answer gives its client, as
// its headers are written.
type sessionIDCapture struct {
	http.ResponseWriter
	id string
}

func (c *sessionIDCapture) capture() {
	if c.id == "" {
		c.id = c.ResponseWriter.Header().Get("Mcp-Session-Id")
	}
}

func (c *sessionIDCapture) WriteHeader(code int) {
	c.capture()
	c.ResponseWriter.WriteHeader(code)
}

func (c *sessionIDCapture) Write(b []byte) (int, error) {
	c.capture()
	return c.ResponseWriter.Write(b)
}

func (c *sessionIDCapture) Flush() {
	c.capture()
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap is the writer it wraps (for http.ResponseController).
func (c *sessionIDCapture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// room is nil if sigil may begin another MCP session: it holds fewer than
// daemon.max_mcp_sessions_per_sigil, and all sigils together fewer than
// daemon.max_mcp_sessions. Each session is kept until its client ends it
// or it is idle for mcpSessionTimeout: unbounded, a flood of initialize
// calls held a goroutine and its memory for each (issue 27, finding 7).
func (m *mcpHTTP) room(sigil string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	mine, all := 0, 0
	for s, n := range m.countsLocked() {
		all += n
		if s == sigil {
			mine += n
		}
	}
	for s, n := range m.pending { // begun now, not yet given to their clients
		all += n
		if s == sigil {
			mine += n
		}
	}
	d := m.srv.cfg.Daemon
	if d.MaxMCPSessionsPerSigil > 0 && mine >= d.MaxMCPSessionsPerSigil {
		return ctxd.Errorf(ctxd.KindTooMany, "sigil %q holds %d MCP sessions, the most daemon.max_mcp_sessions_per_sigil allows; end one (DELETE with its Mcp-Session-Id) or wait %v for an idle one to end", sigil, mine, mcpSessionTimeout)
	}
	if d.MaxMCPSessions > 0 && all >= d.MaxMCPSessions {
		return ctxd.Errorf(ctxd.KindTooMany, "the daemon holds %d MCP sessions, the most daemon.max_mcp_sessions allows", all)
	}
	m.pending[sigil]++ // the caller gives it back once the session is begun
	return nil
}

// bySigilCounts is the MCP sessions open now, by sigil: those begun and
// given to a client (the SDK makes and drops others of its own while it
// answers an initialize) and not ended since.
func (m *mcpHTTP) bySigilCounts() map[string]int {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.countsLocked()
}

// countsLocked is bySigilCounts; the caller holds m.mu.
func (m *mcpHTTP) countsLocked() map[string]int {
	live := map[string]bool{}
	for _, s := range m.bySigil {
		for ss := range s.srv.MCP().Sessions() {
			live[ss.ID()] = true
		}
	}
	out := map[string]int{}
	for id, sigil := range m.ids {
		if !live[id] {
			delete(m.ids, id) // ended by its client, or idle past mcpSessionTimeout
			continue
		}
		out[sigil]++
	}
	return out
}

// sessions is the MCP handler of one sigil's sessions, made on first use
// with one MCP server for all of them.
func (m *mcpHTTP) sessions(ctx context.Context, sigil authInfo) (http.Handler, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := sigil.name
	if !sigil.byToken {
		key = "\x00" + key // named on the socket, not proven by a token
	}
	if s, ok := m.bySigil[key]; ok {
		return s.h, nil
	}
	log := m.srv.log.With("component", "mcp")
	srv, err := mcpserver.New(ctx, mcpDaemon{srv: m.srv, auth: sigil}, mcpserver.Options{Version: m.srv.cfg.Version, Logger: log})
	if err != nil {
		return nil, ctxd.Errorf(ctxd.KindInternal, "httpapi: MCP server for sigil %q: %w", sigil.name, err)
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() }, &mcp.StreamableHTTPOptions{
		SessionTimeout:      mcpSessionTimeout,
		MaxRequestBodyBytes: m.srv.cfg.Daemon.MaxBodyBytes,
		Logger:              log,
	})
	m.bySigil[key] = mcpSigil{srv: srv, h: h}
	return h, nil
}

// mcpDaemon is the request path as one sigil's MCP server sees it, in
// process: each tool call is served by the functions the HTTP routes
// serve, with no HTTP and no JSON in between. It is a request like the
// others: named (after the MCP request it serves), counted in the metrics
// under its route's pattern, refused once the server is shutting down and
// drained with the rest, and stopped when the server stops its requests
// (an MCP tool's context does not end with its client).
type mcpDaemon struct {
	srv  *Server
	auth authInfo // the sigil the MCP session was opened as
}

var _ mcpserver.Daemon = mcpDaemon{}

// sigil is the session's sigil as it stands now: a reload may have
// revoked the token the session was opened with, or changed its scopes.
func (m mcpDaemon) sigil() (runcontext.Sigil, error) {
	if m.auth.token != "" {
		if err := m.srv.stillHolds(m.auth, "MCP session"); err != nil {
			return runcontext.Sigil{}, err
		}
	}
	s, err := m.srv.cfg.Sigils.Resolve(m.auth.name)
	if err != nil {
		return s, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
	}
	return s, nil
}

// call serves one tool call as a request of route (a route's pattern).
func (m mcpDaemon) call(ctx context.Context, route string, fn func(context.Context, runcontext.Sigil) error) (err error) {
	srv := m.srv
	srv.mu.Lock()
	if srv.draining {
		srv.mu.Unlock()
		return ctxd.Errorf(ctxd.KindUnavailable, "ctxd is shutting down")
	}
	srv.handled.Add(1)
	srv.mu.Unlock()
	defer srv.handled.Done()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(srv.requests, func() { cancel(context.Cause(srv.requests)) })
	defer stop()
	id := reqid.From(ctx) + "." + reqid.New()[:8]
	if !reqid.Valid(id) {
		id = reqid.New()
	}
	ctx = reqid.With(ctx, id)
	start := time.Now()
	defer func() {
		if v := recover(); v != nil {
			srv.log.ErrorContext(ctx, "MCP tool call panic", "route", route, "panic", v)
			err = ctxd.Errorf(ctxd.KindInternal, "internal error; see the daemon log")
		}
		code, outcome := http.StatusOK, "ok"
		if err != nil {
			k := ctxd.KindOf(err)
			code, outcome = k.Status(), string(k)
		}
		srv.cfg.Metrics.Request(route, code, outcome)
		srv.log.DebugContext(ctx, "request", "via", "mcp", "route", route, "code", code, "outcome", outcome,
			"ms", float64(time.Since(start).Microseconds())/1000)
	}()
	s, err := m.sigil()
	if err != nil {
		return err
	}
	return fn(ctx, s)
}

func (m mcpDaemon) Sigil(ctx context.Context) (*ctxd.SigilInfo, error) {
	var info *ctxd.SigilInfo
	err := m.call(ctx, "GET /v1/sigil", func(_ context.Context, s runcontext.Sigil) error {
		info = &ctxd.SigilInfo{Name: s.Name, Scopes: s.Scopes, Authenticated: m.auth.byToken,
			Description: m.srv.cfg.Sigils.Description(s.Name)}
		return nil
	})
	return info, err
}

func (m mcpDaemon) Ask(ctx context.Context, req ctxd.AskRequest, onToken func(string)) (*ctxd.Summary, error) {
	var sum *ctxd.Summary
	err := m.call(ctx, "POST /v1/ask", func(ctx context.Context, s runcontext.Sigil) error {
		e, release, err := m.srv.persona(ctx, req.Persona, s.Name, nil)
		if err != nil {
			return err
		}
		defer release()
		req.Sigil, req.Scopes = s.Name, s.Scopes
		sum, err = e.Orch.AskAs(ctx, s, req, func(t string) error {
			if onToken != nil {
				onToken(t)
			}
			return nil
		})
		return err
	})
	return sum, err
}

func (m mcpDaemon) SearchCodex(ctx context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	var ex []ctxd.Excerpt
	err := m.call(ctx, "GET /v1/codex/search", func(ctx context.Context, s runcontext.Sigil) (err error) {
		ex, err = codexRoutes{m.srv}.searchCodex(ctx, s, strings.TrimSpace(q), k)
		return err
	})
	return ex, err
}

func (m mcpDaemon) CodexFiles(ctx context.Context) ([]ctxd.CodexFile, error) {
	var files []ctxd.CodexFile
	err := m.call(ctx, "GET /v1/codex/files", func(_ context.Context, s runcontext.Sigil) (err error) {
		files, err = codexRoutes{m.srv}.codexFiles(s)
		return err
	})
	return files, err
}

func (m mcpDaemon) CodexFile(ctx context.Context, path string) (*ctxd.CodexFileContent, error) {
	var f *ctxd.CodexFileContent
	err := m.call(ctx, "GET /v1/codex/files/{path...}", func(_ context.Context, s runcontext.Sigil) (err error) {
		f, err = codexRoutes{m.srv}.codexFile(s, path)
		return err
	})
	return f, err
}

// Status is the daemon's status as the status tool shows it: v (a map)
// gets its JSON fields.
func (m mcpDaemon) Status(ctx context.Context, v any) error {
	return m.call(ctx, "GET /v1/status", func(ctx context.Context, who runcontext.Sigil) error {
		b, err := json.Marshal(m.srv.statusFor(ctx, who))
		if err != nil {
			return ctxd.Errorf(ctxd.KindInternal, "status: %w", err)
		}
		return json.Unmarshal(b, v)
	})
}
