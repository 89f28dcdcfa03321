package sigils

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzSigilDefinition defines a sigil of any name and scopes (a space
// separated list) and narrows it to any scopes. The definition is refused
// with an error that names the problem, or the name is one a sigil may
// have (safe in a path, a header, a log line) and the sigil holds exactly
// the scopes asked, sorted and once each, all known; narrowing never
// widens it; and a tool is allowed only by the scopes that allow it.
func FuzzSigilDefinition(f *testing.F) {
	seeds := []struct{ name, scopes, narrow, tool string }{
		{"default", "ask sessions:read sessions:write codex:load", "ask", "grep"},
		{"coder", "ask search_codex tool:grep tool:run_tests", "tool:grep", "Grep"},
		{"all-tools", "ask tools", "tools ask", "anything"},
		{"agent.1", "ask ask ask", "", ""},
		{"Agent", "ask", "ask", "x"},
		{"-x", "ask", "", ""},
		{"../etc", "ask", "", ""},
		{"a", "tool: tool:A root", "", ""},
		{"a", "ask", "admin", ""},
		{"a", "", "ask", "tool:grep"},
	}
	for _, s := range seeds {
		f.Add(s.name, s.scopes, s.narrow, s.tool)
	}
	f.Fuzz(func(t *testing.T, name, scopes, narrow, tool string) {
		asked := strings.Fields(scopes)
		r, err := New(map[string]Def{name: {Scopes: asked}}, name)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "sigils: ") {
				t.Fatalf("%q %q: refused with %v", name, scopes, err)
			}
			return
		}
		if !NameRE.MatchString(name) || name == "." || name == ".." || strings.ContainsAny(name, "/\\ \t\r\n\x00") || strings.HasPrefix(name, "-") {
			t.Fatalf("sigil name %q taken", name)
		}
		s, err := r.Resolve("")
		if err != nil || s.Name != name {
			t.Fatalf("%q: the default resolves to %+v, %v", name, s, err)
		}
		want := slices.Clone(asked)
		slices.Sort(want)
		want = slices.Compact(want)
		if !slices.Equal(s.Scopes, want) {
			t.Fatalf("%q %q: holds %q, want %q", name, scopes, s.Scopes, want)
		}
		for _, sc := range s.Scopes {
			if CheckScope(sc) != nil {
				t.Fatalf("%q: holds unknown scope %q", name, sc)
			}
		}
		n, err := Narrow(s, strings.Fields(narrow))
		if err != nil {
			if !errors.Is(err, ErrScope) {
				t.Fatalf("narrow %q to %q: %v", s.Scopes, narrow, err)
			}
		} else {
			for _, sc := range n.Scopes {
				if !Allows(s, sc) {
					t.Fatalf("narrowing %q to %q widens it to %q", s.Scopes, narrow, n.Scopes)
				}
			}
			if !slices.IsSorted(n.Scopes) {
				t.Fatalf("narrowed scopes %q are not sorted", n.Scopes)
			}
		}
		if AllowsTool(s, tool) != (slices.Contains(s.Scopes, ScopeTools) || slices.Contains(s.Scopes, ScopeToolPrefix+strings.ToLower(tool))) {
			t.Fatalf("%q allows tool %q: %v", s.Scopes, tool, AllowsTool(s, tool))
		}
	})
}

// FuzzAuthenticate presents any string as a token to sigils with tokens,
// revoked tokens and a revoked sigil. It authenticates exactly when it is
// (but for surrounding white space) a current token of a sigil that is not
// revoked, as that sigil; a revoked one is refused as revoked; and no
// error repeats the token.
func FuzzAuthenticate(f *testing.F) {
	const (
		good  = "ctxd_good-token-0123456789abcdefghijklmnopqrstu"
		old   = "ctxd_old-token-0123456789abcdefghijklmnopqrstuv"
		gone  = "ctxd_gone-token-0123456789abcdefghijklmnopqrst"
		other = "ctxd_other-token-0123456789abcdefghijklmnopqrs"
	)
	r, err := New(map[string]Def{
		"default": {Scopes: []string{ScopeAsk}},
		"agent":   {Scopes: []string{ScopeAsk}, TokenSHA256: HashToken(good), RevokedSHA256: []string{HashToken(old)}},
		"gone":    {Scopes: []string{ScopeAsk}, TokenSHA256: HashToken(gone), Revoked: true},
		"other":   {Scopes: []string{ScopeAsk, ScopeSearchCodex}, TokenSHA256: HashToken(other)},
	}, "default")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{good, " " + good + "\n", old, gone, other, "", "ctxd_", good[:len(good)-1], strings.ToUpper(good), HashToken(good)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		s, err := r.Authenticate(token)
		bare := strings.TrimSpace(token)
		if err != nil {
			if len(bare) >= 8 && strings.Contains(err.Error(), bare) {
				t.Fatalf("the error repeats the token %q: %v", token, err)
			}
		}
		switch bare {
		case good, other:
			want := map[string]string{good: "agent", other: "other"}[bare]
			if err != nil || s.Name != want {
				t.Fatalf("%q: %+v, %v; want sigil %s", token, s, err, want)
			}
		case old, gone:
			if !errors.Is(err, ErrRevoked) {
				t.Fatalf("%q: %+v, %v; want it refused as revoked", token, s, err)
			}
		default:
			if !errors.Is(err, ErrBadToken) {
				t.Fatalf("%q: %+v, %v; want it refused as no sigil's", token, s, err)
			}
		}
	})
}
