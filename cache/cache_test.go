package cache

import (
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

func TestLCP(t *testing.T) {
	cases := []struct {
		a, b []int
		want int
	}{
		{nil, nil, 0},
		{[]int{1, 2, 3}, []int{1, 2, 3, 4}, 3},
		{[]int{1, 2, 3}, []int{1, 9, 3}, 1},
		{[]int{5}, []int{6}, 0},
	}
	for _, c := range cases {
		if got := LCP(c.a, c.b); got != c.want {
			t.Errorf("LCP(%v, %v) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestSlots(t *testing.T) {
	s := NewSlots()
	if got := s.Expect("m", []int{1, 2}); got != 0 {
		t.Errorf("empty slot expects %d", got)
	}
	s.Record("m", []int{1, 2, 3})
	if got := s.Expect("m", []int{1, 2, 3, 4, 5}); got != 3 {
		t.Errorf("expect = %d, want 3", got)
	}
	s.Forget("m")
	if got := s.Expect("m", []int{1}); got != 0 {
		t.Errorf("after Forget expect = %d", got)
	}
}

func rc(persona, memory, query string, turns ...runcontext.Turn) runcontext.Rendered {
	return runcontext.Render(&runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "t", Persona: persona},
		Codex:       runcontext.Codex{Mode: runcontext.ModeNone},
		Environment: runcontext.Environment{Memory: memory, GPU: "none", Power: "ac", Connectivity: "offline"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		State:       runcontext.State{Turns: turns},
		Query:       runcontext.Query{Text: query},
	})
}

func TestCompare(t *testing.T) {
	first := rc("p", "high", "q1")
	next := rc("p", "high", "q2", runcontext.Turn{Query: "q1", Answer: "a1"})
	if b := Compare(first, next, "a1"); b != nil {
		t.Errorf("next turn reported a break: %+v", b)
	}
	if b := Compare(first, rc("p", "low", "q2", runcontext.Turn{Query: "q1", Answer: "a1"}), "a1"); b == nil || b.Block != "environment" {
		t.Errorf("environment change reported as %+v", b)
	}
	if b := Compare(first, rc("P", "high", "q2", runcontext.Turn{Query: "q1", Answer: "a1"}), "a1"); b == nil || b.Block != "identity" {
		t.Errorf("identity change reported as %+v", b)
	}
	if b := Compare(first, rc("p", "high", "q2"), "a1"); b == nil || b.Block != "state" {
		t.Errorf("dropped turn reported as %+v", b)
	}
}
