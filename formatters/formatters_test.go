package formatters_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/runcontext"
)

// styleGuide is a formatter an extension could write: a stable text for
// the identity block.
type styleGuide struct{ text string }

func (styleGuide) Name() string { return "styleguide" }
func (styleGuide) Block() int   { return runcontext.BlockIdentity }
func (styleGuide) Stable() bool { return true }
func (s styleGuide) Inject(context.Context, formatters.Input) (string, error) {
	return "style guide:\n" + s.text, nil
}

// clock is a volatile formatter: a text of this request only, for the
// query block.
type clock struct{ now string }

func (clock) Name() string { return "clock" }
func (clock) Block() int   { return runcontext.BlockQuery }
func (clock) Stable() bool { return false }
func (c *clock) Inject(context.Context, formatters.Input) (string, error) {
	return "[clock] " + c.now, nil
}

func request() *runcontext.RunContext {
	return &runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "t", Persona: "Be brief."},
		Codex:       runcontext.Codex{Mode: runcontext.ModeNone},
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		State:       runcontext.State{Turns: []runcontext.Turn{{Query: "q1", Answer: "a1"}}},
		Query:       runcontext.Query{Text: "q2"},
	}
}

// TestFormatterFromAnotherPackage: formatters defined here, outside the
// core, join the prompt where their block is, in both formats; the
// volatile one changes nothing before the query.
func TestFormatterFromAnotherPackage(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	c := &clock{now: "10:00"}
	for _, inj := range []formatters.Injector{styleGuide{text: "Use tables."}, c} {
		if err := reg.Register(inj); err != nil {
			t.Fatal(err)
		}
	}
	jinja, special := modelgen.ChatTemplate(modelgen.TemplateChatML)
	makeTemplate, _ := reg.Format(formatters.FormatTemplate)
	tmpl, err := makeTemplate(formatters.FormatSpec{Jinja: jinja, Specials: special})
	if err != nil {
		t.Fatal(err)
	}
	makePlain, _ := reg.Format(formatters.FormatPlain)
	plain, _ := makePlain(formatters.FormatSpec{Specials: special})

	render := func(t *testing.T, f runcontext.Format) runcontext.Rendered {
		t.Helper()
		rc := request()
		arts, err := reg.Apply(t.Context(), formatters.Input{RunContext: rc})
		if err != nil {
			t.Fatal(err)
		}
		rc.Artifacts = arts
		if err := rc.Validate(); err != nil {
			t.Fatal(err)
		}
		r, err := f.Render(rc)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, f := range []runcontext.Format{plain, tmpl} {
		t.Run(f.Name(), func(t *testing.T) {
			c.now = "10:00"
			r := render(t, f)
			for k, b := range r.Blocks {
				if has := strings.Contains(b, "style guide:\nUse tables.\n"); has != (k == runcontext.BlockIdentity) {
					t.Errorf("style guide in the %s block: %v", runcontext.BlockNames[k], has)
				}
				if has := strings.Contains(b, "[clock] 10:00\n"); has != (k == runcontext.BlockQuery) {
					t.Errorf("clock in the %s block: %v", runcontext.BlockNames[k], has)
				}
			}
			if !strings.Contains(r.Blocks[runcontext.BlockQuery], "[clock] 10:00\nq2") {
				t.Errorf("the clock does not precede the query's text:\n%q", r.Blocks[runcontext.BlockQuery])
			}
			c.now = "10:01"
			later := render(t, f)
			q := runcontext.BlockQuery
			for k := range q {
				if later.Blocks[k] != r.Blocks[k] {
					t.Errorf("the clock changed the %s block", runcontext.BlockNames[k])
				}
			}
			if later.Prompt()[:later.Offset(q)] != r.Prompt()[:r.Offset(q)] || later.Blocks[q] == r.Blocks[q] {
				t.Error("the clock changed the prefix, or not the query")
			}
		})
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	if err := reg.Register(styleGuide{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		inj  formatters.Injector
		want string
	}{
		{"duplicate", styleGuide{text: "again"}, "registered already"},
		{"nil", nil, "nil"},
		{"bad name", fake{name: "Style Guide", block: runcontext.BlockIdentity, stable: true}, "formatter"},
		{"no block", fake{name: "x", block: 9, stable: true}, "not a block"},
		{"stable state", fake{name: "x", block: runcontext.BlockState, stable: true}, "stable"},
		{"stable query", fake{name: "x", block: runcontext.BlockQuery, stable: true}, "stable"},
		{"volatile identity", fake{name: "x", block: runcontext.BlockIdentity}, "volatile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := reg.Register(tc.inj); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Register: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if got := reg.Injectors(); !slices.Equal(got, []string{"styleguide"}) {
		t.Errorf("injectors %v", got)
	}
}

// fake is an injector whose answer the test sets.
type fake struct {
	name   string
	block  int
	stable bool
	text   string
	err    error
	panics bool
}

func (f fake) Name() string { return f.name }
func (f fake) Block() int   { return f.block }
func (f fake) Stable() bool { return f.stable }
func (f fake) Inject(context.Context, formatters.Input) (string, error) {
	if f.panics {
		panic("boom")
	}
	return f.text, f.err
}

func TestApply(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	failure := errors.New("no summary today")
	for _, f := range []fake{
		{name: "memory", block: runcontext.BlockKarma, stable: true, err: failure},
		{name: "blank", block: runcontext.BlockKarma, stable: true, text: " \n"},
		{name: "zz", block: runcontext.BlockSigil, stable: true, text: "last by name"},
		{name: "binary", block: runcontext.BlockQuery, text: "\xff"},
		{name: "buggy", block: runcontext.BlockQuery, panics: true},
		{name: "aa", block: runcontext.BlockQuery, text: "first by name"},
	} {
		if err := reg.Register(f); err != nil {
			t.Fatal(err)
		}
	}
	arts, err := reg.Apply(t.Context(), formatters.Input{RunContext: request()})
	want := []runcontext.Artifact{
		{Formatter: "aa", Block: runcontext.BlockQuery, Text: "first by name"},
		{Formatter: "zz", Block: runcontext.BlockSigil, Stable: true, Text: "last by name"},
	}
	if !slices.Equal(arts, want) {
		t.Errorf("artifacts %+v, want %+v", arts, want)
	}
	if !errors.Is(err, failure) {
		t.Errorf("error %v does not wrap the injector's", err)
	}
	for _, s := range []string{"formatters: memory: no summary today", "formatters: binary:", "formatters: buggy: panic: boom"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v does not say %q", err, s)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := reg.Apply(ctx, formatters.Input{RunContext: request()}); !errors.Is(err, context.Canceled) {
		t.Errorf("Apply with a canceled context: %v", err)
	}
}

// Registering while requests apply the registry is safe (go test -race).
func TestRegistryConcurrentUse(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_ = reg.Register(fake{name: "f" + string(rune('a'+i)), block: runcontext.BlockKarma, stable: true, text: "x"})
		})
		wg.Go(func() {
			if _, err := reg.Apply(context.Background(), formatters.Input{RunContext: request()}); err != nil {
				t.Error(err)
			}
			_ = reg.Formats()
		})
	}
	wg.Wait()
	if n := len(reg.Injectors()); n != 8 {
		t.Errorf("%d injectors registered, want 8", n)
	}
}

// upper is a prompt format an extension could register: the plain one,
// with a name of its own.
type upper struct{ runcontext.Plain }

func (upper) Name() string { return "upper" }

func TestFormats(t *testing.T) {
	t.Parallel()
	reg := formatters.NewRegistry()
	if got := reg.Formats(); !slices.Equal(got, []string{"plain", "template"}) {
		t.Errorf("core formats %v", got)
	}
	if err := reg.RegisterFormat("upper", func(s formatters.FormatSpec) (runcontext.Format, error) {
		return upper{runcontext.Plain{Special: s.Specials}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "auto", "Upper Case", ""} {
		if err := reg.RegisterFormat(name, func(formatters.FormatSpec) (runcontext.Format, error) { return nil, nil }); err == nil {
			t.Errorf("RegisterFormat(%q) accepted", name)
		}
	}
	if err := reg.RegisterFormat("nil", nil); err == nil {
		t.Error("a nil maker accepted")
	}
	if got := reg.Formats(); !slices.Equal(got, []string{"plain", "template", "upper"}) {
		t.Errorf("formats %v", got)
	}
	m, ok := reg.Format("upper")
	if f, err := m(formatters.FormatSpec{}); !ok || err != nil || f.Name() != "upper" {
		t.Errorf("upper: %v %v", f, err)
	}
	if _, ok := reg.Format("auto"); ok {
		t.Error(`Format("auto") found one`)
	}
	tmpl, _ := reg.Format(formatters.FormatTemplate)
	if f, err := tmpl(formatters.FormatSpec{Template: chattemplate.DefaultTemplate}); !errors.Is(err, chattemplate.ErrNoTemplate) || f != nil {
		t.Errorf("a model without a template: %v, %v", f, err)
	}
}
