package orchestrator

import (
	"context"

	"github.com/ctxd/ctxd/formatters"
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

// stableContext is the RunContext of the stable blocks a request of sigil
// renders over codex: the identity, the codex block, the environment bands
// now, and the sigil with the tools it is offered there and the client's
// instructions, if any (after the floor every request shares). Requests and the codex's plan both build
// theirs here, so they render the same bytes.
func (o *Orchestrator) stableContext(instructions string, codex runcontext.Codex, sigil runcontext.Sigil) *runcontext.RunContext {
	sigil = withCodexTools(sigil, codex.Mode)
	sigil.Instructions = instructions
	return &runcontext.RunContext{Identity: o.cfg.Identity, Codex: codex, Environment: o.env.Environment(), Sigil: sigil}
}

// StableBlocks renders the stable blocks (identity, codex, environment,
// sigil) around a codex block as a request of the default sigil without
// system text of its own renders them now: what the codex's CAG/RAG plan
// weighs against the window. The formatters' stable artifacts are in it,
// but those that read the codex's files cannot yet: the codex being
// planned is not the one loaded (a formatter would read the old one's).
func (o *Orchestrator) StableBlocks(c runcontext.Codex) (runcontext.Rendered, error) {
	sigil, err := o.cfg.Sigils.Resolve("")
	if err != nil {
		return runcontext.Rendered{}, err
	}
	if !c.Prerendered() {
		c.Prerender(o.cfg.Format.Specials())
	}
	rc := o.stableContext("", c, sigil)
	arts, err := o.cfg.Formatters.Apply(context.Background(), formatters.Input{RunContext: rc})
	if err != nil {
		o.log.Warn("formatter failed; its artifact is left out of the codex plan", "err", err)
	}
	for _, a := range arts {
		if a.Stable {
			rc.Artifacts = append(rc.Artifacts, a)
		}
	}
	return o.cfg.Format.Render(rc)
}
