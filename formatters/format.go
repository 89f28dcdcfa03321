package formatters

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/runcontext"
)

// The core's formats.
const (
	// FormatPlain is ctxd's own format (runcontext.Plain).
	FormatPlain = "plain"
	// FormatTemplate is the model's own chat template (package
	// chattemplate).
	FormatTemplate = "template"
)

// FormatSpec is what a prompt format may be made from: what the backend
// says about the model.
type FormatSpec struct {
	// Template is the model's chat template as a Go template (what
	// Ollama's /api/show returns); "" when the backend gives none.
	Template string
	// Jinja is the model's Jinja chat template (a GGUF's
	// tokenizer.chat_template, or llama-server's); read when Template is "".
	Jinja string
	// Stop is the stop sequences of the model's parameters.
	Stop []string
	// Specials is the special token texts of the model's vocabulary:
	// what content must be escaped against.
	Specials runcontext.Specials
}

// FormatMaker makes a format for one model. An error means the format
// cannot render for it (chattemplate.ErrNoTemplate: the model has no chat
// template).
type FormatMaker func(spec FormatSpec) (runcontext.Format, error)

// RegisterFormat adds a prompt format under name, which must match
// runcontext.FormatterNameRE and be free; "auto" is reserved (the choice
// between the template and plain that config makes). The format's own
// Name need not be the same: it is what status reports.
func (r *Registry) RegisterFormat(name string, maker FormatMaker) error {
	switch {
	case !runcontext.FormatterNameRE.MatchString(name):
		return fmt.Errorf("formatters: register format %q: the name must match %s", name, runcontext.FormatterNameRE)
	case name == "auto":
		return errors.New(`formatters: register format "auto": the name is reserved`)
	case maker == nil:
		return fmt.Errorf("formatters: register format %q: nil maker", name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.formats[name]; ok {
		return fmt.Errorf("formatters: register format %q: a format of that name is registered already", name)
	}
	r.formats[name] = maker
	return nil
}

// Format returns the maker of the format registered under name.
func (r *Registry) Format(name string) (FormatMaker, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m, ok := r.formats[name]
	return m, ok
}

// Formats names the registered formats, sorted.
func (r *Registry) Formats() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.formats))
	for n := range r.formats {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func newPlain(spec FormatSpec) (runcontext.Format, error) {
	return runcontext.Plain{Special: spec.Specials}, nil
}

// newTemplate makes the chat template format from the Go template, else
// from the Jinja one (as Ollama maps it); chattemplate checks it either
// way. A caller that can ask the backend to render the template itself
// should still check that they agree (chattemplate.Format.Agrees).
func newTemplate(spec FormatSpec) (runcontext.Format, error) {
	var f *chattemplate.Format
	var err error
	if strings.TrimSpace(spec.Template) == "" && spec.Jinja != "" {
		f, err = chattemplate.FromJinja(spec.Jinja, spec.Specials)
	} else {
		f, err = chattemplate.New(spec.Template, spec.Stop, spec.Specials)
	}
	if err != nil {
		return nil, err // not a nil *Format in a non-nil interface
	}
	return f, nil
}
