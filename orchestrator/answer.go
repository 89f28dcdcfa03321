package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/toolcall"
)

// answering is one prepared request on its way from the backend to its
// client and its session: the backend slot it holds, its summary as it
// fills in, and the recording of its answer. Its methods are ask's steps
// after prepare, in order: acquireSlot, summarize, capAnswer,
// generateAnswer, account, record, answered. It belongs to one request's
// goroutine and needs no lock.
type answering struct {
	o      *Orchestrator
	ctx    context.Context
	req    ctxd.AskRequest
	p      *prepared
	codex  *codexState   // the codex the request was prepared with
	behind *writeBehind  // the request's writes behind the prompt: made before its answer is recorded
	slot   slotted       // the backend slot; set by acquireSlot
	sum    *ctxd.Summary // the summary; set by summarize
}

// slotted is a prepared request's backend slot, and the saved stable
// prefix (warm restarts) it may restore or save.
type slotted struct {
	lease    *scheduler.Lease
	fp       string // the stable prefix's fingerprint; "" without warm restarts
	prefix   []int  // the stable prefix's tokens
	restored time.Duration
}

// acquireSlot waits for a backend slot for the prompt, and restores the
// saved stable prefix into it if that is cheaper than evaluating it.
func (a *answering) acquireSlot() error {
	o, p, s := a.o, a.p, &a.slot
	restorable := 0
	if o.warm != nil && p.tokens.Prefix > 0 {
		s.prefix = p.tokens.IDs[:p.tokens.Prefix]
		s.fp = o.warm.fingerprint(s.prefix)
		restorable = o.warm.restorable(s.fp, len(s.prefix))
	}
	lease, err := o.sched.AcquireRestorable(a.ctx, a.req.Session, p.tokens.IDs, restorable)
	if err != nil {
		return o.stopped(a.ctx, a.req.Session, "while it waited for a backend slot; nothing was sent to the backend", false, err)
	}
	s.lease = lease
	restoreStart := o.cfg.Now()
	if lease.Restore && o.warm.restore(a.ctx, lease, s.fp, s.prefix) {
		lease.Cached = len(s.prefix)
	}
	s.restored = o.cfg.Now().Sub(restoreStart)
	return nil
}

// summarize starts the request's summary with what is known before the
// answer: the prompt, its reuse, and where its prefix broke.
func (a *answering) summarize(sessionWait time.Duration, followed bool) {
	o, req, p := a.o, a.req, a.p
	rc, lease := p.rc, a.slot.lease
	sum := &ctxd.Summary{
		RequestID: reqid.From(a.ctx),
		Session:   req.Session, Turn: p.sess.Count + 1, Mode: rc.Codex.Mode, Format: o.cfg.Format.Name(), Codex: a.codex.plan, Excerpts: len(rc.Query.Excerpts), WorkingSet: p.workingSet,
		PromptTokens: len(p.tokens.IDs), CachedTokens: lease.Cached, Budget: p.budget, Epoch: rc.State.Epoch, Governor: p.actions,
		QueueWaitMs: ms(sessionWait + lease.Waited), QueueAhead: lease.Ahead, Slot: lease.Slot,
		Karma: karmaInfo(p.karma, p.karmaChosen),
	}
	a.sum = sum
	sum.ClientTokens = clientShare(p.tokens.Blocks)
	if ws := p.workingSet; ws != nil {
		sum.ClientTokens = max(0, sum.ClientTokens-ws.ExcerptTokensNew)
	}
	sum.EvaluatedTokens = sum.PromptTokens - sum.CachedTokens
	sum.ReusePercent = 100 * float64(sum.CachedTokens) / float64(max(1, sum.PromptTokens))
	prev, hadPrev := o.prompts.get(req.Session)
	switch {
	case req.Ephemeral:
		sum.PrefixNote = "a question outside any conversation: nothing is recorded"
	case hadPrev:
		sum.PrefixBreak = runcontext.Compare(prev.rendered, p.rendered, prev.answer)
	case p.sess.Count == 0:
		sum.PrefixNote = "first turn of the session"
	default:
		sum.PrefixNote = "no earlier prompt of this session since the daemon started"
	}
	switch {
	case followed && p.sess.Count == len(p.sess.Turns): // it held no turn before
		sum.PrefixNote = "a new session: it took its client's history"
	case followed:
		sum.PrefixNote = "the session took its client's history, which did not extend the turns it held (a new epoch)"
	}
	if hadPrev && lease.Previous != "" && lease.Previous != req.Session {
		// Named only to the sigil that owns it: another sigil's session id
		// is its own business (as in status).
		who := "another sigil's session"
		if _, owner, ok := a.o.LastPrompt(lease.Previous); ok && owner == p.rc.Sigil.Name {
			who = fmt.Sprintf("session %q", ctxd.ClientSessionID(lease.Previous))
		}
		sum.SlotNote = fmt.Sprintf("slot %d served %s since this session's last turn: this conversation's tokens after the prefix the two share were evaluated again",
			lease.Slot, who)
	}
	if sum.PrefixBreak != nil && sum.PrefixBreak.Block == runcontext.BlockNames[runcontext.BlockCodex] {
		if c := codexChange(prev.codex, p.rc.Codex.Files); c != "" {
			sum.PrefixBreak.Reason += ": " + c
		}
	}
	if sum.PrefixBreak != nil && sum.PrefixBreak.Block == runcontext.BlockNames[runcontext.BlockKarma] && p.karmaChosen {
		sum.PrefixBreak.Reason = fmt.Sprintf("karma epoch %d began: %s", p.karma.KarmaEpoch, p.karma.Reason)
	}
	if sum.PrefixBreak != nil {
		o.log.InfoContext(a.ctx, "prefix break", "session", req.Session, "block", sum.PrefixBreak.Block, "reason", sum.PrefixBreak.Reason)
	}
}

// capAnswer is the length the answer may reach: the client's cap, the
// answer reserve, or the low-power reserve while power is low (an action
// the summary reports).
func (a *answering) capAnswer(lim governor.Limits) int {
	rc := a.p.rc
	capped := answerCap(a.req.MaxTokens, lim)
	if low := a.o.cfg.LowPowerReserve; low > 0 && low < capped && lowPower(rc.Environment.Power) {
		capped = low
		a.sum.Governor = append(a.sum.Governor, ctxd.Action{Kind: ctxd.ActionLowPower, Epoch: rc.State.Epoch,
			Reason: fmt.Sprintf("power is %s: the answer is capped at %d tokens (limits.low_power_answer_reserve)", rc.Environment.Power, low)})
	}
	return capped
}

// answerCap is the length an answer may reach: the client's cap where it
// is under the answer reserve, else the reserve.
func answerCap(asked int, lim governor.Limits) int {
	if asked > 0 && asked < lim.AnswerReserve {
		return asked
	}
	return lim.AnswerReserve
}

// lowPower reports whether a power band asks for shorter answers.
func lowPower(band string) bool { return band == "low_battery" || band == "low_power" }

// generateAnswer sends the prompt to the slot and streams the answer to
// onToken; first is when its first piece left for the client. The slot is
// saved for warm restarts if its prefix is not yet, and released once what
// it holds is recorded.
func (a *answering) generateAnswer(answerCap int, onToken func(string) error) (gen ctxd.Generation, first time.Time, err error) {
	o, ctx, p, s := a.o, a.ctx, a.p, a.slot
	gen, streamed, err := o.generate(ctx, s.lease, route{session: a.req.Session, parent: a.req.Parent}, p.rendered.Prompt(), p.tokens.IDs, answerCap, func(piece string) error {
		if first.IsZero() {
			first = o.cfg.Now()
		}
		return onToken(piece)
	})
	// The answer is generated: the writes behind it may use the machine.
	a.behind.open()
	if first.IsZero() { // an empty answer: its end is its first token
		first = o.cfg.Now()
	}
	if err == nil && s.fp != "" {
		o.warm.save(ctx, s.lease, s.fp, len(s.prefix))
	}
	s.lease.Release() // what the slot holds is recorded: the next request may start
	if err != nil {
		if ctx.Err() != nil || ctxd.KindOf(err) == ctxd.KindCanceled {
			return gen, first, o.stopped(ctx, a.req.Session, "during its answer; the backend was told to stop", streamed, err)
		}
		return gen, first, err
	}
	if gen.PromptEvalCount > 0 && gen.PromptEvalCount != len(p.tokens.IDs) {
		// Ollama counts every prompt token, cached or not: a difference
		// means ctxd's count is off.
		o.log.WarnContext(ctx, "token count differs from the backend's", "ctxd", len(p.tokens.IDs), "backend", gen.PromptEvalCount)
		o.count.WholePrompts()
	}
	return gen, first, nil
}

// answerTimes are the moments and spans a request's timing is made of.
type answerTimes struct {
	arrived  time.Time     // the request arrived
	first    time.Time     // the answer's first piece left for the client
	governed time.Duration // the governor's time, condensation included
}

// account fills in the summary's answer: its length, how it ended, what
// the backend reused, and where the time to the first token went.
func (a *answering) account(gen ctxd.Generation, at answerTimes) {
	o, ctx, sum := a.o, a.ctx, a.sum
	sum.AnswerTokens = gen.EvalCount
	if gen.DoneReason == ctxd.DoneIncomplete {
		// The answer is kept (the backend's cache holds it, and the next
		// turn extends it) but marked; its tokens are counted here since
		// the backend did not report them.
		if n, err := o.count.Text(gen.Text); err == nil {
			sum.AnswerTokens = n
		}
		sum.DoneNote = "the backend ended the answer without its final message, so the answer may be cut short"
		if gen.PromptEvalCount == 0 {
			sum.DoneNote += " and the backend's timings are missing"
		}
		if gen.Note != "" {
			sum.DoneNote += " (" + gen.Note + ")"
		}
		o.log.WarnContext(ctx, "answer incomplete: the backend ended the stream without its final message", "session", sum.Session, "answer_tokens", sum.AnswerTokens)
	}
	if gen.BackendCached >= 0 {
		// Measured figures win: what the backend evaluated is what it
		// says it evaluated, whatever ctxd expected.
		n := gen.BackendCached
		sum.BackendCachedTokens = &n
		total := sum.PromptTokens
		if gen.PromptEvalCount > 0 {
			total = gen.PromptEvalCount
		}
		sum.EvaluatedTokens = max(0, total-n)
		sum.ReusePercent = 100 * float64(n) / float64(max(1, total))
		sum.ReuseNote = reuseNote(sum.CachedTokens, n, sum.PromptTokens, a.slot.lease.AfterStop)
		if a.slot.lease.AfterStop && n > sum.CachedTokens && o.cfg.Spent != nil {
			// The stopped request read more of this prompt than the
			// backend had reported when it stopped (it notices a stop
			// between batches): its work, reported late.
			o.cfg.Spent(n-sum.CachedTokens, 0)
		}
		if sum.ReuseNote != "" && n < sum.CachedTokens {
			o.log.WarnContext(ctx, "the backend reused less than expected", "session", sum.Session, "slot", sum.Slot,
				"expected", sum.CachedTokens, "measured", n, "note", sum.ReuseNote)
		}
	}
	sum.TTFTMillis = ms(at.first.Sub(at.arrived))
	sum.Timing = ctxd.Timing{QueueWaitMs: sum.QueueWaitMs, GovernorMs: ms(at.governed), CondenseMs: ms(a.p.condensing),
		RestoreMs: ms(a.slot.restored), BackendTTFTMs: ms(gen.TTFT)}
	t := sum.Timing
	sum.Timing.OtherMs = max(0, sum.TTFTMillis-t.QueueWaitMs-t.GovernorMs-t.RestoreMs-t.BackendTTFTMs)
	sum.PromptEvalMs = ms(gen.PromptEvalDuration)
	sum.BackendPromptN = gen.PromptEvalCount
	sum.DoneReason = gen.DoneReason
	sum.TotalMillis = ms(o.cfg.Now().Sub(at.arrived))
}

// reuseNote explains a backend's measured reuse that differs from ctxd's
// expectation; "" when they agree. afterStop: the slot's last request was
// stopped while the backend read its prompt.
func reuseNote(expected, measured, prompt int, afterStop bool) string {
	switch {
	case measured == expected, measured == prompt-1 && expected == prompt:
		return "" // a backend always evaluates at least the last token
	case measured > expected && afterStop:
		return fmt.Sprintf("the backend reused %d tokens, %d more than ctxd expected: the slot's last request was stopped while its prompt was read, and the backend had read more of it than it had reported", measured, measured-expected)
	case measured > expected:
		return fmt.Sprintf("the backend reused %d tokens, %d more than ctxd expected: the slot held more of this prompt than ctxd counted on (the previous answer's tokens, a restored slot's conversation, or chunks after a change that the server shifted: backend.cache_reuse)", measured, measured-expected)
	}
	return fmt.Sprintf("the backend reused %d tokens, %d fewer than ctxd expected: the slot lost part of its prefix (server restarted, cache evicted, or another client used the slot)", measured, expected-measured)
}

// record reads the answer's tool calls into the summary and, unless the
// ask is ephemeral, records the answer: as a trace, as the session's turn,
// and as the session's last prompt (to find where the next one breaks).
func (a *answering) record(text string) error {
	o, req, p := a.o, a.req, a.p
	answer := a.toolCalls(text)
	if req.Ephemeral {
		return nil
	}
	if err := a.behind.wait(); err != nil {
		return a.behind.notRecorded(err)
	}
	var err error
	if a.sum.Trace, err = o.karma.recordTrace(a.ctx, req, p.rc, p.rendered, answer, a.codex, p.workingSet); err != nil {
		return err
	}
	if err := a.recordTurn(answer); err != nil {
		return err
	}
	o.prompts.put(req.Session, previous{rendered: p.rendered, answer: o.cfg.Format.Answer(answer), sigil: p.rc.Sigil.Name, codex: p.rc.Codex.Files})
	return nil
}

// recordTurn stores the turn, with the summary, and updates the session
// as held in memory. The write is not cancelled with the request (the
// backend already holds the answer in its cache, and the next turn must
// extend it), but bounded.
func (a *answering) recordTurn(answer string) error {
	js, err := json.Marshal(a.sum)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	turn := ctxd.Turn{Query: a.req.Query, Excerpts: a.p.rc.Query.Excerpts, Answer: answer, Verbatim: a.req.Pin}
	return a.o.sessions.appendTurn(a.ctx, a.req.Session, a.p.sess, turn, js)
}

// toolTemplate is a prompt format whose chat template may offer the
// client's tools and write calls in a syntax of its own
// (chattemplate.Format).
type toolTemplate interface {
	OffersTools() bool
	ToolSyntax() (toolcall.Syntax, bool)
}

// ToolSyntax is the syntax the model's chat template writes a tool call
// in, read in every answer besides ctxd's protocol; the zero Syntax when
// the template writes none.
func (o *Orchestrator) ToolSyntax() toolcall.Syntax {
	if tt, ok := o.cfg.Format.(toolTemplate); ok {
		if syn, writes := tt.ToolSyntax(); writes {
			return syn
		}
	}
	return toolcall.Syntax{}
}

// toolCalls reads the answer's calls to the client's tools into the
// summary and returns the answer as the session records it: a tool call in
// its canonical text (what a door renders when the client sends it back),
// anything else as it is. A call to a tool the sigil did not offer is
// refused: the answer stays text, and the summary says why.
func (a *answering) toolCalls(answer string) string {
	sum, sigil, notOffered := a.sum, a.p.rc.Sigil, a.p.toolsRefused
	var notes []string
	if len(notOffered) > 0 {
		sum.ToolsRefused = append(sum.ToolsRefused, notOffered...)
		notes = append(notes, fmt.Sprintf("sigil %q may not offer the model %s (it needs the scope tools, or tool:NAME): not offered",
			sigil.Name, strings.Join(notOffered, ", ")))
	}
	if len(sigil.ClientTools) > 0 {
		names := make([]string, len(sigil.ClientTools))
		for i, t := range sigil.ClientTools {
			names[i] = t.Name
		}
		calls, refused, ok := a.o.ToolSyntax().Parse(answer, names)
		switch {
		case ok && len(refused) > 0:
			sum.ToolsRefused = append(sum.ToolsRefused, refused...)
			notes = append(notes, fmt.Sprintf("the answer called %s, which sigil %q was not offered: refused, the answer stays text",
				strings.Join(refused, ", "), sigil.Name))
			a.o.log.Warn("tool call refused: not offered to the sigil", "session", sum.Session, "sigil", sigil.Name, "tools", refused)
		case ok:
			sum.ToolCalls = calls
			answer = toolcall.Render(calls)
		}
	}
	sum.ToolNote = strings.Join(notes, "; ")
	return answer
}

// answered reports the answered request: to status, to the observer (the
// daemon's metrics) and in the log.
func (a *answering) answered() {
	o, sum := a.o, a.sum
	o.last.Store(sum)
	if o.cfg.Observe != nil {
		o.cfg.Observe(a.ctx, a.p.rc.Sigil.Name, sum)
	}
	o.log.InfoContext(a.ctx, "answered", "session", sum.Session, "turn", sum.Turn, "slot", sum.Slot, "prompt_tokens", sum.PromptTokens,
		"cached_tokens", sum.CachedTokens, "ttft_ms", sum.TTFTMillis, "queue_wait_ms", sum.QueueWaitMs,
		"governor_ms", sum.Timing.GovernorMs, "backend_ttft_ms", sum.Timing.BackendTTFTMs, "done", sum.DoneReason)
}
