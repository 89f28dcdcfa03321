package daemon

import (
	"context"
	"net/http"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/frontdoor"
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
func (d *Daemon) authenticate(next http.Handler, required bool) http.Handler {
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
				writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnauthorized,
					"this listener needs a sigil's token on every request: send Authorization: Bearer <token> (an operator makes one with `ctxd sigil token NAME`)"))
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		s, err := d.sigils.Authenticate(tok)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ctxd", error="invalid_token"`)
			writeErrorFor(w, r, ctxd.Errorf(ctxd.KindUnauthorized, "Authorization: %v", err))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), authKey{}, authInfo{name: s.Name, byToken: true})))
	})
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

// sigilFor is the sigil a request acts as: the one its token
// authenticated, which a request may not exchange for another, else the
// one it names ("" for the default).
func sigilFor(r *http.Request, named string) (string, error) {
	auth := authenticated(r)
	switch {
	case auth == "":
		return named, nil
	case named == "" || named == auth:
		return auth, nil
	}
	return "", ctxd.Errorf(ctxd.KindForbidden, "the token is sigil %q's; it may not act as sigil %q", auth, named)
}

// doorSigil is the sigil a door's request acts as: its token's, else the
// one its X-Ctxd-Sigil header names.
func doorSigil(r *http.Request) (string, error) {
	return sigilFor(r, r.Header.Get("X-Ctxd-Sigil"))
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
