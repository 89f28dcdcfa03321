package bringup

import (
	"errors"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/runcontext"
)

// upper is a format an embedding program registers: the plain format,
// upper-cased.
type upper struct{ runcontext.Plain }

func (upper) Name() string { return "upper" }

// TestFormatChoice: backend.format picks the plain format, the model's
// template (or, under auto, plain with the reason when there is none), or
// a format registered by name; a name nobody registered, or a format that
// cannot render for the model, stops the start with an error saying so.
func TestFormatChoice(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	made := formatters.FormatSpec{}
	if err := reg.RegisterFormat("upper", func(s formatters.FormatSpec) (runcontext.Format, error) {
		made = s
		return upper{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := reg.RegisterFormat("picky", func(formatters.FormatSpec) (runcontext.Format, error) {
		return nil, errors.New("needs a Jinja template")
	}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Formats: reg}
	noTemplate := func() (*chattemplate.Format, error) { return nil, chattemplate.ErrNoTemplate }
	spec := formatters.FormatSpec{Jinja: "{{ messages }}", Stop: []string{"<end>"}}
	cases := []struct {
		want, name, reason, err string
	}{
		{"plain", "plain", "backend.format = plain", ""},
		{"auto", "plain", "the model has no chat template", ""},
		{"template", "", "", "backend.format = template"},
		{"upper", "upper", "registered format", ""},
		{"nobody", "", "", `backend.format = "nobody": no prompt format of that name is registered`},
		{"picky", "", "", "cannot render for this model: needs a Jinja template"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			f, info, err := cfg.pickFormat(c.want, spec, "trusted", noTemplate)
			if c.err != "" {
				if err == nil || ctxd.KindOf(err) != ctxd.KindInvalid || !strings.Contains(err.Error(), c.err) {
					t.Errorf("error %v, want one of kind invalid saying %q", err, c.err)
				}
				return
			}
			if err != nil || f.Name() != c.name || info.Name != c.name || !strings.Contains(info.Reason, c.reason) {
				t.Errorf("format %v, info %+v, err %v; want %s because %q", f, info, err, c.name, c.reason)
			}
		})
	}
	if made.Jinja != spec.Jinja || len(made.Stop) != 1 {
		t.Errorf("the registered format was made from %+v, want the model's %+v", made, spec)
	}
}
