package orchestrator

import (
	"errors"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
)

// pieceSlack is how far, in tokens, the count of a changed piece of a
// block, tokenized on its own, may be from what the change adds to or
// takes from the whole prompt: a tokenizer may merge across the piece's
// two edges (a newline and what follows it), and a SentencePiece one adds
// a space to the start of a text on its own.
const pieceSlack = 4

// tally is the governor's count of a prompt as its steps shrink it. The
// prompt is counted whole, exactly, once; each step after that (an excerpt
// or a karma entry left out, the history's excerpts dropped) renders the
// prompt again, which costs no tokenizing, and adjusts the count by the
// tokens of what changed, which is the only text tokenized. Tokenization
// is not quite additive at the edges of a piece, so the count carries a
// slack: a prompt is judged over the limit on its adjusted count only when
// it is over by more than the slack, and judged to fit only on an exact
// count of the whole prompt. So the prompt sent is always counted exactly
// and within the limits, and the governor stops at the same step as one
// that counted every step exactly, as long as no changed piece is off by
// more than pieceSlack tokens (else it may leave out one piece more than
// it needed to; never one fewer).
type tally struct {
	exact  measured            // the last exact count of the whole prompt
	r      runcontext.Rendered // the prompt as it is now
	tokens int                 // its tokens: exact's, adjusted by every step since
	slack  int                 // how far tokens may be off the exact count; 0: exact
	budget ctxd.Budget         // the limits' verdict on the prompt now (exact only when slack is 0)
	err    error               // the *governor.LimitError of that verdict, nil if the prompt fits
}

// isExact reports whether the tally holds an exact count of the prompt
// as it is now.
func (t *tally) isExact() bool { return t.slack == 0 }

// over reports whether the prompt as it is now is over a limit: exactly,
// or by more than the slack.
func (t *tally) over() bool {
	var le *governor.LimitError
	return errors.As(t.err, &le)
}

// measureExact counts the prompt of rc whole and exactly, and judges it.
func (g *preparation) measureExact() error {
	m, err := g.measure(g.p.rc, g.tails)
	if err != nil {
		return err
	}
	g.tally = tally{exact: m, r: m.Rendered, tokens: m.PromptTokens}
	g.tally.budget, g.tally.err = g.lim.Check(m.Measure)
	return nil
}

// adjust counts rc after a step changed it: the prompt is rendered again,
// the count adjusted by the tokens of the lines that changed in each
// block, and the prompt judged: over the limits if it is over by more than
// the slack, else counted exactly (it may fit).
func (g *preparation) adjust() error {
	r, err := g.o.cfg.Format.Render(g.p.rc)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: render the prompt: %w", err)
	}
	t := &g.tally
	for k := range r.Blocks {
		if r.Blocks[k] == t.r.Blocks[k] {
			continue
		}
		removed, added := changedLines(t.r.Blocks[k], r.Blocks[k])
		out, err := g.o.count.Text(removed)
		if err != nil {
			return ctxd.Errorf(ctxd.KindInternal, "orchestrator: count prompt tokens: %w", err)
		}
		in, err := g.o.count.Text(added)
		if err != nil {
			return ctxd.Errorf(ctxd.KindInternal, "orchestrator: count prompt tokens: %w", err)
		}
		t.tokens += in - out
		t.slack += pieceSlack
	}
	t.r = r
	if t.isExact() { // nothing changed
		return nil
	}
	// The least the prompt can be: over the limits even so, it is over.
	t.budget, t.err = g.lim.Check(governor.Measure{Rendered: r, PromptTokens: max(0, t.tokens-t.slack)})
	if t.over() {
		return nil
	}
	return g.measureExact()
}

// settle makes the tally exact, if it is not: what is sent, or refused
// with its numbers, is counted whole.
func (g *preparation) settle() error {
	if g.tally.isExact() {
		return nil
	}
	return g.measureExact()
}

// changedLines is what changed from old to new, two renderings of one
// block: the lines of old that new does not have (removed) and those new
// has in their place (added), around the lines the two begin and end
// with in common. Whole lines, so that each piece starts and ends where
// a tokenizer rarely merges.
func changedLines(old, new string) (removed, added string) {
	n := min(len(old), len(new))
	pre := 0
	for pre < n && old[pre] == new[pre] {
		pre++
	}
	pre = strings.LastIndexByte(old[:pre], '\n') + 1 // back to a line's start
	suf := 0
	for suf < n-pre && old[len(old)-1-suf] == new[len(new)-1-suf] {
		suf++
	}
	// Forward to a line's start: old's changed lines end with a newline
	// (or the block does).
	end := len(old) - suf
	if end > pre && old[end-1] != '\n' {
		if i := strings.IndexByte(old[end:], '\n'); i >= 0 {
			end += i + 1
		} else {
			end = len(old)
		}
	}
	suf = len(old) - end
	return old[pre:end], new[pre : len(new)-suf]
}
