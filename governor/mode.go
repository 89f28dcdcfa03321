package governor

import (
	"fmt"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// DefaultCAGRatio is the share of the window a codex may fill whole.
const DefaultCAGRatio = 0.7

// PlanCodex chooses CAG when the stable blocks with the whole codex fit
// under the threshold, and RAG otherwise. The threshold is ratio ×
// (num_ctx − answer reserve), less where room — the tokens kept for the
// clients' own prompts (system text, tools, conversation), as measured
// (see codexsvc.Service.MakeRoom) — leaves less: the codex is ctxd's to
// shrink, a client's prompt is not. stable is the stable blocks' token
// count, or -1 when the codex alone is already known to be over the
// threshold (its files' tokens sum past it) and was not rendered.
func (l Limits) PlanCodex(stable int, codexTokens int64, ratio float64, room int) ctxd.CodexPlan {
	if ratio <= 0 {
		ratio = DefaultCAGRatio
	}
	budget := l.PromptBudget()
	p := ctxd.CodexPlan{StableTokens: stable, Ratio: ratio, Threshold: int(ratio * float64(budget)), ClientRoom: max(0, room)}
	share := fmt.Sprintf("%.0f%% of the %d-token prompt budget (%d)", 100*ratio, budget, p.Threshold)
	if left := max(0, budget-room); room > 0 && left < p.Threshold {
		p.Threshold = left
		share = fmt.Sprintf("the %d tokens of the %d-token prompt budget that the clients' own prompts leave (%d kept for them, as measured)", left, budget, room)
	}
	switch {
	case stable >= 0 && stable <= p.Threshold:
		p.Mode = runcontext.ModeCAG
		p.Reason = fmt.Sprintf("the codex loads whole: the stable blocks are %d tokens, within %s", stable, share)
	case stable >= 0:
		p.Mode = runcontext.ModeRAG
		p.Reason = fmt.Sprintf("retrieval: the stable blocks with the whole codex would be %d tokens, over %s", stable, share)
	default:
		p.Mode = runcontext.ModeRAG
		p.Reason = fmt.Sprintf("retrieval: the codex's files alone are %d tokens, over %s", codexTokens, share)
	}
	return p
}
