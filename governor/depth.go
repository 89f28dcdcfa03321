package governor

import "github.com/ctxd/ctxd/runcontext"

// Compaction is the result of applying the message depth to a history.
type Compaction struct {
	Keep    []int // indexes of the turns kept, in order
	Dropped []int // indexes of the turns dropped, in order
}

// Compacted reports whether anything was dropped.
func (c Compaction) Compacted() bool { return len(c.Dropped) > 0 }

// Compact applies the message depth in epochs. While the history is within
// MaxDepth turns nothing happens; once it passes MaxDepth, it is cut to the
// low mark in one step, so the cached prefix breaks once per epoch rather
// than on every turn as a rolling window's does. Verbatim (pinned) turns are
// never dropped; the oldest other turns go first. With CompactTo equal to
// MaxDepth this is a rolling window.
func (l Limits) Compact(turns []runcontext.Turn) Compaction {
	c := Compaction{}
	if l.MaxDepth == 0 || len(turns) <= l.MaxDepth {
		for i := range turns {
			c.Keep = append(c.Keep, i)
		}
		return c
	}
	excess := len(turns) - l.LowMark()
	for i, t := range turns {
		if excess > 0 && !t.Verbatim {
			c.Dropped = append(c.Dropped, i)
			excess--
			continue
		}
		c.Keep = append(c.Keep, i)
	}
	return c
}
