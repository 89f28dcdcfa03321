package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/frontdoor"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// authKey is the request context's key of the sigil a request acts as
// without naming it: the one its token authenticated (an authInfo).
type authKey struct{}

// authInfo is the sigil a request is bound to. byToken is false for a
// request of the daemon's own MCP endpoint made in process for a client
// on the socket that had no token (it is bound to the sigil it named).
type authInfo struct {
	name    string
	byToken bool
	// token is the request's token, checked again by sigilFor: a stream
	// that outlives a reload (a WebSocket, an MCP session) loses its
	// sigil's authority when the reload revokes the token.
	token string
	// dashboard: the token is a dashboard token (it opens the dashboard
	// only, and expires).
	dashboard bool
}

// authenticated is the name of the sigil the request is bound to (its
// token's), or "".
func authenticated(r *http.Request) string {
	a, _ := r.Context().Value(authKey{}).(authInfo)
	return a.name
}

// byToken reports whether a token authenticated the request's sigil.
func byToken(r *http.Request) bool {
	a, _ := r.Context().Value(authKey{}).(authInfo)
	return a.byToken
}

// authenticate checks a request's sigil token (Authorization: Bearer). A
// token that matches no sigil is refused, wherever it arrives. A request
// without one is refused where tokens are required (the TCP listener),
// but for the health check and Ollama's "is it running" probe; on the Unix
// socket it acts as the sigil it names, trusted as the socket's owner.
// Errors have the shape of the door the path belongs to.
//
// A client that cannot send a header (the ollama CLI) may put the token in
// its base URL instead: /t/TOKEN/api/chat is /api/chat with that token.
func (srv *Server) authenticate(next http.Handler, required bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, pathTok, inPath := tokenInPath(r)
		tok, has := bearer(r)
		if inPath {
			if has {
				writeErrorFor(w, r, ctxd.Errorf(ctxd.KindInvalid, "a token in both the path and the Authorization header: send one"))
				return
			}
			tok, has = pathTok, true
		}
		if !has {
			open := r.URL.Path == "/v1/health" || r.URL.Path == "/"
			if required && !open {
				w.Header().Set("WWW-Authenticate", `Bearer realm="ctxd"`)
				// Closed after the refusal: its body is never read, and
				// the connection does not wait for it.
				w.Header().Set("Connection", "close")
				writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnauthorized,
					"this listener needs a sigil's token on every request: send Authorization: Bearer <token> (an operator makes one with `ctxd sigil token NAME`)"))
				return
			}
			if !required {
				connAuthenticated(r) // the socket: its peer is its owner's (0600), checked against the sigil it names
			}
			next.ServeHTTP(w, r)
			return
		}
		if strings.HasPrefix(tok, dashboard.TokenPrefix) {
			srv.authenticateDashboard(next, w, r, tok)
			return
		}
		s, err := srv.cfg.Sigils.Authenticate(tok)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ctxd", error="invalid_token"`)
			why := "wrong"
			if errors.Is(err, sigils.ErrRevoked) {
				why = "revoked"
			}
			srv.log.WarnContext(r.Context(), "request refused: token", "why", why, "path", r.URL.Path) // never the token
			w.Header().Set("Connection", "close")
			writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnauthorized, "Authorization: %v", err))
			return
		}
		connAuthenticated(r)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), authKey{}, authInfo{name: s.Name, byToken: true, token: tok})))
	})
}

// authenticateDashboard serves a request that carries a dashboard token:
// on the dashboard's paths, as the token's sigil; anywhere else, or with
// a token expired or unknown, it is refused.
func (srv *Server) authenticateDashboard(next http.Handler, w http.ResponseWriter, r *http.Request, tok string) {
	g, ok := srv.dashTokens.Check(tok, time.Now())
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ctxd", error="invalid_token"`)
		w.Header().Set("Connection", "close")
		srv.log.WarnContext(r.Context(), "request refused: token", "why", "dashboard token unknown or expired", "path", r.URL.Path)
		writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnauthorized, "Authorization: the dashboard token is unknown or has expired (a token lives %v after its last use); run `ctxd dashboard` for a new address", dashboard.TokenIdle))
		return
	}
	if !isDashboardPath(r.URL.Path) {
		writeErrorFor(w, r, ctxd.Errorf(ctxd.KindForbidden, "a dashboard token opens the dashboard only (/dashboard/ and /v1/dashboard/events), not %s", r.URL.Path))
		return
	}
	connAuthenticated(r)
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), authKey{}, authInfo{name: g.Sigil, byToken: true, token: tok, dashboard: true})))
}

// dashboardGrant checks again a dashboard token a stream opened with: it
// must not have expired, and the sigil token that made it, if one did,
// must still hold (a reload may have revoked it). It returns what the
// token grants.
func (srv *Server) dashboardGrant(a authInfo) (dashboard.Grant, error) {
	g, ok := srv.dashTokens.Check(a.token, time.Now())
	if !ok {
		return g, ctxd.Errorf(ctxd.KindUnauthorized, "the dashboard token has expired (a token lives %v after its last use, %v at most); run `ctxd dashboard` for a new address", dashboard.TokenIdle, dashboard.TokenMax)
	}
	if g.Issuer != "" {
		s, err := srv.cfg.Sigils.Authenticate(g.Issuer)
		if err == nil && s.Name != g.Sigil {
			err = fmt.Errorf("it now belongs to sigil %q", s.Name)
		}
		if err != nil {
			return g, ctxd.Errorf(ctxd.KindUnauthorized, "the sigil token this dashboard token was made with no longer holds: %v", err)
		}
	}
	return g, nil
}

// tokenPathPrefix starts a path that carries a token: /t/TOKEN/...
const tokenPathPrefix = "/t/"

// tokenInPath takes a token off the front of the path (/t/TOKEN/rest is
// /rest), so that neither routing nor any error message sees it.
func tokenInPath(r *http.Request) (*http.Request, string, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, tokenPathPrefix)
	if !ok {
		return r, "", false
	}
	tok, path, _ := strings.Cut(rest, "/")
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = "/"+path, ""
	r2.RequestURI = r2.URL.RequestURI()
	return r2, tok, true
}

// bearer is the request's bearer token, if it sends one.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false
	}
	scheme, tok, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", true // present but not a bearer token: refused as matching no sigil
	}
	return strings.TrimSpace(tok), true
}

// peerKey is the request context's key of the Unix socket peer's
// credentials (a sigils.Peer), set per connection.
type peerKey struct{}

// withPeer is the socket server's ConnContext: it reads the connecting
// process's credentials once per connection.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	if p, ok := peerOf(c); ok {
		return context.WithValue(ctx, peerKey{}, p)
	}
	return ctx
}

// peer is the socket peer of a request, if it came over the Unix socket.
func peer(r *http.Request) (sigils.Peer, bool) {
	p, ok := r.Context().Value(peerKey{}).(sigils.Peer)
	return p, ok
}

// actor is the sigil a request acts as, checked, resolved and narrowed
// once: the one its token authenticated, which a request may not exchange
// for another, else the one it names ("" for the default). The sigil must
// exist and not be revoked, and a socket peer must be one the sigil allows
// (its uids and gids); each refusal is an error of kind KindForbidden (or
// KindUnauthorized for a token that no longer holds) that says why. Its
// scopes are narrowed to those the request asks for (requestScopes), never
// widened. Handlers pass the value down; nothing below resolves it again.
func (srv *Server) actor(r *http.Request, named string) (runcontext.Sigil, error) {
	return srv.actorScoped(r, named, requestScopes(r))
}

// actorScoped is actor narrowed to scopes instead of the request's.
func (srv *Server) actorScoped(r *http.Request, named string, scopes []string) (runcontext.Sigil, error) {
	name := named
	a, _ := r.Context().Value(authKey{}).(authInfo)
	var grant []string // a dashboard token's scopes
	switch {
	case a.dashboard:
		g, err := srv.dashboardGrant(a)
		if err != nil {
			return runcontext.Sigil{}, err
		}
		grant = g.Scopes
	case a.token != "":
		if err := srv.stillHolds(a, "connection"); err != nil {
			return runcontext.Sigil{}, err
		}
	}
	if auth := authenticated(r); auth != "" {
		if named != "" && named != auth {
			return runcontext.Sigil{}, ctxd.Errorf(ctxd.KindForbidden, "the token is sigil %q's; it may not act as sigil %q", auth, named)
		}
		name = auth
	}
	s, err := srv.cfg.Sigils.Resolve(name)
	if err != nil {
		return runcontext.Sigil{}, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
	}
	if p, ok := peer(r); ok {
		if err := srv.cfg.Sigils.CheckPeer(s.Name, p); err != nil {
			srv.log.WarnContext(r.Context(), "request refused: socket peer not allowed", "sigil", s.Name, "uid", p.UID, "gid", p.GID, "pid", p.PID)
			return runcontext.Sigil{}, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
		}
	}
	if s, err = sigils.Narrow(s, scopes); err != nil {
		return s, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
	}
	if grant != nil {
		// What the token was made with, of what the sigil holds now: a
		// sigil whose scopes a reload cut sees less, never more.
		s.Scopes = slices.DeleteFunc(slices.Clone(s.Scopes), func(sc string) bool { return !slices.Contains(grant, sc) })
		if len(s.Scopes) == 0 {
			return s, ctxd.Errorf(ctxd.KindForbidden, "sigil %q no longer holds any of the scopes its dashboard token was made with (%s)", s.Name, strings.Join(grant, " "))
		}
	}
	return s, nil
}

// stillHolds checks a's token again: a reload may have revoked it, or
// given it to another sigil, since the stream that carries it (what: a
// connection, an MCP session) began.
func (srv *Server) stillHolds(a authInfo, what string) error {
	s, err := srv.cfg.Sigils.Authenticate(a.token)
	if err == nil && s.Name != a.name {
		err = fmt.Errorf("it now belongs to sigil %q", s.Name)
	}
	if err != nil {
		return ctxd.Errorf(ctxd.KindUnauthorized, "the token this %s began with no longer holds: %v", what, err)
	}
	return nil
}

// doorSigil is the sigil a door's request acts as: its token's, else the
// one its X-Ctxd-Sigil header names, narrowed as every request is.
func (srv *Server) doorSigil(r *http.Request) (runcontext.Sigil, error) {
	return srv.actor(r, r.Header.Get("X-Ctxd-Sigil"))
}

// requestScopes is the scopes a request narrows its sigil to, by one rule
// on every door: the X-Ctxd-Scopes header, else the scopes query
// parameter; none means the sigil's own.
func requestScopes(r *http.Request) []string {
	v := r.Header.Get("X-Ctxd-Scopes")
	if v == "" {
		v = r.URL.Query().Get("scopes")
	}
	return sigils.ParseScopes(v)
}

// requireScope is nil when s holds scope, else an error of kind
// KindForbidden naming both.
func requireScope(s runcontext.Sigil, scope string) error {
	if sigils.Allows(s, scope) {
		return nil
	}
	return ctxd.Errorf(ctxd.KindForbidden, "sigil %q lacks the %q scope (it holds %s)", s.Name, scope, strings.Join(s.Scopes, " "))
}

// writeErrorFor answers with err in the shape of the path's door.
func writeErrorFor(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case frontdoor.IsOpenAIPath(r.URL.Path):
		frontdoor.WriteOpenAIError(w, err)
	case frontdoor.IsOllamaPath(r.URL.Path):
		frontdoor.WriteOllamaError(w, err)
	default:
		writeError(w, err)
	}
}
