package sigils

import (
	"errors"
	"testing"
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
		sigils map[string][]string
		def    string
	}{
		{map[string][]string{"Bad Name": {"ask"}}, "Bad Name"},
		{map[string][]string{"a": {"Ask!"}}, "a"},
		{map[string][]string{"a": {"ask"}}, "b"},
	}
	for _, b := range bad {
		if _, err := NewRegistry(b.sigils, b.def); err == nil {
			t.Errorf("%v (default %q) accepted", b.sigils, b.def)
		}
	}
}
