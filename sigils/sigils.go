package sigils

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// Scopes ctxd knows about.
const (
	ScopeAsk         = "ask"          // may send queries
	ScopeSearchCodex = "search_codex" // may be offered the codex search tool
	ScopeTools       = "tools"        // may offer the model any of its client's tools
	ScopeToolPrefix  = "tool:"        // tool:NAME: may offer the model the client's tool NAME
)

// ErrUnknown is returned for a sigil the registry does not hold.
var ErrUnknown = errors.New("unknown sigil")

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	scopeRE = regexp.MustCompile(`^[a-z][a-z0-9_.:-]{0,63}$`)
)

// Registry holds the configured sigils.
type Registry struct {
	byName map[string]runcontext.Sigil
	def    string
	tokens map[string][]byte // sigil name to the SHA-256 of its token
}

// NewRegistry validates the configured sigils (name to scopes) and the
// default sigil used when a request names none.
func NewRegistry(sigils map[string][]string, def string) (*Registry, error) {
	r := &Registry{byName: map[string]runcontext.Sigil{}, def: def}
	for name, scopes := range sigils {
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("sigils: name %q must match %s", name, nameRE)
		}
		s := slices.Clone(scopes)
		slices.Sort(s)
		s = slices.Compact(s)
		for _, sc := range s {
			if !scopeRE.MatchString(sc) {
				return nil, fmt.Errorf("sigils: %s: scope %q must match %s", name, sc, scopeRE)
			}
		}
		r.byName[name] = runcontext.Sigil{Name: name, Scopes: s}
	}
	if _, ok := r.byName[def]; !ok {
		return nil, fmt.Errorf("sigils: default sigil %q is not configured", def)
	}
	return r, nil
}

// Resolve returns the sigil named, or the default for "". A sigil without
// the ask scope may not send queries.
func (r *Registry) Resolve(name string) (runcontext.Sigil, error) {
	if name == "" {
		name = r.def
	}
	s, ok := r.byName[name]
	if !ok {
		return runcontext.Sigil{}, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	return s, nil
}

// Allows reports whether s holds scope.
func Allows(s runcontext.Sigil, scope string) bool {
	_, found := slices.BinarySearch(s.Scopes, scope)
	return found
}

// AllowsTool reports whether s may offer the model its client's tool
// name: the tools scope, or tool:NAME (the name lowercased, as scopes are).
func AllowsTool(s runcontext.Sigil, name string) bool {
	return Allows(s, ScopeTools) || Allows(s, ScopeToolPrefix+strings.ToLower(name))
}
