package governor

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

func history(n int, pinned ...int) []runcontext.Turn {
	turns := make([]runcontext.Turn, n)
	for i := range turns {
		turns[i] = runcontext.Turn{Query: fmt.Sprint("q", i), Answer: "a", Verbatim: slices.Contains(pinned, i)}
	}
	return turns
}

func TestCompactInEpochs(t *testing.T) {
	l := Limits{MaxDepth: 20}
	if c := l.Compact(history(20)); c.Compacted() || len(c.Keep) != 20 {
		t.Errorf("within depth: %+v", c)
	}
	c := l.Compact(history(21))
	if len(c.Keep) != 10 || len(c.Dropped) != 11 || c.Keep[0] != 11 {
		t.Errorf("past depth: keep %v dropped %v, want the newest 10", c.Keep, c.Dropped)
	}
	// Pinned turns stay, whatever their age; filler goes first.
	c = l.Compact(history(21, 0, 3))
	if len(c.Keep) != 10 || c.Keep[0] != 0 || c.Keep[1] != 3 || slices.Contains(c.Dropped, 0) {
		t.Errorf("pinned: keep %v dropped %v", c.Keep, c.Dropped)
	}
	// Everything pinned: nothing can go.
	all := make([]int, 21)
	for i := range all {
		all[i] = i
	}
	if c := l.Compact(history(21, all...)); c.Compacted() {
		t.Errorf("all pinned yet dropped %v", c.Dropped)
	}
	// A rolling window is CompactTo == MaxDepth: one turn per request.
	rolling := Limits{MaxDepth: 20, CompactTo: 20}
	if c := rolling.Compact(history(21)); len(c.Dropped) != 1 {
		t.Errorf("rolling dropped %v", c.Dropped)
	}
}

// TestEpochsBreakLessThanRolling counts prefix breaks over a scripted
// session, the figure the benchmark measures on the real backend.
func TestEpochsBreakLessThanRolling(t *testing.T) {
	count := func(l Limits) int {
		var turns []runcontext.Turn
		breaks := 0
		for range 200 {
			if c := l.Compact(turns); c.Compacted() {
				breaks++
				var kept []runcontext.Turn
				for _, i := range c.Keep {
					kept = append(kept, turns[i])
				}
				turns = kept
			}
			turns = append(turns, runcontext.Turn{Query: "q", Answer: "a"})
		}
		return breaks
	}
	epoch, rolling := count(Limits{MaxDepth: 20}), count(Limits{MaxDepth: 20, CompactTo: 20})
	if epoch > 200/(20/2) {
		t.Errorf("epoch compaction broke the prefix %d times, want at most %d", epoch, 200/(20/2))
	}
	if rolling < 5*epoch {
		t.Errorf("rolling window broke %d times vs %d for epochs", rolling, epoch)
	}
}

func TestTighten(t *testing.T) {
	wide := Limits{MaxChars: 100000, NumCtx: 8192, AnswerReserve: 256, MaxDepth: 40}
	got := wide.Tighten(Limits{MaxChars: 500000, AnswerReserve: 128, MaxDepth: 10, CompactTo: 4})
	want := Limits{MaxChars: 100000, NumCtx: 8192, AnswerReserve: 128, MaxDepth: 10, CompactTo: 4}
	if got != want {
		t.Errorf("Tighten = %+v, want %+v", got, want)
	}
	if got := (Limits{}).Tighten(Limits{MaxChars: 5}); got.MaxChars != 5 {
		t.Errorf("unset wide limit not tightened: %+v", got)
	}
}
