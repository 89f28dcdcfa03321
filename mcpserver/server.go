package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/sigils"
)

// Options configures a server.
type Options struct {
	Version string       // reported to clients as the server's version
	Logger  *slog.Logger // nil: discard
}

// Daemon is what the MCP server asks of ctxd, as one sigil: the daemon's
// client over its socket (*client.Client, for `ctxd mcp`), or the request
// path in process (the daemon's own /v1/mcp endpoint). Errors carry a
// ctxd.Kind (ctxd.KindOf).
type Daemon interface {
	// Sigil is the sigil the requests act as, and its scopes.
	Sigil(ctx context.Context) (*ctxd.SigilInfo, error)
	Ask(ctx context.Context, req ctxd.AskRequest, onToken func(string)) (*ctxd.Summary, error)
	SearchCodex(ctx context.Context, q string, k int) ([]ctxd.Excerpt, error)
	CodexFiles(ctx context.Context) ([]ctxd.CodexFile, error)
	CodexFile(ctx context.Context, path string) (*ctxd.CodexFileContent, error)
	// Status decodes the daemon's status into v (a map).
	Status(ctx context.Context, v any) error
}

var _ Daemon = (*client.Client)(nil)

// Server is an MCP server in front of one daemon, offering what its
// sigil allows.
type Server struct {
	mcp    *mcp.Server
	daemon Daemon
	sigil  ctxd.SigilInfo
	log    *slog.Logger

	// mu guards sessions. It is taken before the MCP server's own lock
	// (mcp.Server.Sessions), never while a handler waits on the daemon.
	mu       sync.Mutex
	sessions map[*mcp.ServerSession]string // each live connection's default ask session
}

// New asks the daemon which sigil c acts as and returns a server offering
// the tools and resources its scopes allow. An unreachable daemon, or a
// token no sigil holds, is an error.
func New(ctx context.Context, c Daemon, opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sig, err := c.Sigil(ctx)
	if err != nil {
		return nil, fmt.Errorf("mcpserver: which sigil the daemon's client acts as: %w", err)
	}
	s := &Server{daemon: c, sigil: *sig, log: log, sessions: map[*mcp.ServerSession]string{}}
	reads := slices.Contains(sig.Scopes, sigils.ScopeSearchCodex)
	// Capabilities are set, not inferred: the tool list never changes, the
	// resource list is the daemon's (no list_changed notifications), and
	// there is no logging capability.
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}
	if reads {
		caps.Resources = &mcp.ResourceCapabilities{}
	}
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "ctxd", Title: "ctxd", Version: version}, &mcp.ServerOptions{
		Instructions: instructions(sig.Scopes),
		Logger:       log,
		Capabilities: caps,
	})
	if slices.Contains(sig.Scopes, sigils.ScopeAsk) {
		mcp.AddTool(s.mcp, askTool, s.ask)
	}
	if reads {
		mcp.AddTool(s.mcp, searchTool, s.search)
		s.mcp.AddResourceTemplate(codexTemplate, s.readCodexFile)
		s.mcp.AddReceivingMiddleware(s.listCodexMiddleware)
	}
	mcp.AddTool(s.mcp, statusTool, s.status)
	log.Info("serving MCP", "sigil", sig.Name, "scopes", sig.Scopes, "authenticated", sig.Authenticated, "codex_resources", reads)
	return s, nil
}

// instructions tells a client what the server is for and what it offers.
func instructions(scopes []string) string {
	var b strings.Builder
	b.WriteString("ctxd builds cache-stable prompts for a local model: the codebase (the codex), the environment and the session's history, in an order that lets the model server reuse its cache from one turn to the next.")
	if slices.Contains(scopes, sigils.ScopeAsk) {
		b.WriteString(" Use ask for questions about the codex; keep one session per conversation so each turn reuses the last one's prompt.")
	}
	if slices.Contains(scopes, sigils.ScopeSearchCodex) {
		b.WriteString(" Use search_codex to find code, and read whole files as ctxd-codex:/// resources.")
	}
	return b.String()
}

// Sigil is the sigil the server's requests act as.
func (s *Server) Sigil() ctxd.SigilInfo { return s.sigil }

// MCP is the go-sdk server behind s, for a transport that serves many
// connections itself (streamable HTTP: mcp.NewStreamableHTTPHandler).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Connect serves one MCP connection over t until the client ends it (see
// mcp.ServerSession.Wait) or it is closed.
func (s *Server) Connect(ctx context.Context, t mcp.Transport) (*mcp.ServerSession, error) {
	return s.mcp.Connect(ctx, t, nil)
}

// Run serves one MCP connection over t until the client ends it or ctx
// ends; either is a clean stop (nil).
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	err := s.mcp.Run(ctx, t)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return nil
	}
	return err
}

// defaultSession is the ask session of a connection that names none: one
// per connection, made on first use. Connections that have ended are
// forgotten then.
func (s *Server) defaultSession(ss *mcp.ServerSession) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.sessions[ss]; ok {
		return id
	}
	live := map[*mcp.ServerSession]bool{}
	for x := range s.mcp.Sessions() {
		live[x] = true
	}
	maps.DeleteFunc(s.sessions, func(x *mcp.ServerSession, _ string) bool { return !live[x] })
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := "mcp-" + hex.EncodeToString(b)
	if ss != nil {
		s.sessions[ss] = id
	}
	s.log.Info("new default session", "session", id)
	return id
}

// describe turns a daemon error into a message for the agent: the
// daemon's own message, with its kind and status.
func describe(err error) string {
	var ae *client.APIError
	var ce *ctxd.Error
	switch {
	case errors.As(err, &ae):
		kind := string(ae.Kind)
		if kind == "" {
			kind = "error"
		}
		return fmt.Sprintf("%s [%s, HTTP %d]", ae.Message, kind, ae.Status)
	case errors.As(err, &ce):
		return fmt.Sprintf("%s [%s, HTTP %d]", ce.Error(), ce.Kind, ce.Kind.Status())
	}
	return err.Error()
}
