package runcontext_test

import (
	"fmt"
	"testing"

	"github.com/ctxd/ctxd/bench"
	"github.com/ctxd/ctxd/internal/race"
)

// BenchmarkCompose: build + validate + render with a 10k and a 100k-token
// codex, 50 turns, 10 karma entries. Allocations must not grow with the
// codex: it is rendered once, at load.
func BenchmarkCompose(b *testing.B) {
	for _, tokens := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("codex=%dk", tokens/1000), func(b *testing.B) {
			c, turns, karma := bench.ComposeInputs(tokens)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := bench.ComposeOnce(c, turns, karma, "Where is F7?"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestComposeAllocationsDoNotGrowWithTheCodex(t *testing.T) {
	small, turns, karma := bench.ComposeInputs(10_000)
	big, _, _ := bench.ComposeInputs(100_000)
	a := testing.AllocsPerRun(50, func() { _, _ = bench.ComposeOnce(small, turns, karma, "q") })
	b := testing.AllocsPerRun(50, func() { _, _ = bench.ComposeOnce(big, turns, karma, "q") })
	if b > a+race.Slack(a) {
		t.Errorf("allocations grow with the codex: %v with 10k tokens, %v with 100k", a, b)
	}
}
