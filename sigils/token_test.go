package sigils

import (
	"errors"
	"strings"
	"testing"
)

func TestTokens(t *testing.T) {
	r, err := NewRegistry(map[string][]string{"default": {"ask"}, "coder": {"ask", "search_codex"}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	if r.HasTokens() {
		t.Fatal("no token configured, yet HasTokens")
	}
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, TokenPrefix) || len(tok) < 40 || HashToken(tok) != hash || strings.Contains(hash, tok) {
		t.Fatalf("token %q hash %q", tok, hash)
	}
	old, oldHash, _ := NewToken()
	r, err = New(map[string]Def{
		"default": {Scopes: []string{"ask"}},
		"coder":   {Scopes: []string{"ask", "search_codex"}, TokenSHA256: hash, RevokedSHA256: []string{oldHash}},
	}, "default")
	if err != nil {
		t.Fatal(err)
	}
	if !r.HasTokens() {
		t.Fatal("a token configured, yet not HasTokens")
	}
	s, err := r.Authenticate(" " + tok + "\n")
	if err != nil || s.Name != "coder" || !Allows(s, ScopeSearchCodex) {
		t.Fatalf("authenticate: %+v %v", s, err)
	}
	other, _, _ := NewToken()
	for _, bad := range []string{"", other, tok[:len(tok)-1], tok + "x", hash} {
		if _, err := r.Authenticate(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("token %q: %v, want ErrBadToken", bad, err)
		}
	}
	_, err = r.Authenticate(old)
	if !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), `"coder"`) || strings.Contains(err.Error(), old) {
		t.Errorf("a revoked token: %v", err)
	}
}
