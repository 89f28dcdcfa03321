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

// preparation is one request's prompt on its way to the backend: the
// RunContext, what the governor did to it so far, and its count. Its
// methods are prepare's steps, the governor's among them (compaction,
// stale excerpts, excerpts, karma, condensation): each changes the
// session (through the orchestrator's sessions), the RunContext and the
// count together. It belongs to one request's goroutine and needs no lock.
type preparation struct {
	o     *Orchestrator
	ctx   context.Context
	req   ctxd.AskRequest
	sigil runcontext.Sigil // as the sigil block shows it: with the tools it offers
	codex *codexState
	lim   governor.Limits
	tails string // whose conversation the counter extends ("" for an ephemeral ask)

	p         prepared       // what is handed on; p.sess is the session as the steps leave it
	retrieved []ctxd.Excerpt // this question's excerpts from outside the working set
	refresh   bool           // the request's karma refresh is still to be made
	pruned    bool           // the governor pruned karma already
	tally     tally          // the prompt's count
	behind    *writeBehind   // the request's writes behind the prompt
}

// prepare builds and validates the RunContext of a request in session
// sess (fetched by the caller, who holds it), and has the governor make it
// fit: compaction, then leaving out the history's excerpts, then the
// question's, then karma, then condensation, then a refusal with the
// numbers.
func (o *Orchestrator) prepare(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil, sess ctxd.Session, codex *codexState, lim governor.Limits, behind *writeBehind) (prepared, error) {
	g := o.newPreparation(ctx, req, sigil, sess, codex, lim)
	g.behind = behind
	if err := g.chooseKarma(); err != nil {
		return prepared{}, err
	}
	if err := g.retrieve(); err != nil {
		return prepared{}, err
	}
	g.inject()
	if err := g.p.rc.Validate(); err != nil {
		return prepared{}, ctxd.Errorf(ctxd.KindInvalid, "%w", err)
	}
	if err := g.compact(); err != nil {
		return prepared{}, err
	}
	if err := g.fit(); err != nil {
		if errors.Is(err, errRoomMade) {
			return prepared{sess: g.p.sess}, err // the session as the steps left it, for the next try
		}
		return prepared{}, err
	}
	if err := g.storeKarma(); err != nil {
		return prepared{}, err
	}
	if err := g.reportWorkingSet(); err != nil {
		return prepared{}, err
	}
	m := g.tally.exact
	g.p.rendered, g.p.tokens, g.p.budget = m.Rendered, m.tokens, g.tally.budget
	return g.p, nil
}

// newPreparation builds the request's RunContext: the blocks of the
// session, the sigil (with the tools it offers) and the question.
func (o *Orchestrator) newPreparation(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil, sess ctxd.Session, codex *codexState, lim governor.Limits) *preparation {
	g := &preparation{o: o, ctx: ctx, req: req, codex: codex, lim: lim, refresh: req.RefreshKarma}
	if !req.Ephemeral {
		g.tails = req.Session
	}
	sigil.ClientTools, g.p.toolsRefused = clientTools(sigil, req.Tools)
	if tt, ok := o.cfg.Format.(toolTemplate); ok && tt.OffersTools() && len(sigil.ClientTools) > 0 {
		sigil.ToolFormat = runcontext.ToolFormatTemplate
	}
	g.p.sess = sess
	g.p.rc = o.stableContext(req.System, codex.block, sigil)
	g.sigil = g.p.rc.Sigil
	g.p.rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	g.p.rc.Query = runcontext.Query{Text: req.Query}
	return g
}

// chooseKarma sets the karma block. It is chosen once per karma epoch; an
// epoch of the session that the governor begins begins a karma epoch too,
// so each such step chooses again.
func (g *preparation) chooseKarma() error {
	snap, chosen, err := g.o.karma.choose(g.ctx, g.req, g.sigil, g.p.sess.Epoch, g.p.sess.Count == 0, g.refresh, g.codex)
	if err != nil {
		return err
	}
	g.refresh = false
	if chosen || !g.p.karmaChosen { // a choice this request made stands until a new one
		g.p.karma, g.p.karmaChosen = snap, g.p.karmaChosen || chosen
	}
	g.p.rc.Karma = karmaBlock(g.p.karma)
	return nil
}

// retrieve finds the question's codex excerpts in RAG mode, and the codex
// block the working set holds now if there is one.
func (g *preparation) retrieve() error {
	codex, rc := g.codex, g.p.rc
	if codex.block.Mode != runcontext.ModeRAG || codex.retriever == nil {
		return nil
	}
	var err error
	if set, ok := codex.retriever.(WorkingSet); ok {
		var report ctxd.WorkingSet
		retrieve := set.Retrieve
		if g.req.Ephemeral {
			retrieve = set.Peek
		}
		rc.Codex, g.retrieved, report, err = retrieve(g.ctx, g.req.Query, g.o.cfg.TopK)
		g.p.workingSet = &report
	} else {
		g.retrieved, err = codex.retriever.Search(g.ctx, g.req.Query, g.o.cfg.TopK)
	}
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: retrieve codex excerpts: %w", err)
	}
	g.excerptsBack()
	return nil
}

// excerptsBack puts the question's excerpts in the query block, but for
// those the history holds (after a step that changed the history, the
// ones it held may be gone).
func (g *preparation) excerptsBack() {
	g.p.rc.Query.Excerpts = notPresent(g.retrieved, g.p.sess.Turns, g.p.workingSet)
}

// compact applies the message depth: once the history passes max_depth it
// is cut to the low mark in one step and a new epoch begins (and so a new
// karma epoch).
func (g *preparation) compact() error {
	sess, id := &g.p.sess, g.req.Session
	c := g.lim.Compact(sess.Turns)
	if !c.Compacted() {
		return nil
	}
	dropped := 0
	for _, i := range c.Dropped {
		n, err := g.o.count.Text(runcontext.RenderQuery(sess.Turns[i].Query, sess.Turns[i].Excerpts) + runcontext.RenderAnswer(sess.Turns[i].Answer))
		if err != nil {
			return err
		}
		dropped += n
	}
	before := len(sess.Turns)
	if err := g.o.sessions.newEpoch(g.ctx, id, sess, c.Keep, sess.Summary); err != nil {
		return err
	}
	g.p.rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := ctxd.Action{
		Kind:         ctxd.ActionCompact,
		Reason:       fmt.Sprintf("history of %d turns passed max_depth %d; cut to %d in one step", before, g.lim.MaxDepth, len(c.Keep)),
		TurnsDropped: len(c.Dropped), TokensDropped: dropped, Epoch: sess.Epoch,
	}
	g.o.log.InfoContext(g.ctx, "compacted history", "session", id, "epoch", act.Epoch, "turns_dropped", act.TurnsDropped, "tokens_dropped", act.TokensDropped, "reason", act.Reason)
	g.p.actions = append(g.p.actions, act)
	g.excerptsBack()
	return g.chooseKarma()
}

// fit has the governor make the prompt fit the limits. The prompt is
// counted whole once; each step then adjusts the count by what it changed
// (see tally), and what is sent is counted whole again.
func (g *preparation) fit() error {
	if err := g.measureExact(); err != nil {
		return err
	}
	// Fresh excerpts come before stale ones: the history's excerpts go (a
	// new epoch) before any of this question's is left out.
	if g.tally.over() && len(g.retrieved) > 0 && stale(g.p.sess.Turns) > 0 {
		if err := g.dropStale(); err != nil {
			return err
		}
	}
	if err := g.dropExcerpts(); err != nil {
		return err
	}
	if err := g.pruneKarma(); err != nil {
		return err
	}
	if err := g.settle(); err != nil {
		return err
	}
	if g.tally.over() {
		if err := g.makeRoom(); err != nil {
			return err
		}
		if err := g.condense(); err != nil {
			return err
		}
	}
	if err := g.settle(); err != nil {
		return err
	}
	if err := g.tally.err; err != nil {
		if len(g.p.actions) > 0 {
			err = fmt.Errorf("%w (after: %s)", err, describe(g.p.actions))
		}
		return g.clientHint(err)
	}
	return nil
}

// clientHint adds to a refusal what the client's own part of the prompt
// is and what to change, when it is what leaves no room: ctxd gave up
// what it could of its own first.
func (g *preparation) clientHint(err error) error {
	if !g.tally.isExact() || ctxd.KindOf(err) != ctxd.KindDoesNotFit {
		return err
	}
	bt := g.tally.exact.BlockTokens
	return fmt.Errorf("%w. The client's own prompt is %d tokens (tools and system text %d, conversation %d, question %d) beside ctxd's %d (identity, codex, environment, karma): "+
		"send a shorter system prompt or fewer tools, start a new conversation, or serve a bigger window (backend.num_ctx; README: a window for coding agents)",
		err, clientShare(bt), bt[runcontext.BlockSigil], bt[runcontext.BlockState], bt[runcontext.BlockQuery], ctxdShare(bt)+bt[runcontext.BlockCodex])
}

// clientShare is the client's own part of a prompt counted block by
// block: the sigil block (its tools and system text), its conversation
// and its question. ctxdShare is ctxd's part but the codex: identity,
// environment and karma.
func clientShare(bt [runcontext.NumBlocks]int) int {
	return bt[runcontext.BlockSigil] + bt[runcontext.BlockState] + bt[runcontext.BlockQuery]
}

func ctxdShare(bt [runcontext.NumBlocks]int) int {
	return bt[runcontext.BlockIdentity] + bt[runcontext.BlockEnvironment] + bt[runcontext.BlockKarma]
}

// errRoomMade: the codex was planned again to leave room for the
// request's client; the request is prepared again over the new plan.
var errRoomMade = errors.New("orchestrator: the codex was planned again to leave room for the client's prompt")

// makeRoom has the codex leave room for the client's own prompt — its part
// of the sigil block (tools, system text), its conversation and its
// question, with a margin for the conversation to grow — once leaving out
// excerpts and karma was not enough: ctxd's content gives way before the
// client's is condensed or refused (see Room). errRoomMade if the codex
// was planned again.
func (g *preparation) makeRoom() error {
	room := g.o.cfg.Room
	if room == nil || g.codex.block.Mode == runcontext.ModeNone || !g.tally.isExact() {
		return nil
	}
	client, rest := clientShare(g.tally.exact.BlockTokens), ctxdShare(g.tally.exact.BlockTokens)
	budget := g.lim.PromptBudget()
	if client+rest > budget {
		return nil // no share of the codex would make it fit: it is not worth shrinking the codex for everyone
	}
	n := min(client+roomMargin(g.lim, client), budget-rest)
	made, err := room.MakeRoom(g.ctx, n)
	switch {
	case err != nil && g.ctx.Err() != nil:
		return err
	case err != nil:
		g.o.log.WarnContext(g.ctx, "the codex could not be planned again to leave room for a client's prompt", "tokens", n, "err", err)
	case made:
		g.o.log.InfoContext(g.ctx, "the codex was planned again to leave room for a client's prompt", "session", g.req.Session, "tokens", n)
		return errRoomMade
	}
	return nil
}

// roomMargin is what makeRoom adds to a client's prompt of client tokens,
// for its conversation to grow before the codex must shrink again (every
// session then re-evaluates from the codex block on): a tenth of the
// budget, or a quarter of the client's prompt if that is more, so a large
// agent's conversation grows for several turns within it.
func roomMargin(l governor.Limits, client int) int { return max(256, l.PromptBudget()/10, client/4) }

// dropStale leaves the history's excerpts out: a new epoch whose history
// keeps its turns, some or all without their excerpts, and the question's
// own come back in full. Which: when the codex working set would keep
// them (absorb; the conversation is then evaluated again from the codex
// block anyway), all of them; else the newest turns' first, as few as
// make room, so the conversation before them stays in the backend's cache
// (an agent whose every request brings excerpts of its own re-reads the
// turn before, not its whole conversation).
func (g *preparation) dropStale() error {
	sess, id := &g.p.sess, g.req.Session
	before, err := g.o.count.Text(runcontext.RenderState(g.p.rc.State))
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	seqs, n, whole, err := g.staleToDrop()
	if err != nil {
		return err
	}
	all := stale(sess.Turns)
	history := sess.Turns // dropExcerpts leaves it as it is: the working set may keep its excerpts
	if err := g.o.sessions.dropExcerpts(g.ctx, id, sess, seqs); err != nil {
		return err
	}
	g.p.rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	after, err := g.o.count.Text(runcontext.RenderState(g.p.rc.State))
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	act := ctxd.Action{Kind: ctxd.ActionStale, Epoch: sess.Epoch, TokensDropped: max(0, before-after)}
	if whole {
		kept, err := g.absorb(history, before-after)
		if err != nil {
			return err
		}
		act.Reason = fmt.Sprintf("the request did not fit; the history's %d codex excerpts of earlier questions were left out of it (a new epoch) before any of this question's", all)
		if kept > 0 {
			act.Reason += fmt.Sprintf("; the codex working set keeps %d of them and of this question's at its end", kept)
		}
	} else {
		act.Reason = fmt.Sprintf("the request did not fit; %d of the history's %d codex excerpts of earlier questions, those of its last %d turns with excerpts, were left out of it (a new epoch) before any of this question's: the newest first and as few as make room, so the conversation before them stays cached", n, all, len(seqs))
	}
	g.o.log.InfoContext(g.ctx, "stale excerpts left out", "session", id, "epoch", sess.Epoch, "excerpts", n, "of", all, "tokens", act.TokensDropped)
	g.p.actions = append(g.p.actions, act)
	g.excerptsBack()
	if err := g.chooseKarma(); err != nil {
		return err
	}
	return g.adjust()
}

// staleToDrop chooses the history's turns whose excerpts the request
// leaves out (see dropStale), how many excerpts they hold, and whether
// they are all of the history's. The turns are named (nil, for the store
// all of them, only where the session's sequence numbers are unknown), so
// a turn another daemon wrote meanwhile keeps its excerpts.
func (g *preparation) staleToDrop() (seqs []int64, n int, whole bool, err error) {
	turns := g.p.sess.Turns
	if len(g.p.sess.Seqs) != len(turns) {
		return nil, stale(turns), true, nil
	}
	type freed struct{ tokens, chars int }
	per := make([]freed, len(turns))
	total := 0
	var holding []int // the turns with excerpts, newest first
	for i := len(turns) - 1; i >= 0; i-- {
		if len(turns[i].Excerpts) == 0 {
			continue
		}
		holding = append(holding, i)
		var sb strings.Builder
		for _, e := range turns[i].Excerpts {
			sb.WriteString(runcontext.RenderExcerpt(e))
		}
		tokens, err := g.o.count.Text(sb.String())
		if err != nil {
			return nil, 0, false, ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
		}
		per[i] = freed{tokens, sb.Len()}
		total += tokens
	}
	take := len(holding)
	if !g.absorbs(total) {
		// What the prompt is over by, with a margin (counts of pieces
		// are not the prompt's to the token).
		needTokens := g.tally.tokens - g.lim.PromptBudget()
		needTokens += max(32, needTokens/10)
		needChars := 0
		if g.lim.MaxChars > 0 {
			if over := g.tally.r.Len() - g.lim.MaxChars; over > 0 {
				needChars = over + max(128, over/10)
			}
		}
		var got freed
		for take = 0; take < len(holding) && (got.tokens < needTokens || got.chars < needChars); take++ {
			got.tokens += per[holding[take]].tokens
			got.chars += per[holding[take]].chars
		}
	}
	for _, i := range holding[:take] {
		seqs = append(seqs, g.p.sess.Seqs[i])
		n += len(turns[i].Excerpts)
	}
	return seqs, n, take == len(holding), nil
}

// absorbs reports whether the codex working set would keep, at its end,
// the excerpts a new epoch that left out all of the history's (freed
// tokens of them) frees: see absorb. Growing the codex block makes the
// backend evaluate again the blocks between it and the conversation (the
// environment, the client's tools and system text, karma), which the
// epoch alone leaves cached: worth it only when they are smaller than
// what the working set would keep (half of what the history frees). An
// agent's tools (tens of thousands of tokens) never are.
func (g *preparation) absorbs(freed int) bool {
	if _, ok := g.codex.retriever.(Absorber); !ok || g.req.Ephemeral || g.p.workingSet == nil {
		return false
	}
	bt := g.tally.exact.BlockTokens
	return bt[runcontext.BlockEnvironment]+bt[runcontext.BlockSigil]+bt[runcontext.BlockKarma] <= freed/2
}

// absorb has the codex working set keep, at its end, the excerpts a new
// epoch dropped from history (freed: their tokens in the history):
// the question's own first, then the history's, the newest turn first, at
// most half of what the history frees, so the prompt still shrinks. The
// conversation after the codex block is evaluated again anyway at the
// epoch, so they cost only themselves and the few blocks between (see
// below), and later questions find them in the prefix. It returns how
// many excerpts the working set holds now that it did not, and takes the
// question's it holds out of the query.
func (g *preparation) absorb(history []ctxd.Turn, freed int) (int, error) {
	a, ok := g.codex.retriever.(Absorber)
	if !ok || !g.absorbs(freed) {
		return 0, nil
	}
	budget := freed / 2
	var want []ctxd.Excerpt
	seen := map[ctxd.Excerpt]bool{}
	wanted := func(es []ctxd.Excerpt) {
		for _, e := range es {
			if !seen[e] {
				seen[e] = true
				want = append(want, e)
			}
		}
	}
	wanted(g.retrieved)
	for i := len(history) - 1; i >= 0; i-- {
		wanted(history[i].Excerpts)
	}
	block, holds, report, err := a.Absorb(g.ctx, want, budget)
	if err != nil {
		return 0, ctxd.Errorf(ctxd.KindInternal, "orchestrator: the codex working set: %w", err)
	}
	if report.Moved == "" {
		return 0, nil
	}
	ws := g.p.workingSet
	ws.Generation, ws.Files, ws.Tokens, ws.Held, ws.Added, ws.Dropped = report.Generation, report.Files, report.Tokens, report.Held, report.Added, report.Dropped
	if ws.Moved != "" {
		ws.Moved += "; then "
	}
	ws.Moved += report.Moved
	g.p.rc.Codex = block
	kept := 0
	for _, e := range want {
		if holds(e) {
			kept++
		}
	}
	out := g.retrieved[:0]
	for _, e := range g.retrieved {
		if holds(e) {
			ws.Hits++
			continue
		}
		out = append(out, e)
	}
	g.retrieved = out
	return kept, nil
}

// Absorber is a working set that keeps excerpts at its end at a
// conversation's epoch (package codexsvc): it returns the codex block to
// render now, which excerpts it holds, and what it did.
type Absorber interface {
	Absorb(ctx context.Context, excerpts []ctxd.Excerpt, budget int) (runcontext.Codex, func(ctxd.Excerpt) bool, ctxd.WorkingSet, error)
}

// dropExcerpts leaves out the question's excerpts, the lowest-ranked
// first, while the prompt is over: they are the cheapest thing to give up.
func (g *preparation) dropExcerpts() error {
	dropped := 0
	for g.tally.over() && len(g.p.rc.Query.Excerpts) > 0 {
		g.p.rc.Query.Excerpts = g.p.rc.Query.Excerpts[:len(g.p.rc.Query.Excerpts)-1]
		dropped++
		if err := g.adjust(); err != nil {
			return err
		}
	}
	if dropped > 0 {
		g.p.actions = append(g.p.actions, ctxd.Action{Kind: ctxd.ActionExcerpts,
			Reason: fmt.Sprintf("%d lowest-ranked codex excerpts left out to fit the window", dropped), Epoch: g.p.sess.Epoch})
	}
	return nil
}

// pruneKarma leaves out karma while the prompt is over, by score, lowest
// first; pinned entries stay.
func (g *preparation) pruneKarma() error {
	for g.tally.over() {
		act, ok := g.o.karma.prune(&g.p.karma, g.p.karmaChosen, !g.pruned, g.p.rc)
		if !ok {
			return nil
		}
		g.pruned, g.p.karmaChosen = true, true
		g.p.actions = append(g.p.actions, act)
		if err := g.adjust(); err != nil {
			return err
		}
	}
	return nil
}

// condense has the backend summarize the prunable history (the caller
// found the prompt over, exactly). The condensed history holds no
// excerpts: the question's own come back, and excerpts and karma are given
// up again as far as needed.
func (g *preparation) condense() error {
	condenseStart := g.o.cfg.Now()
	acts, err := g.condenseHistory()
	g.p.condensing = g.o.cfg.Now().Sub(condenseStart)
	g.p.actions = append(g.p.actions, acts...)
	if err != nil || len(acts) == 0 {
		return err
	}
	g.excerptsBack()
	if err := g.chooseKarma(); err != nil {
		return err
	}
	if err := g.adjust(); err != nil {
		return err
	}
	if err := g.dropExcerpts(); err != nil {
		return err
	}
	return g.pruneKarma()
}

// storeKarma stores the karma epoch this request begins, now that its
// prompt fits: a refused request leaves no epoch that was never shown.
// The prompt holds the epoch's block already, so the write is made behind
// it, while the backend evaluates it; the answer is recorded only once
// the write is made.
func (g *preparation) storeKarma() error {
	if g.p.karmaChosen && !g.req.Ephemeral && g.o.karma.on() && sigils.Allows(g.sigil, sigils.ScopeKarmaRead) {
		snap := g.p.karma
		g.behind.queue(func() error { return g.o.karma.save(g.ctx, snap) })
	}
	return nil
}

// reportWorkingSet completes the working set's report with the excerpts
// the prompt holds.
func (g *preparation) reportWorkingSet() error {
	ws := g.p.workingSet
	if ws == nil {
		return nil
	}
	ws.ExcerptsNew = len(g.p.rc.Query.Excerpts)
	if ws.ExcerptsNew > 0 {
		bare, err := g.o.count.Text(runcontext.RenderQuery(g.p.rc.Query.Text, nil))
		if err != nil {
			return ctxd.Errorf(ctxd.KindInternal, "orchestrator: count the query: %w", err)
		}
		ws.ExcerptTokensNew = max(0, g.tally.exact.BlockTokens[runcontext.BlockQuery]-bare)
	}
	return nil
}

// inject adds the formatters' artifacts to the RunContext. A formatter that fails adds
// nothing and is logged; the others' artifacts stand.
func (g *preparation) inject() {
	o, rc, codex := g.o, g.p.rc, g.codex
	in := formatters.Input{RunContext: rc}
	if o.cfg.CodexFile != nil && codex.block.Mode != runcontext.ModeNone {
		in.CodexFile, in.CodexFingerprint = o.cfg.CodexFile, codex.fingerprint
	}
	arts, err := o.cfg.Formatters.Apply(g.ctx, in)
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

// measured is a rendered prompt, its tokens and the governor's view of it.
type measured struct {
	governor.Measure
	tokens tokencount.Tokens
}

// measure renders rc and counts its tokens: the whole prompt exactly, and
// each block on its own.
func (g *preparation) measure(rc *runcontext.RunContext, session string) (measured, error) {
	r, err := g.o.cfg.Format.Render(rc)
	if err != nil {
		return measured{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: render the prompt: %w", err)
	}
	t, err := g.o.count.Prompt(r, session)
	if err != nil {
		return measured{}, ctxd.Errorf(ctxd.KindInternal, "orchestrator: count prompt tokens: %w", err)
	}
	return measured{
		Measure: governor.Measure{Rendered: r, PromptTokens: len(t.IDs), BlockTokens: t.Blocks, KVBytes: g.o.cfg.KVBytes},
		tokens:  t,
	}, nil
}

// condenseInstruction asks the backend for the summary that replaces the
// prunable history.
const condenseInstruction = "Condense the conversation above into a short summary. Keep every fact, name, number and decision; drop greetings and repetition."

// condenseHistory makes room when a request is still too large after
// compaction: the prunable (not pinned) turns and any earlier summary are
// summarized by the backend in a separate call, and the summary, stored
// with a new epoch, replaces them. If even the summarizing prompt does not
// fit, the oldest prunable turns are dropped from it first, and that is
// reported as well.
func (g *preparation) condenseHistory() ([]ctxd.Action, error) {
	sess, id, rc := &g.p.sess, g.req.Session, g.p.rc
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
		if m, err = g.measure(&crc, ""); err != nil {
			return nil, err
		}
		if _, err := g.lim.Check(m.Measure); err == nil {
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
	gen, err := g.generateAside(m)
	if err != nil {
		return nil, err
	}
	summary := strings.TrimSpace(gen.Text)
	if summary == "" {
		return nil, ctxd.Errorf(ctxd.KindBackend, "orchestrator: condense history: the backend returned an empty summary")
	}
	dropped := m.BlockTokens[runcontext.BlockState]
	if err := g.o.sessions.newEpoch(g.ctx, id, sess, pinned, summary); err != nil {
		return nil, err
	}
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := ctxd.Action{
		Kind:         ctxd.ActionCondense,
		Reason:       fmt.Sprintf("the request did not fit; %d prunable turns were summarized by the backend (%d tokens)", len(prunable), gen.EvalCount),
		TurnsDropped: len(prunable) - skip, TokensDropped: dropped, Epoch: sess.Epoch,
	}
	g.o.log.InfoContext(g.ctx, "condensed history", "session", id, "epoch", act.Epoch, "turns", act.TurnsDropped, "state_tokens_before", dropped)
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
// backend slot, taking its turn in the queue like any request, for an
// answer of at most the answer reserve.
func (g *preparation) generateAside(m measured) (ctxd.Generation, error) {
	lease, err := g.o.sched.Acquire(g.ctx, g.req.Session, m.tokens.IDs)
	if err != nil {
		return ctxd.Generation{}, err
	}
	defer lease.Release()
	gen, _, err := g.o.generate(g.ctx, lease, route{session: g.req.Session, parent: g.req.Parent}, m.Rendered.Prompt(), m.tokens.IDs, g.lim.AnswerReserve, func(string) error { return nil })
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
