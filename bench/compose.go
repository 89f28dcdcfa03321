package bench

import (
	"fmt"
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// ComposeInputs is a realistic request: a codex of about codexTokens
// tokens (at ~4 bytes a token) in files of ~2 kB, prerendered as the
// daemon does at load, 50 turns and 10 karma entries.
func ComposeInputs(codexTokens int) (runcontext.Codex, []runcontext.Turn, []runcontext.KarmaEntry) {
	var files []runcontext.CodexRef
	var body strings.Builder
	for i := 0; body.Len() < codexTokens*4; i++ {
		text := strings.Repeat(fmt.Sprintf("func F%d() error { return nil } // line\n", i), 50)
		fmt.Fprintf(&body, "~~~ file \"pkg/f%05d.go\"\n%s~~~\n", i, text)
		files = append(files, runcontext.CodexRef{Path: fmt.Sprintf("pkg/f%05d.go", i), Bytes: int64(len(text)), SHA256: strings.Repeat("ab", 32)})
	}
	c := runcontext.Codex{Name: "bench", Mode: runcontext.ModeCAG, Files: files, Body: body.String()}
	c.Prerender(nil)
	turns := make([]runcontext.Turn, 50)
	for i := range turns {
		turns[i] = runcontext.Turn{Query: fmt.Sprintf("What does F%d return and why?", i), Answer: strings.Repeat("It returns nil. ", 20)}
	}
	karma := make([]runcontext.KarmaEntry, 10)
	for i := range karma {
		karma[i] = runcontext.KarmaEntry{ID: fmt.Sprintf("k%d", i), Text: "Verified: the tests pass with make test."}
	}
	return c, turns, karma
}

// ComposeOnce builds, validates and renders one request's RunContext, as
// the orchestrator does before tokenizing.
func ComposeOnce(c runcontext.Codex, turns []runcontext.Turn, karma []runcontext.KarmaEntry, q string) (runcontext.Rendered, error) {
	rc := runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "ctxd", Persona: "You are a precise assistant."},
		Codex:       c,
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "offline"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		Karma:       runcontext.Karma{Epoch: 1, Entries: karma},
		State:       runcontext.State{Turns: turns},
		Query:       runcontext.Query{Text: q},
	}
	if err := rc.Validate(); err != nil {
		return runcontext.Rendered{}, err
	}
	return runcontext.Render(&rc), nil
}
