package orchestrator

import (
	"errors"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
)

// tally is the governor's count of a prompt as its steps shrink it: the
// prompt counted whole and judged against the limits.
type tally struct {
	exact  measured    // the count of the whole prompt
	budget ctxd.Budget // the limits' verdict on it
	err    error       // the *governor.LimitError of that verdict, nil if the prompt fits
}

// over reports whether the prompt is over a limit.
func (t *tally) over() bool {
	var le *governor.LimitError
	return errors.As(t.err, &le)
}

// measureExact counts the prompt of rc whole and exactly, and judges it.
func (g *preparation) measureExact() error {
	m, err := g.o.measure(g.p.rc, g.tails)
	if err != nil {
		return err
	}
	g.tally = tally{exact: m}
	g.tally.budget, g.tally.err = g.lim.Check(m.Measure)
	return nil
}

// adjust counts rc after a step changed it: whole, again.
func (g *preparation) adjust() error { return g.measureExact() }

// settle makes the tally exact: it always is.
func (g *preparation) settle() error { return nil }
