package tokencount

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/runcontext"
)

// mergingTokenizer is a byte tokenizer that merges "\n###" into one token,
// so a prompt split after a blank line tokenizes differently from the whole.
type mergingTokenizer struct{ fake.Tokenizer }

func (m mergingTokenizer) Tokenize(s string) ([]int, error) {
	var out []int
	for i := 0; i < len(s); i++ {
		if strings.HasPrefix(s[i:], "\n###") {
			out = append(out, 1000)
			i += 3
			continue
		}
		out = append(out, int(s[i]))
	}
	return out, nil
}

func (m mergingTokenizer) TokenizeText(s string) ([]int, error) { return m.Tokenize(s) }

// countingTokenizer counts how many times text holding marker was tokenized.
type countingTokenizer struct {
	ctxd.Tokenizer
	marker string
	hits   atomic.Int64
}

func (c *countingTokenizer) Tokenize(s string) ([]int, error) {
	if strings.Contains(s, c.marker) {
		c.hits.Add(1)
	}
	return c.Tokenizer.Tokenize(s)
}

func (c *countingTokenizer) TokenizeText(s string) ([]int, error) {
	if strings.Contains(s, c.marker) {
		c.hits.Add(1)
	}
	return c.Tokenizer.TokenizeText(s)
}

func render(codex string, turns []runcontext.Turn, query string) runcontext.Rendered {
	return runcontext.Render(&runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "t", Persona: "Be brief."},
		Codex:       runcontext.Codex{Name: "c", Mode: runcontext.ModeCAG, Body: codex},
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "offline"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		State:       runcontext.State{Turns: turns},
		Query:       runcontext.Query{Text: query},
	})
}

func TestPromptCountsStayExact(t *testing.T) {
	t.Parallel()
	for name, tok := range map[string]ctxd.Tokenizer{"splittable": fake.Tokenizer{}, "merging": mergingTokenizer{}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := New(tok, nil)
			var turns []runcontext.Turn
			for i := range 2*tailCheckEvery + 1 { // through the periodic whole-tail checks
				q := fmt.Sprint("q", i)
				r := render("codex line\n### not a block\n", turns, q)
				got, err := c.Prompt(r, "s")
				if err != nil {
					t.Fatal(err)
				}
				want, _ := tok.Tokenize(r.Prompt())
				if fmt.Sprint(got.IDs) != fmt.Sprint(want) {
					t.Fatalf("turn %d: %d tokens, the whole prompt has %d", i+1, len(got.IDs), len(want))
				}
				turns = append(turns, runcontext.Turn{Query: q, Answer: "### an answer"})
			}
			if n := len(c.prefixes); n != 1 {
				t.Errorf("%d cached prefixes, want 1", n)
			}
		})
	}
}

// TestStablePrefixIsCountedOnce: the codex service's plan and every
// request after it, concurrently, tokenize the codex once for the prefix
// and once for the block's own count.
func TestStablePrefixIsCountedOnce(t *testing.T) {
	t.Parallel()
	tok := &countingTokenizer{Tokenizer: fake.Tokenizer{}, marker: "CODEX-MARKER"}
	c := New(tok, nil)
	codex := strings.Repeat("CODEX-MARKER line\n", 100)
	if _, err := c.Stable(render(codex, nil, "plan")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Prompt(render(codex, nil, fmt.Sprint("q", i)), fmt.Sprint("s", i)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// The prefix and the codex block once each; the first request checks
	// its split against the whole prompt once.
	if n := tok.hits.Load(); n != 3 {
		t.Errorf("the codex was tokenized %d times, want 3", n)
	}
}

func TestBlockCountsAddUp(t *testing.T) {
	t.Parallel()
	c := New(fake.Tokenizer{}, nil)
	r := render("body\n", []runcontext.Turn{{Query: "a", Answer: "b"}}, "q")
	got, err := c.Prompt(r, "")
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for k, n := range got.Blocks {
		if n != len(r.Blocks[k]) {
			t.Errorf("block %s: %d tokens, want %d", runcontext.BlockNames[k], n, len(r.Blocks[k]))
		}
		sum += n
	}
	if sum != len(got.IDs) {
		t.Errorf("blocks sum to %d, prompt has %d", sum, len(got.IDs))
	}
}
