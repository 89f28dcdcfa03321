package httpapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
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
}

// mcpSigil is one sigil's MCP server and the handler of its sessions.
type mcpSigil struct {
	srv *mcpserver.Server
	h   http.Handler
}

// newMCPHTTP returns the MCP endpoint of a server.
func newMCPHTTP(srv *Server) *mcpHTTP {
	return &mcpHTTP{srv: srv, bySigil: map[string]mcpSigil{}}
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
	if err != nil {
		writeError(w, err)
		return
	}
	h.ServeHTTP(w, r)
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
	c := client.New("", client.WithTransport(inProcess{api: m.api, sigil: sigil, base: m.srv.requests}))
	srv, err := mcpserver.New(ctx, c, mcpserver.Options{Version: m.srv.cfg.Version, Logger: log})
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

// inProcess is an http.RoundTripper that serves a request with the
// daemon's routes in this process, bound to a sigil as a token would bind
// it. The answer streams through a pipe: the handler runs in its own
// goroutine, which ends when it returns; a reader that closes the body
// early makes its next write fail, and it returns. The request is also
// stopped when base ends (the daemon stops its requests): an MCP tool's
// context does not end with its client.
type inProcess struct {
	api   func() http.Handler
	sigil authInfo
	base  context.Context
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	stop := context.AfterFunc(t.base, func() { cancel(context.Cause(t.base)) })
	r := req.Clone(context.WithValue(ctx, authKey{}, t.sigil))
	if r.Body == nil {
		r.Body = http.NoBody
	}
	r.RequestURI, r.RemoteAddr = r.URL.RequestURI(), "in-process"
	// Each tool call is a request of its own in the log, the metrics and
	// its summary, named after the MCP request it serves.
	if id := reqid.From(req.Context()) + "." + reqid.New()[:8]; reqid.Valid(id) {
		r.Header.Set(reqid.Header, id)
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, started: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil { // http.ErrAbortHandler, which the recoverer passes on: drop the answer
				pw.CloseWithError(fmt.Errorf("httpapi: in-process request %s %s aborted: %v", r.Method, r.URL.Path, v))
			}
			w.WriteHeader(http.StatusOK) // a handler that wrote nothing
			pw.Close()
			stop()
			cancel(nil)
		}()
		t.api().ServeHTTP(w, r)
	}()
	select {
	case <-w.started:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err()) // the handler's writes fail: it returns
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status: http.StatusText(w.code), StatusCode: w.code, Header: w.sent,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Body: pr, ContentLength: -1, Request: req,
	}, nil
}

// pipeResponse is the http.ResponseWriter of an in-process request.
type pipeResponse struct {
	header  http.Header
	body    *io.PipeWriter
	once    sync.Once
	started chan struct{} // closed by WriteHeader: code and sent are set
	code    int
	sent    http.Header // the header as it was when the answer started
}

func (p *pipeResponse) Header() http.Header { return p.header }

func (p *pipeResponse) WriteHeader(code int) {
	p.once.Do(func() {
		p.code, p.sent = code, p.header.Clone()
		close(p.started)
	})
}

func (p *pipeResponse) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return p.body.Write(b)
}

// Flush: every write reaches the reader at once.
func (p *pipeResponse) Flush() {}
