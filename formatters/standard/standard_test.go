package standard_test

import (
	"slices"
	"testing"

	"github.com/ctxd/ctxd/formatters/standard"
)

func TestDefault(t *testing.T) {
	t.Parallel()
	r := standard.Default(standard.Options{})
	if got := r.Injectors(); !slices.Equal(got, []string{"conventions", "toolmanifest"}) {
		t.Errorf("injectors %v", got)
	}
	if got := r.Formats(); !slices.Equal(got, []string{"plain", "template"}) {
		t.Errorf("formats %v", got)
	}
	// Each call is a registry of its own.
	if standard.Default(standard.Options{}) == r {
		t.Error("Default returned the same registry twice")
	}
}
