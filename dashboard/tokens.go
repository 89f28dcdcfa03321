package dashboard

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"sync"
	"time"
)

// TokenPrefix starts every dashboard token, so that the daemon tells them
// from sigils' tokens without looking either up.
const TokenPrefix = "ctxd-dash-"

// Token lifetimes: a token not used for TokenIdle expires, and none lives
// past TokenMax (a page held open that long opens again with a new one).
// A sigil holds at most maxTokensPerSigil; a new one past that retires its
// oldest.
const (
	TokenIdle         = 15 * time.Minute
	TokenMax          = 12 * time.Hour
	maxTokensPerSigil = 16
)

// Tokens are short-lived tokens that open the dashboard, and only the
// dashboard, as a sigil: what `ctxd dashboard` puts in the address it
// prints, so that a browser (which sends no Authorization header) can open
// the page without a long-lived sigil token in its history. Only their
// hashes are kept.
type Tokens struct {
	mu sync.Mutex
	by map[[32]byte]*issued
}

type issued struct {
	Grant
	born    time.Time
	expires time.Time
}

// Grant is what a token opens the dashboard as: a sigil, narrowed to
// Scopes when the request that made it narrowed its own (none: the
// sigil's, whatever they are when the page reads), and the sigil token
// that made it ("" for a request on the socket without one), which must
// still hold for it to.
type Grant struct {
	Sigil  string
	Scopes []string
	Issuer string
}

// NewTokens is an empty set.
func NewTokens() *Tokens { return &Tokens{by: map[[32]byte]*issued{}} }

// Issue makes a token of g, valid from now for TokenIdle after each use
// and TokenMax at most; it returns the token and when it expires if not
// used.
func (t *Tokens) Issue(g Grant, now time.Time) (string, time.Time, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", time.Time{}, err
	}
	tok := TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sweep(now)
	var oldest [32]byte
	n := 0
	for h, is := range t.by {
		if is.Sigil != g.Sigil {
			continue
		}
		if n++; n == 1 || is.born.Before(t.by[oldest].born) {
			oldest = h
		}
	}
	if n >= maxTokensPerSigil {
		delete(t.by, oldest)
	}
	is := &issued{Grant: g, born: now, expires: now.Add(TokenIdle)}
	t.by[sha256.Sum256([]byte(tok))] = is
	return tok, is.expires, nil
}

// Check is what tok opens the dashboard as, and true; or false for a
// token unknown, expired or not a dashboard token. A good token's idle
// expiry moves to TokenIdle from now (an open page keeps its token alive).
func (t *Tokens) Check(tok string, now time.Time) (Grant, bool) {
	if !strings.HasPrefix(tok, TokenPrefix) {
		return Grant{}, false
	}
	h := sha256.Sum256([]byte(tok))
	t.mu.Lock()
	defer t.mu.Unlock()
	is, ok := t.by[h]
	if !ok {
		return Grant{}, false
	}
	if !now.Before(is.expires) || !now.Before(is.born.Add(TokenMax)) {
		delete(t.by, h)
		return Grant{}, false
	}
	is.expires = now.Add(TokenIdle)
	return is.Grant, true
}

// sweep forgets expired tokens. Called with the lock held.
func (t *Tokens) sweep(now time.Time) {
	for h, is := range t.by {
		if !now.Before(is.expires) || !now.Before(is.born.Add(TokenMax)) {
			delete(t.by, h)
		}
	}
}
