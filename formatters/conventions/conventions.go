// Package conventions is the formatter that pins a project's conventions
// file into the identity block: the first of AGENTS.md, CONVENTIONS.md,
// CONTRIBUTING.md and .github/CONTRIBUTING.md that the loaded codex holds
// at its root and that is not blank. It is a stable artifact injector
// (package formatters): the text changes only when the codex does, and it
// reads the file once per codex version (formatters.Input's
// CodexFingerprint).
//
// A file over the size cap is not cut short: the model is told in one
// line that the file exists and how large it is, and Note says why it was
// not pinned. With no codex loaded, or none of the files in it, it adds
// nothing.
package conventions

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/runcontext"
)

// Name is the formatter's name.
const Name = "conventions"

// DefaultMaxBytes is the size cap of a conventions file when Options
// gives none.
const DefaultMaxBytes = 8000

// Files are the files looked for at the codex root, in order: the first
// the codex holds that is not blank wins.
func Files() []string {
	return []string{"AGENTS.md", "CONVENTIONS.md", "CONTRIBUTING.md", ".github/CONTRIBUTING.md"}
}

// Options configure the formatter.
type Options struct {
	// MaxBytes is the largest file pinned whole; a larger one is named,
	// not pinned. 0 means DefaultMaxBytes.
	MaxBytes int
	// Logger hears of a file that is not pinned; nil: nobody does.
	Logger *slog.Logger
}

// Injector is the conventions formatter.
type Injector struct {
	max int
	log *slog.Logger

	mu   sync.Mutex // guards the fields below; held while the codex is read
	fp   string     // the codex fingerprint text and note are for; "" none
	text string
	note string
}

var _ formatters.Injector = (*Injector)(nil)

// New returns the conventions formatter.
func New(o Options) *Injector {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Injector{max: o.MaxBytes, log: o.Logger.With("component", "formatter", "formatter", Name)}
}

// Name is "conventions".
func (*Injector) Name() string { return Name }

// Block is the identity block.
func (*Injector) Block() int { return runcontext.BlockIdentity }

// Stable is true.
func (*Injector) Stable() bool { return true }

// Note says why the last codex read had its conventions file left out (too
// large, not text); "" when it did not.
func (c *Injector) Note() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.note
}

// Inject returns the codex's conventions file under a heading, a line
// saying it is too large, or "". It reads the codex once per
// fingerprint. A read that fails (the file changed since the load: the
// watcher's reload follows) is logged and not remembered, and the last
// text read stands meanwhile, so the identity block, and the whole cached
// prefix after it, does not flicker.
func (c *Injector) Inject(_ context.Context, in formatters.Input) (string, error) {
	if in.CodexFile == nil {
		return "", nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in.CodexFingerprint != "" && in.CodexFingerprint == c.fp {
		return c.text, nil
	}
	text, note, err := c.read(in.CodexFile)
	if err != nil {
		c.log.Warn("conventions file not read; the last one read stands", "err", err)
		return c.text, nil
	}
	if note != "" && note != c.note {
		c.log.Warn("conventions file not pinned", "why", note)
	}
	c.fp, c.text, c.note = in.CodexFingerprint, text, note
	return text, nil
}

// read finds the conventions file and renders it, or a notice and a note.
func (c *Injector) read(file func(string) (string, error)) (text, note string, err error) {
	for _, name := range Files() {
		s, err := file(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return "", "", fmt.Errorf("conventions: read %s: %w", name, err)
		case len(s) > c.max:
			note = fmt.Sprintf("%s is %d bytes, over the %d-byte cap: not pinned", name, len(s), c.max)
			return fmt.Sprintf("\nproject conventions: %s is %d bytes, over the %d-byte limit, and is not included.\n", name, len(s), c.max), note, nil
		case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
			return "", fmt.Sprintf("%s is not UTF-8 text: not pinned", name), nil
		case strings.TrimSpace(s) == "":
			continue
		}
		return "\nproject conventions (" + name + "):\n" + strings.TrimSpace(s) + "\n", "", nil
	}
	return "", "", nil
}
