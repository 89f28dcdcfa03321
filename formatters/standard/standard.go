// Package standard assembles the registry the daemon uses: the core's
// formats and the formatters ctxd ships, the tool manifest
// (formatters/toolmanifest) and the project conventions file
// (formatters/conventions). It lives apart from package formatters
// because the shipped formatters are extensions like any other: they
// import formatters, so formatters cannot import them.
package standard

import (
	"log/slog"

	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/conventions"
	"github.com/ctxd/ctxd/formatters/toolmanifest"
)

// Options configure the shipped formatters.
type Options struct {
	// ConventionsMaxBytes caps the conventions file pinned whole; 0 means
	// conventions.DefaultMaxBytes.
	ConventionsMaxBytes int
	// Logger hears what the formatters have to say; nil: nobody does.
	Logger *slog.Logger
}

// Default returns a new registry with the core's formats and the shipped
// formatters registered. More may be registered on it.
func Default(o Options) *formatters.Registry {
	r := formatters.NewRegistry()
	for _, inj := range []formatters.Injector{
		toolmanifest.New(),
		conventions.New(conventions.Options{MaxBytes: o.ConventionsMaxBytes, Logger: o.Logger}),
	} {
		if err := r.Register(inj); err != nil {
			panic(err) // fixed names, blocks and stability: cannot happen
		}
	}
	return r
}
