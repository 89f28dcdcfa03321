package sigils

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// Scopes ctxd knows about. A sigil may hold only these (and tool:NAME).
const (
	ScopeAsk         = "ask"            // may send queries
	ScopeSearchCodex = "search_codex"   // may be offered the codex search tool, and read codex files
	ScopeTools       = "tools"          // may offer the model any of its client's tools
	ScopeToolPrefix  = "tool:"          // tool:NAME: may offer the model the client's tool NAME
	ScopeKarmaRead   = "karma:read"     // may list and read its own traces
	ScopeKarmaWrite  = "karma:write"    // may verify, reject, pin and supersede its own traces
	ScopeSessRead    = "sessions:read"  // may list and read its own sessions and their last prompts
	ScopeSessWrite   = "sessions:write" // may delete its own sessions
	ScopeCodexLoad   = "codex:load"     // may load a codex (from the operator's allowed roots)
	ScopeAdmin       = "admin"          // may change the log level and reload the configuration
)

// Known is every scope a sigil may hold, tool:NAME aside.
var Known = []string{ScopeAdmin, ScopeAsk, ScopeCodexLoad, ScopeKarmaRead, ScopeKarmaWrite, ScopeSearchCodex, ScopeSessRead, ScopeSessWrite, ScopeTools}

// All is every scope but the tool scopes: what the default sigil of a
// configuration without sigils holds (a local single-user setup).
var All = []string{ScopeAdmin, ScopeAsk, ScopeCodexLoad, ScopeKarmaRead, ScopeKarmaWrite, ScopeSearchCodex, ScopeSessRead, ScopeSessWrite}

// Presets are named sets of scopes (`ctxd sigil add NAME --preset P`):
// "agent" is what a coding agent on the OpenAI or Ollama door needs (ask,
// offer its own tools, search the codex, read its own sessions and
// karma); "ask" only asks.
var Presets = map[string][]string{
	"agent": {ScopeAsk, ScopeKarmaRead, ScopeSearchCodex, ScopeSessRead, ScopeTools},
	"ask":   {ScopeAsk},
}

// Errors callers branch on.
var (
	ErrUnknown  = errors.New("unknown sigil")
	ErrRevoked  = errors.New("sigil revoked")
	ErrScope    = errors.New("scope not held")
	ErrPeer     = errors.New("peer not allowed")
	ErrBadToken = errors.New("the token matches no sigil (wrong, or revoked)")
)

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	toolNameRE = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)
)

// NameRE is what a sigil's name must look like.
var NameRE = nameRE

// Def is one sigil as the operator configures it.
type Def struct {
	Description string
	Scopes      []string
	// TokenSHA256 is the SHA-256 (hex) of its token; "" for none.
	TokenSHA256 string
	// RevokedSHA256 are hashes of its former tokens: one presented is
	// refused as revoked (rather than as wrong), so its holder learns why.
	RevokedSHA256 []string
	// UIDs and GIDs, when set, are the Unix socket peers that may act as
	// the sigil: the peer's uid must be in UIDs (if set) and its gid in
	// GIDs (if set). Requests over TCP carry a token instead.
	UIDs []int
	GIDs []int
	// Revoked refuses every request that acts as the sigil.
	Revoked bool
}

// entry is a configured sigil.
type entry struct {
	sigil       runcontext.Sigil
	description string
	uids, gids  []int
	revoked     bool
}

// Registry holds the configured sigils. It is safe for concurrent use;
// Replace swaps in a reloaded configuration at once.
type Registry struct {
	t atomic.Pointer[table]
}

// table is one configuration of sigils, read-only once built.
type table struct {
	byName  map[string]entry
	defs    map[string]Def
	def     string
	tokens  map[string][]byte // sigil name to the SHA-256 of its token
	revoked map[string][]byte // "name\x00hex" of each revoked token to its raw hash
}

// Replace makes r hold from's sigils: every request checked after it
// returns sees them, and none sees a mix of the two.
func (r *Registry) Replace(from *Registry) { r.t.Store(from.t.Load()) }

// Defs is the configuration of every sigil, by name (callers must not
// change it).
func (r *Registry) Defs() map[string]Def { return r.t.Load().defs }

// NewRegistry is New for sigils that have only scopes.
func NewRegistry(scopes map[string][]string, def string) (*Registry, error) {
	defs := make(map[string]Def, len(scopes))
	for name, s := range scopes {
		defs[name] = Def{Scopes: s}
	}
	return New(defs, def)
}

// New validates the configured sigils and the default sigil used when a
// request names none.
func New(defs map[string]Def, def string) (*Registry, error) {
	r := &table{byName: map[string]entry{}, defs: maps.Clone(defs), def: def, tokens: map[string][]byte{}, revoked: map[string][]byte{}}
	for name, d := range defs {
		if !nameRE.MatchString(name) {
			return nil, fmt.Errorf("sigils: name %q must match %s", name, nameRE)
		}
		s := slices.Clone(d.Scopes)
		slices.Sort(s)
		s = slices.Compact(s)
		for _, sc := range s {
			if err := CheckScope(sc); err != nil {
				return nil, fmt.Errorf("sigils: %s: %w", name, err)
			}
		}
		for _, id := range append(slices.Clone(d.UIDs), d.GIDs...) {
			if id < 0 {
				return nil, fmt.Errorf("sigils: %s: uid/gid %d must not be negative", name, id)
			}
		}
		r.byName[name] = entry{sigil: runcontext.Sigil{Name: name, Scopes: s}, description: d.Description,
			uids: slices.Clone(d.UIDs), gids: slices.Clone(d.GIDs), revoked: d.Revoked}
		if d.TokenSHA256 != "" {
			b, err := decodeHash(name, "token_sha256", d.TokenSHA256)
			if err != nil {
				return nil, err
			}
			r.tokens[name] = b
		}
		for _, h := range d.RevokedSHA256 {
			b, err := decodeHash(name, "revoked_sha256", h)
			if err != nil {
				return nil, err
			}
			if h == d.TokenSHA256 {
				return nil, fmt.Errorf("sigils: %s: its token_sha256 is also in revoked_sha256", name)
			}
			r.revoked[name+"\x00"+h] = b
		}
	}
	if _, ok := r.byName[def]; !ok {
		return nil, fmt.Errorf("sigils: default sigil %q is not configured", def)
	}
	reg := &Registry{}
	reg.t.Store(r)
	return reg, nil
}

// CheckScope is nil for a scope ctxd knows: one of Known, or tool:NAME.
func CheckScope(sc string) error {
	if tool, ok := strings.CutPrefix(sc, ScopeToolPrefix); ok {
		if !toolNameRE.MatchString(tool) {
			return fmt.Errorf("scope %q: the tool name must match %s", sc, toolNameRE)
		}
		return nil
	}
	if !slices.Contains(Known, sc) {
		return fmt.Errorf("scope %q is not one ctxd knows (%s, or tool:NAME)", sc, strings.Join(Known, ", "))
	}
	return nil
}

// Resolve returns the sigil named, or the default for "". A revoked sigil
// is an error wrapping ErrRevoked; an unknown one wraps ErrUnknown.
func (r *Registry) Resolve(name string) (runcontext.Sigil, error) { return r.t.Load().resolve(name) }

func (r *table) resolve(name string) (runcontext.Sigil, error) {
	if name == "" {
		name = r.def
	}
	e, ok := r.byName[name]
	if !ok {
		return runcontext.Sigil{}, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	if e.revoked {
		return runcontext.Sigil{}, fmt.Errorf("%w: sigil %q is revoked by the operator (sigils.%s.revoked)", ErrRevoked, name, name)
	}
	return e.sigil, nil
}

// Description is the operator's description of a sigil ("" if none).
func (r *Registry) Description(name string) string { return r.t.Load().byName[name].description }

// Default is the name of the sigil of requests that name none.
func (r *Registry) Default() string { return r.t.Load().def }

// Peer is the credentials of a Unix socket peer (SO_PEERCRED).
type Peer struct {
	PID, UID, GID int
}

// CheckPeer is nil when peer may act as the sigil name: the sigil allows
// any peer (no uids or gids configured), or lists the peer's uid and gid.
func (r *Registry) CheckPeer(name string, peer Peer) error {
	t := r.t.Load()
	if name == "" {
		name = t.def
	}
	e, ok := t.byName[name]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknown, name)
	}
	if len(e.uids) > 0 && !slices.Contains(e.uids, peer.UID) {
		return fmt.Errorf("%w: sigil %q allows uids %v; the socket peer (pid %d) runs as uid %d", ErrPeer, name, e.uids, peer.PID, peer.UID)
	}
	if len(e.gids) > 0 && !slices.Contains(e.gids, peer.GID) {
		return fmt.Errorf("%w: sigil %q allows gids %v; the socket peer (pid %d) runs as gid %d", ErrPeer, name, e.gids, peer.PID, peer.GID)
	}
	return nil
}

// Narrow is s with only the scopes a request asked for: each must be one
// s holds (a request may narrow its sigil's scopes, never widen them).
// Asking for none keeps s as it is.
func Narrow(s runcontext.Sigil, asked []string) (runcontext.Sigil, error) {
	if len(asked) == 0 {
		return s, nil
	}
	want := slices.Clone(asked)
	slices.Sort(want)
	want = slices.Compact(want)
	for _, sc := range want {
		if !Allows(s, sc) {
			return s, fmt.Errorf("%w: the request asks for scope %q, which sigil %q does not hold (it holds %s)",
				ErrScope, sc, s.Name, strings.Join(s.Scopes, " "))
		}
	}
	s.Scopes = want
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

// NotAllowedTools are the names of the client's tools s may not offer
// the model (see AllowsTool), in the order given.
func NotAllowedTools(s runcontext.Sigil, tools []ctxd.Tool) []string {
	var out []string
	for _, t := range tools {
		if !AllowsTool(s, t.Name) {
			out = append(out, t.Name)
		}
	}
	return out
}

// ParseScopes splits a list of scopes as requests send it (the
// X-Ctxd-Scopes header, the scopes parameter): separated by spaces or
// commas. The one parser of every door.
func ParseScopes(v string) []string {
	return strings.FieldsFunc(v, func(c rune) bool { return c == ' ' || c == ',' })
}
