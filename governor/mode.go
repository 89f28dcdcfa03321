package governor

import (
	"fmt"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// DefaultCAGRatio is the share of the window a codex may fill whole.
const DefaultCAGRatio = 0.7

// PlanCodex chooses CAG when the stable blocks with the whole codex fit
// under ratio × (num_ctx − answer reserve), and RAG otherwise. stable is
// their token count, or -1 when the codex alone is already known to be
// over the threshold (its files' tokens sum past it) and was not rendered.
func (l Limits) PlanCodex(stable int, codexTokens int64, ratio float64) ctxd.CodexPlan {
	if ratio <= 0 {
		ratio = DefaultCAGRatio
	}
	p := ctxd.CodexPlan{StableTokens: stable, Ratio: ratio, Threshold: int(ratio * float64(l.PromptBudget()))}
	switch {
	case stable >= 0 && stable <= p.Threshold:
		p.Mode = runcontext.ModeCAG
		p.Reason = fmt.Sprintf("the codex loads whole: the stable blocks are %d tokens, within %.0f%% of the %d-token prompt budget (%d)",
			stable, 100*ratio, l.PromptBudget(), p.Threshold)
	case stable >= 0:
		p.Mode = runcontext.ModeRAG
		p.Reason = fmt.Sprintf("retrieval: the stable blocks with the whole codex would be %d tokens, over %.0f%% of the %d-token prompt budget (%d)",
			stable, 100*ratio, l.PromptBudget(), p.Threshold)
	default:
		p.Mode = runcontext.ModeRAG
		p.Reason = fmt.Sprintf("retrieval: the codex's files alone are %d tokens, over %.0f%% of the %d-token prompt budget (%d)",
			codexTokens, 100*ratio, l.PromptBudget(), p.Threshold)
	}
	return p
}
