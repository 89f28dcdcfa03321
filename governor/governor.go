package governor

import (
	"fmt"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// Limits are the hard bounds of one model load.
type Limits struct {
	MaxChars      int `json:"max_chars"`      // total prompt characters (bytes); 0: no cap
	NumCtx        int `json:"num_ctx"`        // the backend's context window, fixed per model load
	AnswerReserve int `json:"answer_reserve"` // tokens kept free for the answer
	MaxDepth      int `json:"max_depth"`      // turns of history kept; 0: no limit
	CompactTo     int `json:"compact_to"`     // turns left after a compaction; 0: MaxDepth/2
}

// Tighten composes a narrower layer (a codex's own limits) over l: each
// limit the narrower layer sets may only make l stricter. Zero means unset.
func (l Limits) Tighten(n Limits) Limits {
	tighter := func(wide, narrow int) int {
		if narrow > 0 && (wide == 0 || narrow < wide) {
			return narrow
		}
		return wide
	}
	l.MaxChars = tighter(l.MaxChars, n.MaxChars)
	l.NumCtx = tighter(l.NumCtx, n.NumCtx)
	l.AnswerReserve = tighter(l.AnswerReserve, n.AnswerReserve)
	l.MaxDepth = tighter(l.MaxDepth, n.MaxDepth)
	l.CompactTo = tighter(l.CompactTo, n.CompactTo)
	return l
}

// LowMark is how many turns a compaction leaves.
func (l Limits) LowMark() int {
	if l.CompactTo > 0 {
		return min(l.CompactTo, l.MaxDepth)
	}
	return l.MaxDepth / 2
}

// Validate names the first bad limit.
func (l Limits) Validate() error {
	switch {
	case l.MaxChars < 0:
		return fmt.Errorf("governor: max_chars %d must not be negative", l.MaxChars)
	case l.NumCtx <= 0:
		return fmt.Errorf("governor: num_ctx %d must be positive", l.NumCtx)
	case l.AnswerReserve <= 0 || l.AnswerReserve >= l.NumCtx:
		return fmt.Errorf("governor: answer_reserve %d must be positive and below num_ctx %d", l.AnswerReserve, l.NumCtx)
	case l.MaxDepth < 0 || l.CompactTo < 0:
		return fmt.Errorf("governor: max_depth %d and compact_to %d must not be negative", l.MaxDepth, l.CompactTo)
	case l.CompactTo > l.MaxDepth && l.MaxDepth > 0:
		return fmt.Errorf("governor: compact_to %d must not exceed max_depth %d", l.CompactTo, l.MaxDepth)
	}
	return nil
}

// PromptBudget is the most prompt tokens a request may have.
func (l Limits) PromptBudget() int { return l.NumCtx - l.AnswerReserve }

// Measure is a rendered prompt with its token counts.
type Measure struct {
	Rendered     runcontext.Rendered
	PromptTokens int
	BlockTokens  [runcontext.NumBlocks]int
	KVBytes      func(tokens int) int64 // nil: KV not reported
}

// LimitError says which limit a request exceeds, with the numbers.
type LimitError struct {
	Limit   string // "max_chars" or "num_ctx"
	Needed  int
	Allowed int
	Budget  ctxd.Budget
}

// ErrorKind makes a request that does not fit a ctxd.KindDoesNotFit.
func (e *LimitError) ErrorKind() ctxd.Kind { return ctxd.KindDoesNotFit }

func (e *LimitError) Error() string {
	var sb strings.Builder
	switch e.Limit {
	case "max_chars":
		fmt.Fprintf(&sb, "prompt is %d characters, over the cap of %d", e.Needed, e.Allowed)
	default:
		fmt.Fprintf(&sb, "prompt is %d tokens; with %d reserved for the answer the window of %d allows %d",
			e.Needed, e.Budget.AnswerReserve, e.Budget.NumCtx, e.Allowed)
	}
	sb.WriteString(" (per block, chars/tokens:")
	for _, b := range e.Budget.Blocks {
		fmt.Fprintf(&sb, " %s=%d/%d", b.Block, b.Chars, b.Tokens)
	}
	sb.WriteString(")")
	return sb.String()
}

// Check measures a rendered prompt against the limits. It returns the
// budget, and a *LimitError if the prompt does not fit.
func (l Limits) Check(m Measure) (ctxd.Budget, error) {
	r, promptTokens := m.Rendered, m.PromptTokens
	b := ctxd.Budget{
		Chars: r.Len(), MaxChars: l.MaxChars, PromptTokens: promptTokens,
		AnswerReserve: l.AnswerReserve, NumCtx: l.NumCtx,
	}
	if m.KVBytes != nil {
		b.KVBytes = m.KVBytes(promptTokens + l.AnswerReserve)
		b.KVBudgetBytes = m.KVBytes(l.NumCtx)
	}
	for k, text := range r.Blocks {
		b.Blocks = append(b.Blocks, ctxd.BlockUsage{Block: runcontext.BlockNames[k], Chars: len(text), Tokens: m.BlockTokens[k]})
	}
	if l.MaxChars > 0 && b.Chars > l.MaxChars {
		return b, &LimitError{Limit: "max_chars", Needed: b.Chars, Allowed: l.MaxChars, Budget: b}
	}
	if promptTokens > l.PromptBudget() {
		return b, &LimitError{Limit: "num_ctx", Needed: promptTokens, Allowed: l.PromptBudget(), Budget: b}
	}
	return b, nil
}
