package bringup

import (
	"context"
	"errors"
	"fmt"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/runcontext"
)

// chooseFormat picks the format backend.format asks for: the model's chat
// template (checked), or ctxd's plain format for a model without one.
func (c Config) chooseFormat(want string, facts Facts, special runcontext.Specials) (runcontext.Format, FormatInfo, error) {
	spec := formatters.FormatSpec{Template: facts.Template, Stop: facts.Stop, Specials: special}
	return c.pickFormat(want, spec, "the model's chat template, rendered with Ollama's own template code",
		func() (*chattemplate.Format, error) { return chattemplate.New(facts.Template, facts.Stop, special) })
}

// pickFormat applies backend.format (want) to the model's template, which
// load reads and checks: plain when asked; a format an embedding program
// registered (Config.Formats) when named; else the template when it loads
// (reason says why it is trusted); else an error if the template was
// required, or plain, saying why.
func (c Config) pickFormat(want string, spec formatters.FormatSpec, reason string, load func() (*chattemplate.Format, error)) (runcontext.Format, FormatInfo, error) {
	special := spec.Specials
	plain := runcontext.Plain{Special: special}
	switch want {
	case "auto", formatters.FormatTemplate:
	case formatters.FormatPlain:
		return plain, FormatInfo{Name: plain.Name(), AppendOnly: true, Reason: "backend.format = plain"}, nil
	default:
		return c.registeredFormat(want, spec)
	}
	f, err := load()
	switch {
	case err == nil:
		c := f.Check()
		return f, FormatInfo{Name: f.Name(), AppendOnly: c.AppendOnly, Note: c.Note, Reason: reason, Tools: c.Tools}, nil
	case want == "template":
		return nil, FormatInfo{}, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.format = template: %v", err)
	case errors.Is(err, chattemplate.ErrNoTemplate):
		return plain, FormatInfo{Name: plain.Name(), AppendOnly: true, Reason: "the model has no chat template"}, nil
	}
	return plain, FormatInfo{Name: plain.Name(), AppendOnly: true, Reason: fmt.Sprintf("the model's chat template cannot be used (%v)", err)}, nil
}

// registeredFormat is the format registered under name (backend.format
// names one an embedding program registered), made for this model.
func (c Config) registeredFormat(name string, spec formatters.FormatSpec) (runcontext.Format, FormatInfo, error) {
	var maker formatters.FormatMaker
	ok := false
	if c.Formats != nil {
		maker, ok = c.Formats.Format(name)
	}
	if !ok {
		return nil, FormatInfo{}, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.format = %q: no prompt format of that name is registered (the core's are auto, template and plain; others are registered by the program that embeds the daemon)", name)
	}
	f, err := maker(spec)
	if err == nil && f == nil {
		err = errors.New("its maker made no format")
	}
	if err != nil {
		return nil, FormatInfo{}, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.format = %q cannot render for this model: %v", name, err)
	}
	return f, FormatInfo{Name: f.Name(), Reason: fmt.Sprintf("backend.format = %s (a registered format)", name)}, nil
}

// chooseLlamaFormat picks the format for llama-server: the model's chat
// template as ctxd renders it (the Go template Ollama maps the Jinja
// template to: the GGUF's, or the server's /props chat_template when the
// model file is not readable here), accepted only if the server's own Jinja rendering agrees on a
// probe conversation; else the plain format, saying why.
func (cfg Config) chooseLlamaFormat(ctx context.Context, want, jinja string, special runcontext.Specials, c *llamacpp.Client, bos string) (runcontext.Format, FormatInfo, error) {
	spec := formatters.FormatSpec{Jinja: jinja, Specials: special}
	return cfg.pickFormat(want, spec, "the model's chat template; llama-server's own Jinja rendering agrees", func() (*chattemplate.Format, error) {
		f, err := chattemplate.FromJinja(jinja, special)
		if err != nil {
			return nil, err
		}
		server := func(msgs []chattemplate.Message) (string, error) { return c.ApplyTemplate(ctx, msgs) }
		err = f.Agrees(server, bos)
		if err == nil {
			return f, nil
		}
		// Ollama's template file may end with a newline the model's own
		// Jinja does not write (Gemma 3's): without it, it may agree.
		if t, terr := chattemplate.FromJinjaTrimmed(jinja, special); terr == nil && t.Agrees(server, bos) == nil {
			cfg.Logger.Info("the model's chat template agrees with llama-server's own rendering without the newline Ollama's template file ends with", "append_only", t.Check().AppendOnly)
			return t, nil
		}
		return f, err
	})
}
