package orchestrator

import (
	"context"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// AskAs is Ask for a sigil the caller resolved and narrowed.
// (Temporary: replaced by the orchestrator's own when it lands.)
func (o *Orchestrator) AskAs(ctx context.Context, sigil runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	req.Sigil, req.Scopes = sigil.Name, sigil.Scopes
	return o.Ask(ctx, req, onToken)
}
