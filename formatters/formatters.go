package formatters

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ctxd/ctxd/runcontext"
)

// Injector adds one text to one block of every RunContext: an artifact
// injector. Name, Block and Stable are read once, when it is registered.
type Injector interface {
	// Name names the injector: unique in a registry, it matches
	// runcontext.FormatterNameRE and orders the artifacts of a block.
	Name() string
	// Block is the block the text joins: one of runcontext.BlockIdentity
	// to runcontext.BlockKarma for a stable injector,
	// runcontext.BlockQuery for a volatile one.
	Block() int
	// Stable says whether the text joins the cached prefix. A stable
	// injector's text must depend only on what changes seldom (the codex,
	// the sigil), or every change breaks the backend's cache from its
	// block on; a volatile one's text is the query's only, and the
	// conversation does not keep it.
	Stable() bool
	// Inject returns the text for the RunContext in, or "" for none. It
	// may be called from several goroutines at once.
	Inject(ctx context.Context, in Input) (string, error)
}

// Input is what an injector may read.
type Input struct {
	// RunContext is the request being built, as it stands before any
	// artifact is added: read it, never modify it or anything it points
	// to (the caller and the other injectors share it).
	RunContext *runcontext.RunContext
	// CodexFile reads a file of the loaded codex by its slash-separated
	// path relative to the codex root. A file the codex does not hold is
	// an error that wraps fs.ErrNotExist. nil when no codex is loaded.
	CodexFile func(path string) (string, error)
	// CodexFingerprint changes whenever the codex's content changes: an
	// injector that reads the codex may cache what it read on it. "" when
	// no codex is loaded or its fingerprint is unknown: then it may not.
	CodexFingerprint string
}

// Registry holds injectors and prompt formats. It is safe for concurrent
// use. The zero value is not usable: call NewRegistry.
type Registry struct {
	mu        sync.RWMutex
	injectors []registered           // guarded by mu; sorted by name
	formats   map[string]FormatMaker // guarded by mu
}

// registered is an injector with what it said of itself at registration.
type registered struct {
	inj    Injector
	name   string
	block  int
	stable bool
}

// NewRegistry returns a registry with no injectors and the core's
// formats, "plain" and "template" (see RegisterFormat).
func NewRegistry() *Registry {
	r := &Registry{formats: map[string]FormatMaker{}}
	r.formats[FormatPlain] = newPlain
	r.formats[FormatTemplate] = newTemplate
	return r
}

// Register adds an injector. A name that is invalid or taken, a block
// that is not one, a stable injector for the state or query block and a
// volatile one for any block but the query are errors.
func (r *Registry) Register(inj Injector) error {
	if inj == nil {
		return errors.New("formatters: register: nil injector")
	}
	reg := registered{inj: inj, name: inj.Name(), block: inj.Block(), stable: inj.Stable()}
	if err := runcontext.CheckArtifact(reg.name, reg.block, reg.stable); err != nil {
		return fmt.Errorf("formatters: register %q: %w", reg.name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, found := slices.BinarySearchFunc(r.injectors, reg.name, func(e registered, name string) int { return strings.Compare(e.name, name) })
	if found {
		return fmt.Errorf("formatters: register %q: an injector of that name is registered already", reg.name)
	}
	r.injectors = slices.Insert(slices.Clone(r.injectors), i, reg) // a copy: Apply may be reading the old one
	return nil
}

// Injectors names the registered injectors, sorted.
func (r *Registry) Injectors() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, len(r.injectors))
	for i, e := range r.injectors {
		names[i] = e.name
	}
	return names
}

// Apply runs every injector, in name order, on in and returns their
// artifacts, ready for in.RunContext.Artifacts (which it does not touch).
// An injector that fails (or panics, or returns text that is not valid
// UTF-8 or holds a NUL byte) adds nothing; its error, prefixed with its
// name, is returned joined with the others' alongside the artifacts of
// those that did not fail: the caller decides whether that fails the
// request. Apply stops, returning ctx's error, when ctx ends.
func (r *Registry) Apply(ctx context.Context, in Input) ([]runcontext.Artifact, error) {
	r.mu.RLock()
	injectors := r.injectors // never modified in place: Register replaces it
	r.mu.RUnlock()
	var arts []runcontext.Artifact
	var errs []error
	for _, e := range injectors {
		if err := ctx.Err(); err != nil {
			return arts, context.Cause(ctx)
		}
		text, err := inject(ctx, e.inj, in)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("formatters: %s: %w", e.name, err))
		case strings.TrimSpace(text) == "":
		case !utf8.ValidString(text) || strings.IndexByte(text, 0) >= 0:
			errs = append(errs, fmt.Errorf("formatters: %s: its text is not valid UTF-8 or holds a NUL byte", e.name))
		default:
			arts = append(arts, runcontext.Artifact{Formatter: e.name, Block: e.block, Stable: e.stable, Text: text})
		}
	}
	return arts, errors.Join(errs...)
}

// inject runs one injector, turning a panic into an error: an extension's
// bug fails its own text, not the daemon.
func inject(ctx context.Context, inj Injector, in Input) (text string, err error) {
	defer func() {
		if p := recover(); p != nil {
			text, err = "", fmt.Errorf("panic: %v", p)
		}
	}()
	return inj.Inject(ctx, in)
}
