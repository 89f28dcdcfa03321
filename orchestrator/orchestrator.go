package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/formatters/standard"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
	"github.com/ctxd/ctxd/toolcall"
)

// Config is what the orchestrator needs besides its collaborators.
type Config struct {
	Identity runcontext.Identity
	Format   runcontext.Format // how prompts are rendered; nil: runcontext.Plain{}
	Limits   governor.Limits
	KVBytes  func(tokens int) int64 // KV cache size of a prompt; nil: not reported
	Sigils   *sigils.Registry
	TopK     int         // excerpts per query in RAG mode
	Warm     *WarmConfig // saved slots for warm restarts (llama-server); nil: none
	Karma    KarmaConfig // traces and the karma block; a nil store: none
	// Formatters inject artifacts into the blocks (the tool manifest, the
	// project's conventions file, extensions); nil: the shipped ones.
	Formatters *formatters.Registry
	// CodexFile reads a file of the loaded codex (secrets redacted), for
	// the formatters; nil: they read none.
	CodexFile func(path string) (string, error)
	// LowPowerReserve caps every answer at this many tokens while the
	// environment's power band is low_battery or low_power; 0: no cap.
	LowPowerReserve int
	// Observe is told of every answer's summary (the daemon's metrics);
	// nil: nobody. It must not block.
	Observe func(ctx context.Context, sum *ctxd.Summary)
	// StoreTimeout bounds each call a request makes to the session and
	// karma stores (reading and claiming the session, taking its client's
	// history, new epochs, the turn, karma snapshots and traces), so that a
	// stuck store fails its requests instead of holding them; 0:
	// DefaultStoreTimeout. A call past it fails the request with
	// KindUnavailable (KindNotRecorded once the answer streamed).
	StoreTimeout time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
}

// Orchestrator serves requests. It is safe for concurrent use: requests of
// different sessions run concurrently as far as the scheduler's slots
// allow, and nothing it holds a lock on waits for a backend or a disk.
type Orchestrator struct {
	cfg     Config
	backend ctxd.Backend
	count   *tokencount.Counter
	env     ctxd.Sensor
	sched   *scheduler.Scheduler
	warm    *warmer // nil without warm restarts
	log     *slog.Logger

	view atomic.Pointer[view]         // the codex and the limits requests see now, swapped together
	last atomic.Pointer[ctxd.Summary] // the last answered request, for status

	sessions *sessions  // the session store's calls and the sessions held in memory
	karma    *karmaBook // the karma store's calls and each session's karma snapshot

	mu      sync.Mutex          // guards prompts; held only to read or write it
	prompts map[string]previous // the previous request of each session since start
}

// view is what a request prepares with: the codex and the governor's
// limits it was planned under, swapped as one, so that no request pairs
// new limits with an old plan or the other way round.
type view struct {
	codex  *codexState
	limits governor.Limits
}

// codexState is the codex requests see now, swapped whole.
type codexState struct {
	block       runcontext.Codex // prerendered once
	plan        ctxd.CodexPlan
	retriever   ctxd.Retriever // nil in CAG mode
	fingerprint string         // of the codex's content, for karma's relevance ("" for none)
}

// previous is what a session sent last, to find where a prefix broke.
type previous struct {
	rendered runcontext.Rendered
	answer   string // as the format renders it into the next prompt
	sigil    string // the sigil it was sent as
}

// New returns an orchestrator with no codex (SetCodex sets one).
func New(cfg Config, backend ctxd.Backend, count *tokencount.Counter, store ctxd.Store, env ctxd.Sensor, sched *scheduler.Scheduler) (*Orchestrator, error) {
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	if cfg.Sigils == nil {
		return nil, errors.New("orchestrator: no sigil registry")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Format == nil {
		cfg.Format = runcontext.Plain{}
	}
	if cfg.Formatters == nil {
		cfg.Formatters = standard.Default(standard.Options{Logger: cfg.Logger})
	}
	log := cfg.Logger.With("component", "orchestrator")
	deadline := storeDeadline{timeout: cfg.StoreTimeout}
	o := &Orchestrator{
		cfg: cfg, backend: backend, count: count, env: env, sched: sched, log: log,
		sessions: newSessions(store, deadline, cfg.Sigils, cfg.Now, log),
		karma:    newKarmaBook(cfg.Karma, deadline, cfg.Now, log),
		prompts:  map[string]previous{},
	}
	if cfg.Karma.Store != nil {
		opts := cfg.Karma.Options
		opts.Now = time.Unix(1, 0) // set per choice; every other field must be valid now
		if err := opts.Validate(); err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
	}
	if cfg.Warm != nil && cfg.Warm.Store != nil {
		o.warm = newWarmer(*cfg.Warm, o.log)
	}
	o.SetCodex(runcontext.Codex{Mode: runcontext.ModeNone}, ctxd.CodexPlan{Mode: runcontext.ModeNone, Reason: "no codex configured"}, nil, cfg.Limits)
	return o, nil
}

// SetCodex makes block (prerendered, here if not before) the codex
// requests see, with its plan, the limits it was planned under, and, in
// RAG mode, the retriever of its excerpts: requests get the codex and
// the limits together. The next request renders the new codex block, so
// the backend rebuilds its cached prefix from there. Limits that do not
// fit the model's window leave the limits as they are.
func (o *Orchestrator) SetCodex(block runcontext.Codex, plan ctxd.CodexPlan, r ctxd.Retriever, limits governor.Limits) {
	if !block.Prerendered() {
		block.Prerender(o.cfg.Format.Specials())
	}
	c := &codexState{block: block, plan: plan, retriever: r, fingerprint: codexFingerprint(block)}
	for {
		cur := o.view.Load()
		next := &view{codex: c, limits: limits}
		if cur != nil && o.checkLimits(limits) != nil {
			o.log.Error("a codex planned under limits that do not fit the model's window; keeping the limits in force", "limits", fmt.Sprintf("%+v", limits))
			next.limits = cur.limits
		}
		if o.view.CompareAndSwap(cur, next) {
			return
		}
	}
}

// Limits are the governor's limits now.
func (o *Orchestrator) Limits() governor.Limits { return o.view.Load().limits }

// SetLimits makes l the governor's limits for requests that begin
// preparing after it (a reloaded configuration), with the codex as it is.
// The window (NumCtx) is the model's and cannot change here.
func (o *Orchestrator) SetLimits(l governor.Limits) error {
	if err := o.checkLimits(l); err != nil {
		return err
	}
	for {
		cur := o.view.Load()
		if o.view.CompareAndSwap(cur, &view{codex: cur.codex, limits: l}) {
			return nil
		}
	}
}

// checkLimits is nil for limits that fit the model's window.
func (o *Orchestrator) checkLimits(l governor.Limits) error {
	if n := o.cfg.Limits.NumCtx; l.NumCtx != n {
		return fmt.Errorf("orchestrator: the window is %d tokens and cannot change to %d without reloading the model", n, l.NumCtx)
	}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	return nil
}

// LastSummary is the summary of the last answered request, or nil.
func (o *Orchestrator) LastSummary() *ctxd.Summary { return o.last.Load() }

// LastPrompt is the prompt the session's last request sent to the backend
// since this daemon started, block by block, and the sigil it was sent as;
// false if there is none.
func (o *Orchestrator) LastPrompt(id string) (runcontext.Rendered, string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.prompts[id]
	return p.rendered, p.sigil, ok
}

// Stop is the stop sequences every request sends with its prompt.
func (o *Orchestrator) Stop() []string { return o.cfg.Format.Stop() }

// DeleteSession deletes a session once its running request, if any, has
// finished, and forgets everything held of it.
func (o *Orchestrator) DeleteSession(ctx context.Context, id string) error {
	if err := ctxd.CheckSessionID(id); err != nil {
		return err
	}
	release, _, err := o.sched.Session(ctx, id)
	if err != nil {
		return o.stopped(ctx, id, "while it waited to delete the session behind its running request", false, err)
	}
	defer release()
	if err := o.sessions.delete(ctx, id); err != nil {
		return err
	}
	o.mu.Lock()
	delete(o.prompts, id)
	o.mu.Unlock()
	o.karma.forget(id)
	o.count.Forget(id)
	return nil
}

// Ask answers one request as the sigil it names (req.Sigil; the default
// sigil for none), narrowed to the scopes it asks for (req.Scopes): it
// resolves and narrows the sigil, then answers as AskAs does.
func (o *Orchestrator) Ask(ctx context.Context, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	arrived := o.cfg.Now()
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	sigil, err := o.resolveSigil(req)
	if err != nil {
		return nil, err
	}
	return o.ask(ctx, arrived, sigil, req, onToken)
}

// AskAs answers one request as sigil, which the caller resolved and
// narrowed to the request's scopes (the HTTP edge does, once per request):
// req.Sigil and req.Scopes are not read again. The sigil must hold the ask
// scope.
//
// It calls onToken with each piece of the answer. The answer is recorded
// in the session before AskAs returns its summary; an answer that cannot
// be recorded is an error of kind KindNotRecorded. If ctx ends (the client
// went away, or the daemon is stopping), the request leaves whichever
// queue it waits in, or its generation is stopped at the backend, and
// nothing is recorded; the error says so, with ctx's cause. A store call
// that runs past Config.StoreTimeout fails the request (KindUnavailable,
// or KindNotRecorded once the answer streamed).
func (o *Orchestrator) AskAs(ctx context.Context, sigil runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	arrived := o.cfg.Now()
	if err := checkRequest(req); err != nil {
		return nil, err
	}
	return o.ask(ctx, arrived, sigil, req, onToken)
}

// checkRequest refuses a malformed request before anything is looked up.
func checkRequest(req ctxd.AskRequest) error {
	if err := ctxd.CheckSessionID(req.Session); err != nil {
		return err
	}
	if strings.TrimSpace(req.Query) == "" {
		return ctxd.Errorf(ctxd.KindInvalid, "query: required and must not be blank")
	}
	if req.MaxTokens < 0 {
		return ctxd.Errorf(ctxd.KindInvalid, "max_tokens: %d; must not be negative (0: the answer reserve)", req.MaxTokens)
	}
	return nil
}

// resolveSigil is the sigil a request names, narrowed to its scopes.
func (o *Orchestrator) resolveSigil(req ctxd.AskRequest) (runcontext.Sigil, error) {
	sigil, err := o.cfg.Sigils.Resolve(req.Sigil)
	if err != nil {
		return sigil, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
	}
	if sigil, err = sigils.Narrow(sigil, req.Scopes); err != nil {
		return sigil, ctxd.Errorf(ctxd.KindForbidden, "%v", err)
	}
	return sigil, nil
}

// ask answers a checked request as sigil, step by step: wait for the
// session's earlier request, open the session, prepare the prompt (the
// governor makes it fit), acquire a backend slot, generate the answer,
// record it.
func (o *Orchestrator) ask(ctx context.Context, arrived time.Time, sigil runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	if !sigils.Allows(sigil, sigils.ScopeAsk) {
		return nil, ctxd.Errorf(ctxd.KindForbidden, "sigil %q lacks the %q scope", sigil.Name, sigils.ScopeAsk)
	}
	release, sessionWait, err := o.sched.Session(ctx, req.Session)
	if err != nil {
		return nil, o.stopped(ctx, req.Session, "while it waited for the session's earlier request", false, err)
	}
	defer release()
	sess, followed, err := o.sessions.open(ctx, req, sigil)
	if err != nil {
		return nil, err
	}
	// One request, one codex and one set of limits, whatever a reload or
	// a codex load does meanwhile.
	v := o.view.Load()
	codex, lim := v.codex, v.limits
	prepStart := o.cfg.Now()
	p, err := o.prepare(ctx, req, sigil, sess, codex, lim)
	governed := o.cfg.Now().Sub(prepStart)
	if err != nil {
		if ctx.Err() != nil {
			return nil, o.stopped(ctx, req.Session, "while the governor made it fit", false, err)
		}
		return nil, err
	}
	s, err := o.acquireSlot(ctx, req.Session, &p)
	if err != nil {
		return nil, err
	}
	defer s.lease.Release()
	sum := o.summarize(ctx, req, &p, codex, s, sessionWait, followed)
	gen, first, err := o.generateAnswer(ctx, req, &p, s, o.capAnswer(sum, req.MaxTokens, lim, p.rc), onToken)
	if err != nil {
		return nil, err
	}
	o.account(ctx, sum, gen, &p, s, answerTimes{arrived: arrived, first: first, governed: governed})
	if err := o.recordAnswer(ctx, req, &p, codex, sum, gen.Text); err != nil {
		return nil, err
	}
	o.answered(ctx, sum)
	return sum, nil
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
func (o *Orchestrator) acquireSlot(ctx context.Context, session string, p *prepared) (slotted, error) {
	var s slotted
	restorable := 0
	if o.warm != nil && p.tokens.Prefix > 0 {
		s.prefix = p.tokens.IDs[:p.tokens.Prefix]
		s.fp = o.warm.fingerprint(s.prefix)
		restorable = o.warm.restorable(s.fp, len(s.prefix))
	}
	lease, err := o.sched.AcquireRestorable(ctx, session, p.tokens.IDs, restorable)
	if err != nil {
		return s, o.stopped(ctx, session, "while it waited for a backend slot; nothing was sent to the backend", false, err)
	}
	s.lease = lease
	restoreStart := o.cfg.Now()
	if lease.Restore && o.warm.restore(ctx, lease, s.fp, s.prefix) {
		lease.Cached = len(s.prefix)
	}
	s.restored = o.cfg.Now().Sub(restoreStart)
	return s, nil
}

// summarize is the request's summary as far as it is known before the
// answer: the prompt, its reuse, and where its prefix broke.
func (o *Orchestrator) summarize(ctx context.Context, req ctxd.AskRequest, p *prepared, codex *codexState, s slotted, sessionWait time.Duration, followed bool) *ctxd.Summary {
	rc, lease := p.rc, s.lease
	sum := &ctxd.Summary{
		RequestID: reqid.From(ctx),
		Session:   req.Session, Turn: p.sess.Count + 1, Mode: rc.Codex.Mode, Format: o.cfg.Format.Name(), Codex: codex.plan, Excerpts: len(rc.Query.Excerpts), WorkingSet: p.workingSet,
		PromptTokens: len(p.tokens.IDs), CachedTokens: lease.Cached, Budget: p.budget, Epoch: rc.State.Epoch, Governor: p.actions,
		QueueWaitMs: ms(sessionWait + lease.Waited), QueueAhead: lease.Ahead, Slot: lease.Slot,
		Karma: karmaInfo(p.karma, p.karmaChosen),
	}
	sum.EvaluatedTokens = sum.PromptTokens - sum.CachedTokens
	sum.ReusePercent = 100 * float64(sum.CachedTokens) / float64(max(1, sum.PromptTokens))
	o.mu.Lock()
	prev, hadPrev := o.prompts[req.Session]
	o.mu.Unlock()
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
	if followed {
		sum.PrefixNote = "the session took its client's history, which did not extend the turns it held (a new epoch)"
	}
	if sum.PrefixBreak != nil && sum.PrefixBreak.Block == runcontext.BlockNames[runcontext.BlockKarma] && p.karmaChosen {
		sum.PrefixBreak.Reason = fmt.Sprintf("karma epoch %d began: %s", p.karma.KarmaEpoch, p.karma.Reason)
	}
	if sum.PrefixBreak != nil {
		o.log.InfoContext(ctx, "prefix break", "session", req.Session, "block", sum.PrefixBreak.Block, "reason", sum.PrefixBreak.Reason)
	}
	return sum
}

// capAnswer is the length the answer may reach: the client's cap, the
// answer reserve, or the low-power reserve while power is low (an action
// the summary reports).
func (o *Orchestrator) capAnswer(sum *ctxd.Summary, asked int, lim governor.Limits, rc *runcontext.RunContext) int {
	answerCap := o.answerCap(asked, lim)
	if low := o.cfg.LowPowerReserve; low > 0 && low < answerCap && lowPower(rc.Environment.Power) {
		answerCap = low
		sum.Governor = append(sum.Governor, ctxd.Action{Kind: ctxd.ActionLowPower, Epoch: rc.State.Epoch,
			Reason: fmt.Sprintf("power is %s: the answer is capped at %d tokens (limits.low_power_answer_reserve)", rc.Environment.Power, low)})
	}
	return answerCap
}

// generateAnswer sends the prompt to the slot and streams the answer to
// onToken; first is when its first piece left for the client. The slot is
// saved for warm restarts if its prefix is not yet, and released once what
// it holds is recorded.
func (o *Orchestrator) generateAnswer(ctx context.Context, req ctxd.AskRequest, p *prepared, s slotted, answerCap int, onToken func(string) error) (gen ctxd.Generation, first time.Time, err error) {
	gen, streamed, err := o.generate(ctx, s.lease, p.rendered.Prompt(), p.tokens.IDs, answerCap, func(piece string) error {
		if first.IsZero() {
			first = o.cfg.Now()
		}
		return onToken(piece)
	})
	if first.IsZero() { // an empty answer: its end is its first token
		first = o.cfg.Now()
	}
	if err == nil && s.fp != "" {
		o.warm.save(ctx, s.lease, s.fp, len(s.prefix))
	}
	s.lease.Release() // what the slot holds is recorded: the next request may start
	if err != nil {
		if ctx.Err() != nil || ctxd.KindOf(err) == ctxd.KindCanceled {
			return gen, first, o.stopped(ctx, req.Session, "during its answer; the backend was told to stop", streamed, err)
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
func (o *Orchestrator) account(ctx context.Context, sum *ctxd.Summary, gen ctxd.Generation, p *prepared, s slotted, at answerTimes) {
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
		n := gen.BackendCached
		sum.BackendCachedTokens = &n
		sum.ReuseNote = reuseNote(sum.CachedTokens, n, sum.PromptTokens)
		if sum.ReuseNote != "" && n < sum.CachedTokens {
			o.log.WarnContext(ctx, "the backend reused less than expected", "session", sum.Session, "slot", sum.Slot,
				"expected", sum.CachedTokens, "measured", n, "note", sum.ReuseNote)
		}
	}
	sum.TTFTMillis = ms(at.first.Sub(at.arrived))
	sum.Timing = ctxd.Timing{QueueWaitMs: sum.QueueWaitMs, GovernorMs: ms(at.governed), CondenseMs: ms(p.condensing),
		RestoreMs: ms(s.restored), BackendTTFTMs: ms(gen.TTFT)}
	t := sum.Timing
	sum.Timing.OtherMs = max(0, sum.TTFTMillis-t.QueueWaitMs-t.GovernorMs-t.RestoreMs-t.BackendTTFTMs)
	sum.PromptEvalMs = ms(gen.PromptEvalDuration)
	sum.BackendPromptN = gen.PromptEvalCount
	sum.DoneReason = gen.DoneReason
	sum.TotalMillis = ms(o.cfg.Now().Sub(at.arrived))
}

// recordAnswer reads the answer's tool calls into the summary and, unless
// the ask is ephemeral, records the answer: as a trace, as the session's
// turn, and as the session's last prompt (to find where the next one
// breaks).
func (o *Orchestrator) recordAnswer(ctx context.Context, req ctxd.AskRequest, p *prepared, codex *codexState, sum *ctxd.Summary, text string) error {
	answer := o.toolCalls(sum, p.rc.Sigil, p.toolsRefused, text)
	if req.Ephemeral {
		return nil
	}
	var err error
	if sum.Trace, err = o.karma.recordTrace(ctx, req, p.rc, p.rendered, answer, codex.fingerprint); err != nil {
		return err
	}
	if err := o.record(ctx, req, p.sess, p.rc, answer, sum); err != nil {
		return err
	}
	o.mu.Lock()
	if len(o.prompts) >= 1024 {
		clear(o.prompts) // a bound: a session whose prompt is dropped reports no prefix break once
	}
	o.prompts[req.Session] = previous{rendered: p.rendered, answer: o.cfg.Format.Answer(answer), sigil: p.rc.Sigil.Name}
	o.mu.Unlock()
	return nil
}

// answered reports an answered request: to status, to the observer (the
// daemon's metrics) and in the log.
func (o *Orchestrator) answered(ctx context.Context, sum *ctxd.Summary) {
	o.last.Store(sum)
	if o.cfg.Observe != nil {
		o.cfg.Observe(ctx, sum)
	}
	o.log.InfoContext(ctx, "answered", "session", sum.Session, "turn", sum.Turn, "slot", sum.Slot, "prompt_tokens", sum.PromptTokens,
		"cached_tokens", sum.CachedTokens, "ttft_ms", sum.TTFTMillis, "queue_wait_ms", sum.QueueWaitMs,
		"governor_ms", sum.Timing.GovernorMs, "backend_ttft_ms", sum.Timing.BackendTTFTMs, "done", sum.DoneReason)
}

// toolCalls reads the answer's calls to the client's tools into the
// summary and returns the answer as the session records it: a tool call in
// its canonical text (what a door renders when the client sends it back),
// anything else as it is. A call to a tool the sigil did not offer is
// refused: the answer stays text, and the summary says why.
func (o *Orchestrator) toolCalls(sum *ctxd.Summary, sigil runcontext.Sigil, notOffered []string, answer string) string {
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
		calls, refused, ok := toolcall.Parse(answer, names)
		switch {
		case ok && len(refused) > 0:
			sum.ToolsRefused = append(sum.ToolsRefused, refused...)
			notes = append(notes, fmt.Sprintf("the answer called %s, which sigil %q was not offered: refused, the answer stays text",
				strings.Join(refused, ", "), sigil.Name))
			o.log.Warn("tool call refused: not offered to the sigil", "session", sum.Session, "sigil", sigil.Name, "tools", refused)
		case ok:
			sum.ToolCalls = calls
			answer = toolcall.Render(calls)
		}
	}
	sum.ToolNote = strings.Join(notes, "; ")
	return answer
}

// lowPower reports whether a power band asks for shorter answers.
func lowPower(band string) bool { return band == "low_battery" || band == "low_power" }

// answerCap is the length an answer may reach: the client's cap where it
// is under the answer reserve, else the reserve.
func (o *Orchestrator) answerCap(asked int, lim governor.Limits) int {
	if asked > 0 && asked < lim.AnswerReserve {
		return asked
	}
	return lim.AnswerReserve
}

// generate sends a prompt to the lease's slot, for an answer of at most
// maxTokens, and records what the slot holds afterwards. streamed says
// whether any of the answer arrived.
func (o *Orchestrator) generate(ctx context.Context, lease *scheduler.Lease, prompt string, tokens []int, maxTokens int, onToken func(string) error) (gen ctxd.Generation, streamed bool, err error) {
	gen, err = o.backend.Generate(ctx, ctxd.GenerateRequest{
		Prompt:    prompt,
		Tokens:    tokens,
		Slot:      lease.Slot,
		MaxTokens: maxTokens,
		NumKeep:   len(tokens),
		Stop:      o.cfg.Format.Stop(),
	}, func(s string) error {
		streamed = true
		return onToken(s)
	})
	if err != nil {
		lease.Record(slotAfterFailure(tokens, lease.Cached, streamed))
		return gen, streamed, err
	}
	lease.Record(tokens)
	if gen.BackendCached >= 0 {
		lease.Measured(gen.BackendCached)
	}
	return gen, streamed, nil
}

// reuseNote explains a backend's measured reuse that differs from ctxd's
// expectation; "" when they agree.
func reuseNote(expected, measured, prompt int) string {
	switch {
	case measured == expected, measured == prompt-1 && expected == prompt:
		return "" // a backend always evaluates at least the last token
	case measured > expected:
		return fmt.Sprintf("the backend reused %d tokens, %d more than ctxd expected: the slot held more of this prompt than ctxd counted on (the previous answer's tokens, or a restored slot's conversation)", measured, measured-expected)
	}
	return fmt.Sprintf("the backend reused %d tokens, %d fewer than ctxd expected: the slot lost part of its prefix (server restarted, cache evicted, or another client used the slot)", measured, expected-measured)
}

// slotAfterFailure is what ctxd may still expect a slot to hold after a
// generation failed or was stopped. Ollama's runner evaluates a prompt it
// has started whole, even when the client goes away, so once a token
// streamed the slot holds the prompt. Before that the request may never
// have reached the runner (the slot untouched) or been evaluated in part:
// either way the slot still starts with the prefix it shared with the old
// content, which is all ctxd can be sure of.
func slotAfterFailure(prompt []int, cached int, streamed bool) []int {
	if streamed {
		return prompt
	}
	return prompt[:cached]
}

// record stores the turn and updates the session as held in memory. The
// write is not cancelled with ctx (the backend already holds the answer in
// its cache, and the next turn must extend it), but bounded.
func (o *Orchestrator) record(ctx context.Context, req ctxd.AskRequest, sess ctxd.Session, rc *runcontext.RunContext, answer string, sum *ctxd.Summary) error {
	js, err := json.Marshal(sum)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInternal, "orchestrator: %w", err)
	}
	turn := ctxd.Turn{Query: req.Query, Excerpts: rc.Query.Excerpts, Answer: answer, Verbatim: req.Pin}
	return o.sessions.appendTurn(ctx, req.Session, sess, turn, js)
}

// stopped is the error of a request that was stopped: its client went
// away (err says so, or ctx ended with no other cause), or the daemon is
// stopping (ctx's cause is an error of its own kind).
func (o *Orchestrator) stopped(ctx context.Context, session, when string, streamed bool, err error) error {
	cause := err
	kind := ctxd.KindCanceled
	if ctx.Err() != nil {
		cause = context.Cause(ctx)
		if k := ctxd.KindOf(cause); k != ctxd.KindCanceled && k != ctxd.KindInternal {
			kind = k
		}
	}
	what := "nothing was recorded"
	if streamed {
		what = "the partial answer was not recorded"
	}
	o.log.InfoContext(ctx, "request stopped", "session", session, "when", when, "cause", cause)
	return &ctxd.Error{Kind: kind, Err: cause,
		Message: fmt.Sprintf("session %q: request stopped %s (%v); %s", session, when, cause, what)}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
