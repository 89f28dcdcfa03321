package governor

import (
	"fmt"
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// Limits are the hard bounds of one model load.
type Limits struct {
	MaxChars      int `json:"max_chars"`      // total prompt characters (bytes); 0: no cap
	NumCtx        int `json:"num_ctx"`        // the backend's context window, fixed per model load
	AnswerReserve int `json:"answer_reserve"` // tokens kept free for the answer
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
	}
	return nil
}

// PromptBudget is the most prompt tokens a request may have.
func (l Limits) PromptBudget() int { return l.NumCtx - l.AnswerReserve }

// BlockUsage is one block's share of the prompt.
type BlockUsage struct {
	Block string `json:"block"`
	Chars int    `json:"chars"`
}

// Budget is what the governor measured for one request.
type Budget struct {
	Chars         int          `json:"chars"`
	MaxChars      int          `json:"max_chars,omitempty"`
	PromptTokens  int          `json:"prompt_tokens"`
	AnswerReserve int          `json:"answer_reserve"`
	NumCtx        int          `json:"num_ctx"`
	Blocks        []BlockUsage `json:"blocks"`
}

// LimitError says which limit a request exceeds, with the numbers.
type LimitError struct {
	Limit   string // "max_chars" or "num_ctx"
	Needed  int
	Allowed int
	Budget  Budget
}

func (e *LimitError) Error() string {
	var sb strings.Builder
	switch e.Limit {
	case "max_chars":
		fmt.Fprintf(&sb, "prompt is %d characters, over the cap of %d", e.Needed, e.Allowed)
	default:
		fmt.Fprintf(&sb, "prompt is %d tokens; with %d reserved for the answer the window of %d allows %d",
			e.Needed, e.Budget.AnswerReserve, e.Budget.NumCtx, e.Allowed)
	}
	sb.WriteString(" (chars per block:")
	for _, b := range e.Budget.Blocks {
		fmt.Fprintf(&sb, " %s=%d", b.Block, b.Chars)
	}
	sb.WriteString(")")
	return sb.String()
}

// Check measures a rendered prompt of promptTokens tokens against the
// limits. It returns the budget, and a *LimitError if the prompt does not fit.
func (l Limits) Check(r runcontext.Rendered, promptTokens int) (Budget, error) {
	b := Budget{
		Chars: r.Len(), MaxChars: l.MaxChars, PromptTokens: promptTokens,
		AnswerReserve: l.AnswerReserve, NumCtx: l.NumCtx,
	}
	for k, text := range r.Blocks {
		b.Blocks = append(b.Blocks, BlockUsage{Block: runcontext.BlockNames[k], Chars: len(text)})
	}
	if l.MaxChars > 0 && b.Chars > l.MaxChars {
		return b, &LimitError{Limit: "max_chars", Needed: b.Chars, Allowed: l.MaxChars, Budget: b}
	}
	if promptTokens > l.PromptBudget() {
		return b, &LimitError{Limit: "num_ctx", Needed: promptTokens, Allowed: l.PromptBudget(), Budget: b}
	}
	return b, nil
}
