package runcontext

import "testing"

func renderFor(persona, memory, query string, turns ...Turn) Rendered {
	return Render(&RunContext{
		Identity:    Identity{Name: "t", Persona: persona},
		Codex:       Codex{Mode: ModeNone},
		Environment: Environment{VRAM: memory, GPU: "none", Power: "ac", Connectivity: "offline"},
		Sigil:       Sigil{Name: "default", Scopes: []string{"ask"}},
		State:       State{Turns: turns},
		Query:       Query{Text: query},
	})
}

func TestCompare(t *testing.T) {
	t.Parallel()
	first := renderFor("p", "high", "q1")
	cases := []struct {
		name  string
		next  Rendered
		block string // "" for no break
	}{
		{"next turn", renderFor("p", "high", "q2", Turn{Query: "q1", Answer: "a1"}), ""},
		{"environment band changed", renderFor("p", "low", "q2", Turn{Query: "q1", Answer: "a1"}), "environment"},
		{"persona changed", renderFor("P", "high", "q2", Turn{Query: "q1", Answer: "a1"}), "identity"},
		{"turn dropped", renderFor("p", "high", "q2"), "state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := Compare(first, c.next, RenderAnswer("a1"))
			switch {
			case c.block == "" && b != nil:
				t.Errorf("reported a break: %+v", b)
			case c.block != "" && (b == nil || b.Block != c.block):
				t.Errorf("break %+v, want block %q", b, c.block)
			}
		})
	}
}
