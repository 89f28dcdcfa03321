package sigils

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// TokenPrefix starts every token, so a token is recognisable in a
// configuration or a leaked log line.
const TokenPrefix = "ctxd_"

// ErrBadToken is a token no sigil holds: wrong, or revoked.
var ErrBadToken = errors.New("the token matches no sigil (wrong, or revoked)")

// NewToken returns a new random token and the SHA-256 (hex) to configure
// as the sigil's token_sha256. Only the hash is ever stored.
func NewToken() (token, hash string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("sigils: new token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	return token, HashToken(token), nil
}

// HashToken is the SHA-256 of a token, in hex.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// SetToken gives the sigil name the token whose SHA-256 is hash (hex).
func (r *Registry) SetToken(name, hash string) error {
	if _, ok := r.byName[name]; !ok {
		return fmt.Errorf("sigils: token for %q: %w", name, ErrUnknown)
	}
	b, err := hex.DecodeString(hash)
	if err != nil || len(b) != sha256.Size {
		return fmt.Errorf("sigils: %s: token_sha256 must be 64 hex digits", name)
	}
	if r.tokens == nil {
		r.tokens = map[string][]byte{}
	}
	r.tokens[name] = b
	return nil
}

// HasTokens reports whether any sigil has a token.
func (r *Registry) HasTokens() bool { return len(r.tokens) > 0 }

// Authenticate returns the sigil whose token this is. Every configured
// hash is compared, in constant time, whichever matches.
func (r *Registry) Authenticate(token string) (runcontext.Sigil, error) {
	token = strings.TrimSpace(token)
	h := sha256.Sum256([]byte(token))
	match := ""
	for name, want := range r.tokens {
		if subtle.ConstantTimeCompare(h[:], want) == 1 {
			match = name
		}
	}
	if match == "" || token == "" {
		return runcontext.Sigil{}, ErrBadToken
	}
	return r.byName[match], nil
}
