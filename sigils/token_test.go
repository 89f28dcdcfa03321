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
	if err := r.SetToken("coder", hash); err != nil {
		t.Fatal(err)
	}
	s, err := r.Authenticate(tok)
	if err != nil || s.Name != "coder" || !Allows(s, ScopeSearchCodex) {
		t.Fatalf("authenticate: %+v %v", s, err)
	}
	other, _, _ := NewToken()
	for _, bad := range []string{"", other, tok[:len(tok)-1], tok + "x", hash} {
		if _, err := r.Authenticate(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("token %q: %v, want ErrBadToken", bad, err)
		}
	}
	if err := r.SetToken("nobody", hash); !errors.Is(err, ErrUnknown) {
		t.Errorf("token for an unknown sigil: %v", err)
	}
	if err := r.SetToken("coder", "abc"); err == nil {
		t.Error("a short hash was accepted")
	}
}
