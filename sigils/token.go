package sigils

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// TokenPrefix starts every token, so a token is recognisable in a
// configuration or a leaked log line.
const TokenPrefix = "ctxd_"

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

func decodeHash(name, field, hash string) ([]byte, error) {
	b, err := hex.DecodeString(hash)
	if err != nil || len(b) != sha256.Size || strings.ToLower(hash) != hash {
		return nil, fmt.Errorf("sigils: %s: %s must be 64 lowercase hex digits (the line `ctxd sigil add` prints)", name, field)
	}
	return b, nil
}

// HasTokens reports whether any sigil has a token.
func (r *Registry) HasTokens() bool { return len(r.t.Load().tokens) > 0 }

// Authenticate returns the sigil whose token this is. Every configured
// hash, current and revoked, is compared in constant time, whichever
// matches, so the time taken says nothing about which. A revoked token is
// an error wrapping ErrRevoked that names its sigil; a token of a revoked
// sigil too; any other is ErrBadToken. The token itself never appears in
// an error.
func (r *Registry) Authenticate(token string) (runcontext.Sigil, error) {
	return r.t.Load().authenticate(token)
}

func (r *table) authenticate(token string) (runcontext.Sigil, error) {
	token = strings.TrimSpace(token)
	h := sha256.Sum256([]byte(token))
	match, revoked := "", ""
	for name, want := range r.tokens {
		if subtle.ConstantTimeCompare(h[:], want) == 1 {
			match = name
		}
	}
	for key, want := range r.revoked {
		if subtle.ConstantTimeCompare(h[:], want) == 1 {
			revoked, _, _ = strings.Cut(key, "\x00")
		}
	}
	switch {
	case token == "":
		return runcontext.Sigil{}, ErrBadToken
	case match != "":
		return r.resolve(match) // a revoked sigil's current token is refused too
	case revoked != "":
		return runcontext.Sigil{}, fmt.Errorf("%w: the token is one of sigil %q's revoked tokens; ask the operator for a new one (`ctxd sigil token %s`)", ErrRevoked, revoked, revoked)
	}
	return runcontext.Sigil{}, ErrBadToken
}
