package orchestrator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
	"github.com/ctxd/ctxd/toolcall"
)

// prepared is a request made ready for the backend.
type prepared struct {
	sess     ctxd.Session
	rc       *runcontext.RunContext
	rendered runcontext.Rendered
	tokens   tokencount.Tokens
	budget   ctxd.Budget
	actions  []ctxd.Action
	// workingSet is what the RAG working set did, if there is one.
	workingSet *ctxd.WorkingSet
	// toolsRefused names the client's tools the sigil may not offer.
	toolsRefused []string
	// karma is the snapshot the karma block renders; karmaChosen says a
	// new karma epoch began with this request (stored once prepared).
	karma       ctxd.KarmaSnapshot
	karmaChosen bool
	// condensing is the time spent condensing old turns.
	condensing time.Duration
}

// prepare loads the session, builds and validates the RunContext, and has
// the governor make it fit: compaction, then leaving out excerpts, then
// condensation, then a refusal with the numbers. The caller holds the
// session.
func (o *Orchestrator) prepare(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil, codex *codexState, lim governor.Limits) (prepared, error) {
	var p prepared
	sess, tails := ctxd.Session{ID: req.Session}, "" // an ephemeral ask's: none held, none counted
	if !req.Ephemeral {
		var err error
		if sess, err = o.session(ctx, req.Session); err != nil {
			return p, err
		}
		tails = req.Session
	}
	rag := codex.block.Mode == runcontext.ModeRAG
	if rag && sigils.Allows(sigil, sigils.ScopeSearchCodex) {
		sigil.Tools = []string{sigils.ScopeSearchCodex}
	}
	sigil.ClientTools, p.toolsRefused = clientTools(sigil, req.Tools)
	identity := o.cfg.Identity
	identity.Instructions = req.System
	rc := &runcontext.RunContext{
		Identity:    identity,
		Codex:       codex.block,
		Environment: o.env.Environment(),
		Sigil:       sigil,
		State:       runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns},
		Query:       runcontext.Query{Text: req.Query},
	}
	// The karma block is chosen once per karma epoch; an epoch of the
	// session that the governor begins below begins a karma epoch too.
	refresh := req.RefreshKarma
	chooseKarma := func() error {
		snap, chosen, err := o.chooseKarma(ctx, req, sigil, sess.Epoch, sess.Count == 0, refresh, codex.fingerprint)
		if err != nil {
			return err
		}
		refresh = false
		if chosen || !p.karmaChosen { // a choice this request made stands until a new one
			p.karma, p.karmaChosen = snap, p.karmaChosen || chosen
		}
		rc.Karma = karmaBlock(p.karma)
		return nil
	}
	if err := chooseKarma(); err != nil {
		return p, err
	}
	var ws *ctxd.WorkingSet
	var retrieved []ctxd.Excerpt // this question's excerpts from outside the working set
	if rag && codex.retriever != nil {
		var err error
		if set, ok := codex.retriever.(WorkingSet); ok {
			var report ctxd.WorkingSet
			retrieve := set.Retrieve
			if req.Ephemeral {
				retrieve = set.Peek
			}
			rc.Codex, retrieved, report, err = retrieve(ctx, req.Query, o.cfg.TopK)
			ws = &report
		} else {
			retrieved, err = codex.retriever.Search(ctx, req.Query, o.cfg.TopK)
		}
		if err != nil {
			return p, ctxd.Errorf(ctxd.KindInternal, "orchestrator: retrieve codex excerpts: %w", err)
		}
		rc.Query.Excerpts = notPresent(retrieved, sess.Turns, ws)
	}
	o.inject(ctx, rc, codex)
	if err := rc.Validate(); err != nil {
		return p, ctxd.Errorf(ctxd.KindInvalid, "%w", err)
	}
	var actions []ctxd.Action
	if act, ok, err := o.compact(ctx, req.Session, &sess, rc, lim); err != nil {
		return p, err
	} else if ok {
		actions = append(actions, act)
		rc.Query.Excerpts = notPresent(retrieved, sess.Turns, ws) // the history that held some may be gone
		if err := chooseKarma(); err != nil {
			return p, err
		}
	}
	m, err := o.measure(rc, tails)
	if err != nil {
		return p, err
	}
	budget, err := lim.Check(m.Measure)
	var le *governor.LimitError
	// Fresh excerpts come before stale ones: the history's excerpts go (a
	// new epoch) before any of this question's is left out.
	if errors.As(err, &le) && len(retrieved) > 0 && stale(sess.Turns) > 0 {
		act, serr := o.dropStale(ctx, req.Session, &sess, rc)
		if serr != nil {
			return p, serr
		}
		actions = append(actions, act)
		rc.Query.Excerpts = notPresent(retrieved, sess.Turns, ws)
		if kerr := chooseKarma(); kerr != nil {
			return p, kerr
		}
		if m, err = o.measure(rc, tails); err != nil {
			return p, err
		}
		budget, err = lim.Check(m.Measure)
	}
	// Excerpts are the cheapest thing to give up: the lowest-ranked go first.
	dropExcerpts := func() error {
		for dropped := 0; errors.As(err, &le) && len(rc.Query.Excerpts) > 0; {
			rc.Query.Excerpts = rc.Query.Excerpts[:len(rc.Query.Excerpts)-1]
			dropped++
			var merr error
			if m, merr = o.measure(rc, tails); merr != nil {
				return merr
			}
			if budget, err = lim.Check(m.Measure); err == nil || len(rc.Query.Excerpts) == 0 {
				actions = append(actions, ctxd.Action{Kind: ctxd.ActionExcerpts,
					Reason: fmt.Sprintf("%d lowest-ranked codex excerpts left out to fit the window", dropped), Epoch: sess.Epoch})
			}
		}
		return nil
	}
	if merr := dropExcerpts(); merr != nil {
		return p, merr
	}
	// Karma is prunable by score, lowest first; pinned entries stay.
	prunedKarma := false
	pruneKarma := func() error {
		for errors.As(err, &le) {
			act, ok := o.pruneKarma(&p.karma, p.karmaChosen, !prunedKarma, rc)
			if !ok {
				return nil
			}
			prunedKarma, p.karmaChosen = true, true
			actions = append(actions, act)
			var merr error
			if m, merr = o.measure(rc, tails); merr != nil {
				return merr
			}
			budget, err = lim.Check(m.Measure)
		}
		return nil
	}
	if kerr := pruneKarma(); kerr != nil {
		return p, kerr
	}
	if errors.As(err, &le) {
		condenseStart := o.cfg.Now()
		acts, cerr := o.condense(ctx, req.Session, &sess, rc, lim)
		p.condensing = o.cfg.Now().Sub(condenseStart)
		actions = append(actions, acts...)
		if cerr != nil {
			return p, cerr
		}
		if len(acts) > 0 {
			// The condensed history holds no excerpts: the question's own
			// come back, as many as fit.
			rc.Query.Excerpts = notPresent(retrieved, sess.Turns, ws)
			if kerr := chooseKarma(); kerr != nil {
				return p, kerr
			}
			if m, err = o.measure(rc, tails); err != nil {
				return p, err
			}
			budget, err = lim.Check(m.Measure)
			if merr := dropExcerpts(); merr != nil {
				return p, merr
			}
			if kerr := pruneKarma(); kerr != nil {
				return p, kerr
			}
		}
	}
	if err != nil {
		if len(actions) > 0 {
			return p, fmt.Errorf("%w (after: %s)", err, describe(actions))
		}
		return p, err
	}
	// The karma epoch this request begins is stored now that its prompt
	// fits: a refused request leaves no epoch that was never shown.
	if p.karmaChosen && !req.Ephemeral && o.cfg.Karma.Store != nil && sigils.Allows(sigil, sigils.ScopeKarmaRead) {
		if err := o.saveKarma(ctx, p.karma); err != nil {
			return p, err
		}
	}
	if ws != nil {
		ws.ExcerptsNew = len(rc.Query.Excerpts)
		if ws.ExcerptsNew > 0 {
			bare, err := o.count.Text(runcontext.RenderQuery(rc.Query.Text, nil))
			if err != nil {
				return p, ctxd.Errorf(ctxd.KindInternal, "orchestrator: count the query: %w", err)
			}
			ws.ExcerptTokensNew = max(0, m.BlockTokens[runcontext.BlockQuery]-bare)
		}
	}
	return prepared{sess: sess, rc: rc, rendered: m.Rendered, tokens: m.tokens, budget: budget, actions: actions, workingSet: ws,
		toolsRefused: p.toolsRefused, karma: p.karma, karmaChosen: p.karmaChosen, condensing: p.condensing}, nil
}

// inject adds the formatters' artifacts to rc. A formatter that fails adds
// nothing and is logged; the others' artifacts stand.
func (o *Orchestrator) inject(ctx context.Context, rc *runcontext.RunContext, codex *codexState) {
	in := formatters.Input{RunContext: rc}
	if o.cfg.CodexFile != nil && codex.block.Mode != runcontext.ModeNone {
		in.CodexFile, in.CodexFingerprint = o.cfg.CodexFile, codex.fingerprint
	}
	arts, err := o.cfg.Formatters.Apply(ctx, in)
	if err != nil {
		o.log.Warn("formatter failed; its artifact is left out", "err", err)
	}
	rc.Artifacts = arts
}

// WorkingSet is a RAG codex that keeps the files relevant to recent
// questions in the codex block (package codexsvc): it returns the codex
// block to render now, and the question's top-k excerpts from outside it.
type WorkingSet interface {
	Retrieve(ctx context.Context, query string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error)
	// Peek is Retrieve for an ephemeral ask: the working set neither
	// learns the question nor moves.
	Peek(ctx context.Context, query string, k int) (runcontext.Codex, []ctxd.Excerpt, ctxd.WorkingSet, error)
}

// notPresent is excerpts without those an earlier turn of the history
// already holds, text and all (the prompt has them: never repeated),
// counted in ws.
func notPresent(excerpts []ctxd.Excerpt, turns []ctxd.Turn, ws *ctxd.WorkingSet) []ctxd.Excerpt {
	present := map[ctxd.Excerpt]bool{}
	for _, t := range turns {
		for _, e := range t.Excerpts {
			present[e] = true
		}
	}
	var out []ctxd.Excerpt
	n := 0
	for _, e := range excerpts {
		if present[e] {
			n++
			continue
		}
		out = append(out, e)
	}
	if ws != nil {
		ws.ExcerptsPresent = n
	}
	return out
}

// stale counts the excerpts the history holds.
func stale(turns []ctxd.Turn) int {
	n := 0
	for _, t := range turns {
		n += len(t.Excerpts)
	}
	return n
}

// dropStale starts a new epoch whose history keeps its turns without their
// excerpts.
func (o *Orchestrator) dropStale(ctx context.Context, id string, sess *ctxd.Session, rc *runcontext.RunContext) (ctxd.Action, error) {
	n := stale(sess.Turns)
	before, err := o.count.Text(runcontext.RenderState(rc.State))
	if err != nil {
		return ctxd.Action{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	epoch, err := o.store.DropExcerpts(ctx, id, o.cfg.Now())
	if err != nil {
		return ctxd.Action{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	turns := slices.Clone(sess.Turns)
	for i := range turns {
		turns[i].Excerpts = nil
	}
	sess.Epoch, sess.Turns = epoch, turns
	o.cacheSession(*sess)
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	after, err := o.count.Text(runcontext.RenderState(rc.State))
	if err != nil {
		return ctxd.Action{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	act := ctxd.Action{Kind: ctxd.ActionStale, Epoch: epoch, TokensDropped: max(0, before-after),
		Reason: fmt.Sprintf("the request did not fit; the history's %d codex excerpts of earlier questions were left out of it (a new epoch) before any of this question's", n)}
	o.log.InfoContext(ctx, "stale excerpts left out", "session", id, "epoch", epoch, "excerpts", n, "tokens", act.TokensDropped)
	return act, nil
}

// measured is a rendered prompt, its tokens and the governor's view of it.
type measured struct {
	governor.Measure
	tokens tokencount.Tokens
}

// measure renders rc and counts its tokens: the whole prompt exactly, and
// each block on its own.
func (o *Orchestrator) measure(rc *runcontext.RunContext, session string) (measured, error) {
	r, err := o.cfg.Format.Render(rc)
	if err != nil {
		return measured{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: render the prompt: %w", err)
	}
	t, err := o.count.Prompt(r, session)
	if err != nil {
		return measured{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: count prompt tokens: %w", err)
	}
	return measured{
		Measure: governor.Measure{Rendered: r, PromptTokens: len(t.IDs), BlockTokens: t.Blocks, KVBytes: o.cfg.KVBytes},
		tokens:  t,
	}, nil
}

// compact applies the message depth: once the history passes max_depth it
// is cut to the low mark in one step and a new epoch begins.
func (o *Orchestrator) compact(ctx context.Context, id string, sess *ctxd.Session, rc *runcontext.RunContext, lim governor.Limits) (ctxd.Action, bool, error) {
	c := lim.Compact(sess.Turns)
	if !c.Compacted() {
		return ctxd.Action{}, false, nil
	}
	dropped := 0
	for _, i := range c.Dropped {
		n, err := o.count.Text(runcontext.RenderQuery(sess.Turns[i].Query, sess.Turns[i].Excerpts) + runcontext.RenderAnswer(sess.Turns[i].Answer))
		if err != nil {
			return ctxd.Action{}, false, err
		}
		dropped += n
	}
	before := len(sess.Turns)
	if err := o.newEpoch(ctx, id, sess, c.Keep, sess.Summary); err != nil {
		return ctxd.Action{}, false, err
	}
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := ctxd.Action{
		Kind:         ctxd.ActionCompact,
		Reason:       fmt.Sprintf("history of %d turns passed max_depth %d; cut to %d in one step", before, lim.MaxDepth, len(c.Keep)),
		TurnsDropped: len(c.Dropped), TokensDropped: dropped, Epoch: sess.Epoch,
	}
	o.log.InfoContext(ctx, "compacted history", "session", id, "epoch", act.Epoch, "turns_dropped", act.TurnsDropped, "tokens_dropped", act.TokensDropped, "reason", act.Reason)
	return act, true, nil
}

// newEpoch stores a new epoch holding the turns at keep and summary, and
// updates sess to match.
func (o *Orchestrator) newEpoch(ctx context.Context, id string, sess *ctxd.Session, keep []int, summary string) error {
	seqs := make([]int64, len(keep))
	turns := make([]ctxd.Turn, len(keep))
	for j, i := range keep {
		seqs[j], turns[j] = sess.Seqs[i], sess.Turns[i]
	}
	epoch, err := o.store.NewEpoch(ctx, id, seqs, summary, o.cfg.Now())
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	sess.Epoch, sess.Summary, sess.Turns, sess.Seqs = epoch, summary, turns, seqs
	o.cacheSession(*sess)
	return nil
}

// condenseInstruction asks the backend for the summary that replaces the
// prunable history.
const condenseInstruction = "Condense the conversation above into a short summary. Keep every fact, name, number and decision; drop greetings and repetition."

// condense makes room when a request is still too large after compaction:
// the prunable (not pinned) turns and any earlier summary are summarized by
// the backend in a separate call, and the summary, stored with a new epoch,
// replaces them. If even the summarizing prompt does not fit, the oldest
// prunable turns are dropped from it first, and that is reported as well.
func (o *Orchestrator) condense(ctx context.Context, id string, sess *ctxd.Session, rc *runcontext.RunContext, lim governor.Limits) ([]ctxd.Action, error) {
	var prunable, pinned []int
	for i, t := range sess.Turns {
		if t.Verbatim {
			pinned = append(pinned, i)
		} else {
			prunable = append(prunable, i)
		}
	}
	if len(prunable) == 0 {
		return nil, nil // nothing the governor may touch: the request is refused as it is
	}
	crc := *rc
	crc.Query = runcontext.Query{Text: condenseInstruction}
	var actions []ctxd.Action
	var m measured
	skip := 0
	for ; ; skip++ {
		turns := make([]ctxd.Turn, 0, len(prunable)-skip)
		for _, i := range prunable[skip:] {
			turns = append(turns, sess.Turns[i])
		}
		crc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: turns}
		var err error
		if m, err = o.measure(&crc, ""); err != nil {
			return nil, err
		}
		if _, err := lim.Check(m.Measure); err == nil {
			if skip > 0 {
				actions = append(actions, ctxd.Action{
					Kind:         ctxd.ActionPrune,
					Reason:       fmt.Sprintf("even the summarizing prompt did not fit; the oldest %d turns were left out of the summary", skip),
					TurnsDropped: skip,
				})
			}
			break
		}
		if skip == len(prunable) {
			return nil, nil // the stable blocks and the query alone do not fit: condensing cannot help
		}
	}
	gen, err := o.generateAside(ctx, id, m, lim.AnswerReserve)
	if err != nil {
		return nil, err
	}
	summary := strings.TrimSpace(gen.Text)
	if summary == "" {
		return nil, ctxd.Errorf(ctxd.KindBackend, "orchestrator: condense history: the backend returned an empty summary")
	}
	dropped := m.BlockTokens[runcontext.BlockState]
	if err := o.newEpoch(ctx, id, sess, pinned, summary); err != nil {
		return nil, err
	}
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := ctxd.Action{
		Kind:         ctxd.ActionCondense,
		Reason:       fmt.Sprintf("the request did not fit; %d prunable turns were summarized by the backend (%d tokens)", len(prunable), gen.EvalCount),
		TurnsDropped: len(prunable) - skip, TokensDropped: dropped, Epoch: sess.Epoch,
	}
	o.log.InfoContext(ctx, "condensed history", "session", id, "epoch", act.Epoch, "turns", act.TurnsDropped, "state_tokens_before", dropped)
	return append(actions, act), nil
}

// describe lists actions for an error message.
func describe(actions []ctxd.Action) string {
	parts := make([]string, len(actions))
	for i, a := range actions {
		parts[i] = a.Kind + ": " + a.Reason
	}
	return strings.Join(parts, "; ")
}

// generateAside runs a prompt of the governor's own (a condensation) on a
// backend slot, taking its turn in the queue like any request.
func (o *Orchestrator) generateAside(ctx context.Context, session string, m measured, reserve int) (ctxd.Generation, error) {
	lease, err := o.sched.Acquire(ctx, session, m.tokens.IDs)
	if err != nil {
		return ctxd.Generation{}, err
	}
	defer lease.Release()
	gen, _, err := o.generate(ctx, lease, m.Rendered.Prompt(), m.tokens.IDs, reserve, func(string) error { return nil })
	if err != nil {
		return gen, fmt.Errorf("orchestrator: condense history: %w", err)
	}
	return gen, nil
}

// clientTools are the client's tools the sigil's scopes allow, as the
// sigil block renders them, and the names of those they do not.
func clientTools(sigil runcontext.Sigil, tools []ctxd.Tool) (offered []runcontext.ClientTool, refused []string) {
	for _, t := range tools {
		if !sigils.AllowsTool(sigil, t.Name) {
			refused = append(refused, t.Name)
			continue
		}
		params := ""
		if p := bytes.TrimSpace(t.Parameters); len(p) > 0 && string(p) != "null" {
			var ok bool
			if params, ok = toolcall.Canonical(p); !ok {
				params = string(p) // Validate names it
			}
		}
		offered = append(offered, runcontext.ClientTool{Name: t.Name, Description: t.Description, Parameters: params})
	}
	// One order whatever the client's: a client that lists its tools from
	// a map must not break the sigil block every turn.
	slices.SortStableFunc(offered, func(a, b runcontext.ClientTool) int { return strings.Compare(a.Name, b.Name) })
	return offered, refused
}
