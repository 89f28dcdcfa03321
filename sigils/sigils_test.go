package sigils

import (
	"errors"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

func TestRegistry(t *testing.T) {
	r, err := NewRegistry(map[string][]string{"default": {"ask"}, "coder": {"search_codex", "ask", "ask"}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Resolve("")
	if err != nil || s.Name != "default" {
		t.Fatalf("default: %+v %v", s, err)
	}
	s, err = r.Resolve("coder")
	if err != nil || len(s.Scopes) != 2 || s.Scopes[0] != "ask" || !Allows(s, ScopeSearchCodex) {
		t.Fatalf("coder: %+v %v", s, err)
	}
	if _, err := r.Resolve("root"); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown sigil: %v", err)
	}
}

func TestRegistryRejectsBadConfig(t *testing.T) {
	bad := []struct {
		name   string
		sigils map[string]Def
		def    string
		want   string
	}{
		{"bad name", map[string]Def{"Bad Name": {Scopes: []string{"ask"}}}, "Bad Name", "must match"},
		{"bad scope", map[string]Def{"a": {Scopes: []string{"Ask!"}}}, "a", "not one ctxd knows"},
		{"unknown scope", map[string]Def{"a": {Scopes: []string{"root"}}}, "a", `scope "root"`},
		{"bad tool scope", map[string]Def{"a": {Scopes: []string{"tool:Grep Files"}}}, "a", "tool name"},
		{"no default", map[string]Def{"a": {Scopes: []string{"ask"}}}, "b", "default sigil"},
		{"bad hash", map[string]Def{"a": {TokenSHA256: "xyz"}}, "a", "token_sha256"},
		{"upper hash", map[string]Def{"a": {TokenSHA256: strings.Repeat("A", 64)}}, "a", "lowercase"},
		{"bad revoked", map[string]Def{"a": {RevokedSHA256: []string{"1"}}}, "a", "revoked_sha256"},
		{"current revoked", map[string]Def{"a": {TokenSHA256: strings.Repeat("a", 64), RevokedSHA256: []string{strings.Repeat("a", 64)}}}, "a", "also in revoked"},
		{"negative uid", map[string]Def{"a": {UIDs: []int{-1}}}, "a", "negative"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			_, err := New(b.sigils, b.def)
			if err == nil || !strings.Contains(err.Error(), b.want) {
				t.Errorf("error %v, want one containing %q", err, b.want)
			}
		})
	}
}

func TestRevokedSigil(t *testing.T) {
	tok, hash, err := NewToken()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(map[string]Def{"default": {Scopes: []string{"ask"}}, "old": {Scopes: []string{"ask"}, TokenSHA256: hash, Revoked: true}}, "default")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Resolve("old"); !errors.Is(err, ErrRevoked) {
		t.Errorf("resolve a revoked sigil: %v", err)
	}
	if _, err := r.Authenticate(tok); !errors.Is(err, ErrRevoked) || !strings.Contains(err.Error(), `"old"`) {
		t.Errorf("the token of a revoked sigil: %v", err)
	}
}

func TestCheckPeer(t *testing.T) {
	r, err := New(map[string]Def{
		"default": {Scopes: []string{"ask"}},
		"ops":     {Scopes: []string{"ask"}, UIDs: []int{1000, 1001}},
		"team":    {Scopes: []string{"ask"}, GIDs: []int{50}},
		"both":    {Scopes: []string{"ask"}, UIDs: []int{1000}, GIDs: []int{50}},
	}, "default")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		sigil string
		peer  Peer
		ok    bool
	}{
		{"", Peer{UID: 4242, GID: 4242}, true}, // no uids configured: any peer
		{"ops", Peer{UID: 1001, GID: 7}, true},
		{"ops", Peer{UID: 0, GID: 0}, false}, // not even root: the list is the list
		{"team", Peer{UID: 9, GID: 50}, true},
		{"team", Peer{UID: 9, GID: 51}, false},
		{"both", Peer{UID: 1000, GID: 51}, false},
		{"both", Peer{UID: 1000, GID: 50}, true},
		{"nobody", Peer{UID: 1000, GID: 50}, false},
	}
	for _, c := range cases {
		err := r.CheckPeer(c.sigil, c.peer)
		if (err == nil) != c.ok {
			t.Errorf("%s as %+v: %v, want ok=%v", c.sigil, c.peer, err, c.ok)
		}
		if err != nil && c.sigil != "nobody" && (!errors.Is(err, ErrPeer) || !strings.Contains(err.Error(), "runs as")) {
			t.Errorf("%s as %+v: error %q does not say which peer", c.sigil, c.peer, err)
		}
	}
}

func TestNarrow(t *testing.T) {
	s := runcontext.Sigil{Name: "coder", Scopes: []string{"ask", "karma:read", "search_codex"}}
	got, err := Narrow(s, []string{"search_codex", "ask", "ask"})
	if err != nil || strings.Join(got.Scopes, " ") != "ask search_codex" {
		t.Errorf("narrowed: %+v %v", got, err)
	}
	if got, err := Narrow(s, nil); err != nil || len(got.Scopes) != 3 {
		t.Errorf("nothing asked: %+v %v", got, err)
	}
	if _, err := Narrow(s, []string{"ask", "karma:write"}); !errors.Is(err, ErrScope) || !strings.Contains(err.Error(), `"karma:write"`) {
		t.Errorf("widening: %v", err)
	}
	if len(s.Scopes) != 3 {
		t.Error("Narrow changed its argument")
	}
}
