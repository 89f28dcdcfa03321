package orchestrator

import (
	"context"
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
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
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
	// Observe is told of every answer's summary and the sigil that asked
	// (the daemon's metrics and dashboard); nil: nobody. It must not block.
	Observe func(ctx context.Context, sigil string, sum *ctxd.Summary)
	// Spent is told of the prompt tokens the backend read for a request
	// that ended without an answer (stopped, cancelled or failed), as far
	// as the backend reported them (llama-server's progress): evaluated,
	// and reused from its cache. nil: nobody. It must not block.
	Spent func(evaluated, reused int)
	// StoreTimeout bounds each call a request makes to the session and
	// karma stores (reading and claiming the session, taking its client's
	// history, new epochs, the turn, karma snapshots and traces), so that a
	// stuck store fails its requests instead of holding them; 0:
	// DefaultStoreTimeout. A call past it fails the request with
	// KindUnavailable (KindNotRecorded once the answer streamed).
	StoreTimeout time.Duration
	// LeaveOutTools: a client's tools its sigil may not offer are left
	// out of the prompt and listed in the summary (tools_refused,
	// tool_note); false (the default): the request is refused, naming
	// them and the scope that would allow them.
	LeaveOutTools bool
	// MaxAsksPerSigil bounds the requests one sigil has in flight at once
	// (waiting for their session or a slot, or answering), on every door;
	// MaxSessionsPerSigil the sessions it may hold. Past either, a
	// request is refused (KindTooMany, naming daemon.max_asks_per_sigil or
	// daemon.max_sessions_per_sigil). 0: no bound.
	MaxAsksPerSigil     int
	MaxSessionsPerSigil int
	// SharedStore says other daemons write to the store too (PostgreSQL):
	// a session's turns and karma snapshot are then read from the store at
	// every request rather than held in memory between requests, since
	// the session may have gone on at another daemon meanwhile.
	SharedStore bool
	// Room has the codex leave room for a client's own prompt that does
	// not fit beside it (codexsvc.Service.MakeRoom); nil: it never does.
	Room   Room
	Now    func() time.Time
	Logger *slog.Logger
}

// Room is a codex that can be planned again with a smaller share of the
// window: n tokens of the prompt budget kept for the clients' own prompts.
// It reports whether it was planned again (the request path then has its
// new plan, through SetCodex).
type Room interface {
	MakeRoom(ctx context.Context, n int) (bool, error)
}

// Orchestrator serves requests. It is safe for concurrent use: requests of
// different sessions run concurrently as far as the scheduler's slots
// allow, and nothing it holds a lock on waits for a backend or a disk.
//
// It takes a request through its steps (ask) and hands each job to a type
// of its own: sessions (the session store and the sessions held in
// memory), karmaBook (the karma store and each session's snapshot),
// lastPrompts (what each session sent last), a preparation per request
// (its prompt and the governor's steps), an answering per request (its
// backend slot, answer, summary and record), and warmer (saved slots).
// It holds no lock of its own: the codex with its limits, and the last
// summary, are swapped atomically.
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

	sessions *sessions    // the session store's calls and the sessions held in memory
	karma    *karmaBook   // the karma store's calls and each session's karma snapshot
	prompts  *lastPrompts // the prompt each session sent last since start

	inFlight sync.Map // sigil name → *atomic.Int64: its requests in flight
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

	shasOnce sync.Once
	shas     map[string]string // each file's SHA-256 by path, for karma's bindings; made on first use
}

// hashes is each of the codex's files' SHA-256 by path.
func (c *codexState) hashes() map[string]string {
	c.shasOnce.Do(func() {
		c.shas = make(map[string]string, len(c.block.Files))
		for _, f := range c.block.Files {
			c.shas[f.Path] = f.SHA256
		}
	})
	return c.shas
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
		sessions: newSessions(store, deadline, cfg.Sigils, cfg.Now, log, cfg.MaxSessionsPerSigil),
		karma:    newKarmaBook(cfg.Karma, deadline, cfg.Now, log),
		prompts:  newLastPrompts(),
	}
	o.sessions.shared, o.karma.shared = cfg.SharedStore, cfg.SharedStore
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
	p, ok := o.prompts.get(id)
	return p.rendered, p.sigil, ok
}

// Stop is the stop sequences every request sends with its prompt.
func (o *Orchestrator) Stop() []string { return o.cfg.Format.Stop() }

// DeleteSession deletes a session once its running request, if any, has
// finished, and forgets everything held of it.
func (o *Orchestrator) DeleteSession(ctx context.Context, id string) error {
	if err := ctxd.CheckSessionID(ctxd.ClientSessionID(id)); err != nil {
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
	o.prompts.forget(id)
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
	if req.Parent != "" {
		if err := ctxd.CheckSessionID(req.Parent); err != nil {
			return ctxd.Errorf(ctxd.KindInvalid, "parent: %v", err)
		}
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
	if err := o.checkTools(sigil, req.Tools); err != nil {
		return nil, err
	}
	if n := o.cfg.MaxAsksPerSigil; n > 0 {
		v, _ := o.inFlight.LoadOrStore(sigil.Name, new(atomic.Int64))
		c := v.(*atomic.Int64)
		if c.Add(1) > int64(n) {
			c.Add(-1)
			return nil, ctxd.Errorf(ctxd.KindTooMany, "sigil %q has %d requests in flight, the most daemon.max_asks_per_sigil allows; wait for one to end", sigil.Name, n)
		}
		defer c.Add(-1)
	}
	// Session ids are per sigil: the one the client named is this sigil's
	// own, whatever another sigil named the same.
	client := req.Session
	internal, err := o.sessions.scoped(ctx, sigil.Name, client)
	if err != nil {
		return nil, err
	}
	req.Session = internal
	if req.Parent != "" {
		// The parent is named as the client knows it, like the session.
		if req.Parent, err = o.sessions.scoped(ctx, sigil.Name, req.Parent); err != nil {
			return nil, err
		}
	}
	release, sessionWait, err := o.sched.Session(ctx, req.Session)
	if err != nil {
		return nil, o.stopped(ctx, req.Session, "while it waited for the session's earlier request", false, err)
	}
	defer release()
	// Writes behind the prompt end before the session is released,
	// whatever becomes of the request.
	w := newWriteBehind()
	defer w.wait()
	sess, followed, err := o.sessions.open(ctx, req, sigil, w)
	if err != nil {
		return nil, err
	}
	// One request, one codex and one set of limits, whatever a reload or
	// a codex load does meanwhile.
	v := o.view.Load()
	codex, lim := v.codex, v.limits
	prepStart := o.cfg.Now()
	p, err := o.prepare(ctx, req, sigil, sess, codex, lim, w)
	if errors.Is(err, errRoomMade) {
		// The codex was planned again with room for this client's prompt:
		// prepared once more, over the new plan.
		v = o.view.Load()
		codex, lim = v.codex, v.limits
		p, err = o.prepare(ctx, req, sigil, p.sess, codex, lim, w)
	}
	governed := o.cfg.Now().Sub(prepStart)
	if err != nil {
		if ctx.Err() != nil {
			return nil, o.stopped(ctx, req.Session, "while the governor made it fit", false, err)
		}
		return nil, err
	}
	if req.Accepted != nil {
		req.Accepted()
	}
	a := &answering{o: o, ctx: ctx, req: req, p: &p, codex: codex, behind: w}
	if err := a.acquireSlot(); err != nil {
		return nil, err
	}
	defer a.slot.lease.Release()
	a.summarize(sessionWait, followed)
	gen, first, err := a.generateAnswer(a.capAnswer(lim), onToken)
	if err != nil {
		return nil, err
	}
	a.account(gen, answerTimes{arrived: arrived, first: first, governed: governed})
	if err := a.record(gen.Text); err != nil {
		return nil, err
	}
	a.answered()
	out := *a.sum
	out.Session = client
	return &out, nil
}

// checkTools refuses a request that offers tools its sigil may not offer,
// unless the configuration leaves them out (Config.LeaveOutTools): never
// a silent drop.
func (o *Orchestrator) checkTools(sigil runcontext.Sigil, tools []ctxd.Tool) error {
	if o.cfg.LeaveOutTools {
		return nil
	}
	refused := sigils.NotAllowedTools(sigil, tools)
	if len(refused) == 0 {
		return nil
	}
	return ctxd.Errorf(ctxd.KindForbidden, "sigil %q may not offer the model the client's tools %s: give it the scope %q (all of a client's tools) or tool:NAME for each (`ctxd sigil add NAME --preset agent` makes a sigil for coding agents), or set daemon.disallowed_tools = \"leave_out\" to leave them out and list them",
		sigil.Name, strings.Join(refused, ", "), sigils.ScopeTools)
}

// route is who a generation is for, as a backend in front of a cluster
// routes it (ctxd.GenerateRequest's Session and Parent).
type route struct{ session, parent string }

// generate sends a prompt to the lease's slot, for an answer of at most
// maxTokens, and records what the slot holds afterwards. streamed says
// whether any of the answer arrived.
func (o *Orchestrator) generate(ctx context.Context, lease *scheduler.Lease, route route, prompt string, tokens []int, maxTokens int, onToken func(string) error) (gen ctxd.Generation, streamed bool, err error) {
	gen, err = o.backend.Generate(ctx, ctxd.GenerateRequest{
		Session:   route.session,
		Parent:    route.parent,
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
		lease.Stopped(slotAfterFailure(tokens, lease.Cached, gen.PromptRead, streamed))
		if read := max(gen.PromptRead, gen.PromptEvalCount); gen.BackendCached >= 0 && read > 0 && o.cfg.Spent != nil {
			o.cfg.Spent(max(0, read-gen.BackendCached), min(read, gen.BackendCached))
		}
		return gen, streamed, err
	}
	lease.Record(tokens)
	if gen.BackendCached >= 0 {
		lease.Measured(gen.BackendCached)
	}
	return gen, streamed, nil
}

// slotAfterFailure is what ctxd may still expect a slot to hold after a
// generation failed or was stopped. Ollama's runner evaluates a prompt it
// has started whole, even when the client goes away, so once a token
// streamed the slot holds the prompt. Before that the request may never
// have reached the runner (the slot untouched) or been evaluated in part:
// the slot still starts with the prefix it shared with the old content,
// and with as much of the prompt as the backend reported reading (read,
// llama-server's progress), whichever is more.
func slotAfterFailure(prompt []int, cached, read int, streamed bool) []int {
	if streamed {
		return prompt
	}
	return prompt[:min(len(prompt), max(cached, read))]
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
