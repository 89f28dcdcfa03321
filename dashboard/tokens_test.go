package dashboard

import (
	"strings"
	"testing"
	"time"
)

// TestTokens: a token opens as its sigil, slides its idle expiry with
// each use, expires when idle and at its maximum age, and a sigil's 17th
// retires its oldest.
func TestTokens(t *testing.T) {
	ts := NewTokens()
	now := time.Unix(1_000_000, 0)
	tok, exp, err := ts.Issue(Grant{Sigil: "alice"}, now)
	if err != nil || !strings.HasPrefix(tok, TokenPrefix) || !exp.Equal(now.Add(TokenIdle)) {
		t.Fatalf("Issue: %q %v %v", tok, exp, err)
	}
	if g, ok := ts.Check(tok, now.Add(TokenIdle-time.Second)); !ok || g.Sigil != "alice" {
		t.Fatalf("a fresh token: %+v %v", g, ok)
	}
	narrow, _, _ := ts.Issue(Grant{Sigil: "ops", Scopes: []string{"ask"}, Issuer: "ctxd_x"}, now)
	if g, ok := ts.Check(narrow, now); !ok || g.Sigil != "ops" || len(g.Scopes) != 1 || g.Issuer != "ctxd_x" {
		t.Fatalf("a token keeps its grant: %+v %v", g, ok)
	}
	// Used just before expiry, it lives TokenIdle from then.
	if _, ok := ts.Check(tok, now.Add(2*TokenIdle-2*time.Second)); !ok {
		t.Fatal("a used token expired at its first idle expiry")
	}
	if _, ok := ts.Check(tok, now.Add(4*TokenIdle)); ok {
		t.Fatal("an idle token still holds")
	}
	if _, ok := ts.Check(tok, now); ok {
		t.Fatal("an expired token is forgotten, not revived")
	}
	for _, bad := range []string{"", "ctxd-dash-nope", "sk-something"} {
		if _, ok := ts.Check(bad, now); ok {
			t.Errorf("%q opened the dashboard", bad)
		}
	}
	// Kept alive, a token still ends at TokenMax.
	long, _, _ := ts.Issue(Grant{Sigil: "alice"}, now)
	for at := now; at.Before(now.Add(TokenMax)); at = at.Add(TokenIdle / 2) {
		if _, ok := ts.Check(long, at); !ok {
			t.Fatalf("a token in use expired at %v", at.Sub(now))
		}
	}
	if _, ok := ts.Check(long, now.Add(TokenMax)); ok {
		t.Fatal("a token outlived TokenMax")
	}
	first, _, _ := ts.Issue(Grant{Sigil: "bob"}, now)
	for i := range maxTokensPerSigil {
		if _, _, err := ts.Issue(Grant{Sigil: "bob"}, now.Add(time.Duration(i+1)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := ts.Check(first, now.Add(time.Minute)); ok {
		t.Fatalf("bob's oldest token should be retired by his %dth", maxTokensPerSigil+1)
	}
}
