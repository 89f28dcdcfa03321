package orchestrator

import (
	"context"

	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// withCodexTools is sigil as a request renders it over a codex block of
// mode: in RAG mode a sigil that may search the codex is offered the
// search_codex tool.
func withCodexTools(sigil runcontext.Sigil, mode string) runcontext.Sigil {
	if mode == runcontext.ModeRAG && sigils.Allows(sigil, sigils.ScopeSearchCodex) {
		sigil.Tools = []string{sigils.ScopeSearchCodex}
	}
	return sigil
}

// StableBlocks renders the stable blocks (identity, codex, environment,
// sigil) around a codex block as a request of the default sigil without
// system text of its own renders them now: what the codex's CAG/RAG plan
// weighs against the window.
func (o *Orchestrator) StableBlocks(c runcontext.Codex) (runcontext.Rendered, error) {
	sigil, err := o.cfg.Sigils.Resolve("")
	if err != nil {
		return runcontext.Rendered{}, err
	}
	rc := &runcontext.RunContext{Identity: o.cfg.Identity, Codex: c, Environment: o.env.Environment(),
		Sigil: withCodexTools(sigil, c.Mode)}
	// The stable artifacts count toward the blocks a codex shares the
	// window with.
	o.inject(context.Background(), rc, &codexState{block: c})
	stable := rc.Artifacts[:0]
	for _, a := range rc.Artifacts {
		if a.Stable {
			stable = append(stable, a)
		}
	}
	rc.Artifacts = stable
	return o.cfg.Format.Render(rc)
}
