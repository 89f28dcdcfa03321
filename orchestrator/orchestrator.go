package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/ctxd/ctxd/cache"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/sqlite"
)

// GenerateRequest is one prompt for the backend.
type GenerateRequest struct {
	Prompt    string
	MaxTokens int      // the answer reserve: prompt + answer always fit the window
	NumKeep   int      // tokens the backend must never shift out
	Stop      []string // stop sequences
}

// Generation is a finished answer and the backend's own measurements.
type Generation struct {
	Text       string
	DoneReason string // DoneIncomplete when the backend ended the stream without its final message

	TTFT               time.Duration
	PromptEvalCount    int
	PromptEvalDuration time.Duration
	EvalCount          int
	EvalDuration       time.Duration
}

// DoneIncomplete is the done reason of a generation the backend ended
// without its final message (Ollama aborting at its token repeat limit):
// the text is what streamed, and the backend's measurements are missing.
const DoneIncomplete = "incomplete"

// Backend generates from a raw prompt, streaming pieces to onToken.
type Backend interface {
	Generate(ctx context.Context, req GenerateRequest, onToken func(string) error) (Generation, error)
}

// Tokenizer tokenizes a whole prompt exactly as the backend will, and a
// piece of one without the special tokens a whole prompt starts with.
type Tokenizer interface {
	Tokenize(prompt string) ([]int, error)
	TokenizeText(text string) ([]int, error)
}

// Store keeps sessions.
type Store interface {
	Session(ctx context.Context, id string) (sqlite.Session, error)
	AppendTurn(ctx context.Context, id string, t runcontext.Turn, summary []byte, now time.Time) (int64, error)
	NewEpoch(ctx context.Context, id string, keep []int64, summary string, now time.Time) (int, error)
}

// Retriever finds codex excerpts for a query (RAG).
type Retriever interface {
	Search(ctx context.Context, query string, k int) ([]runcontext.Excerpt, error)
}

// Environment reads the hardware bands.
type Environment interface {
	Environment() (runcontext.Environment, hostenv.Reading)
}

// Config is what the orchestrator needs besides its collaborators.
type Config struct {
	Identity runcontext.Identity
	Codex    CodexState // the codex as loaded; SetCodex swaps it
	Limits   governor.Limits
	KVBytes  func(tokens int) int64 // KV cache size of a prompt; nil: not reported
	Sigils   *sigils.Registry
	Slot     string // names the backend slot in the prefix tracker
	Now      func() time.Time
	Logger   *slog.Logger
}

// CodexState is the codex as requests see it.
type CodexState struct {
	Block     runcontext.Codex   // rendered once at load
	Plan      governor.CodexPlan // CAG or RAG, and why
	Retriever Retriever          // excerpts for RAG; nil without an index
	TopK      int                // excerpts per query in RAG mode
}

// Orchestrator serves requests. It is safe for concurrent use; requests
// reach the backend one at a time, so what each backend slot holds is
// known exactly.
type Orchestrator struct {
	cfg     Config
	backend Backend
	tok     Tokenizer
	store   Store
	env     Environment
	slots   *cache.Slots
	log     *slog.Logger

	mu          sync.Mutex          // serializes requests; guards the fields below
	last        map[string]previous // the previous request of each session since start
	blockCache  map[uint64]int      // token counts of rendered blocks, by content hash
	bos         int                 // tokens the tokenizer adds to any text (BOS)
	lastBudget  *Summary            // the last answered request, for status
	codex       CodexState
	prefixes    map[uint64]*prefixTokens  // tokens of the stable blocks, by content
	sessions    map[string]sqlite.Session // sessions as stored, so a request need not read them back
	tails       map[string]tailCache      // each session's last conversation-and-query tokens
	noTailCache bool                      // extending tails disagreed with whole tails once: always tokenize whole
	wholeOnly   bool                      // incremental tokenization disagreed with the backend: count whole prompts
}

// previous is what a session sent last, to find where a prefix broke.
type previous struct {
	rendered runcontext.Rendered
	answer   string
}

// New returns an orchestrator.
func New(cfg Config, backend Backend, tok Tokenizer, store Store, env Environment) (*Orchestrator, error) {
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	if cfg.Sigils == nil {
		return nil, errors.New("orchestrator: no sigil registry")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Orchestrator{
		cfg: cfg, backend: backend, tok: tok, store: store, env: env,
		slots:      cache.NewSlots(),
		log:        cfg.Logger.With("component", "orchestrator"),
		last:       map[string]previous{},
		blockCache: map[uint64]int{},
		bos:        -1,
		codex:      prerendered(cfg.Codex),
		prefixes:   map[uint64]*prefixTokens{},
		sessions:   map[string]sqlite.Session{},
		tails:      map[string]tailCache{},
	}, nil
}

// session returns a session, from memory when this daemon already holds
// it: the orchestrator is the store's only writer, so memory and store agree.
func (o *Orchestrator) session(ctx context.Context, id string) (sqlite.Session, error) {
	if s, ok := o.sessions[id]; ok {
		s.Turns, s.Seqs = slices.Clone(s.Turns), slices.Clone(s.Seqs)
		return s, nil
	}
	s, err := o.store.Session(ctx, id)
	if err != nil {
		return s, fmt.Errorf("orchestrator: %w", err)
	}
	o.cacheSession(s)
	return s, nil
}

func (o *Orchestrator) cacheSession(s sqlite.Session) {
	if len(o.sessions) >= 1024 {
		clear(o.sessions) // a bound, not an LRU: a miss costs one read
	}
	o.sessions[s.ID] = s
}

// Forget drops what the orchestrator holds of a session (after it was
// deleted from the store).
func (o *Orchestrator) Forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.sessions, id)
	delete(o.last, id)
	delete(o.tails, id)
}

// LastPrompt is the prompt the session's last request sent to the backend
// since this daemon started, block by block; false if there is none.
func (o *Orchestrator) LastPrompt(id string) (runcontext.Rendered, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p, ok := o.last[id]
	return p.rendered, ok
}

// prerendered renders the codex block once for all requests.
func prerendered(c CodexState) CodexState {
	c.Block.Prerender()
	return c
}

// SetCodex swaps the codex (after a reload). The next request renders the
// new codex block, so the backend rebuilds its cached prefix from there.
func (o *Orchestrator) SetCodex(c CodexState) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.codex = prerendered(c)
}

// Codex is the codex state requests see now.
func (o *Orchestrator) Codex() CodexState {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.codex
}

// BackendRestarted forgets what the backend held: its KV cache is gone.
func (o *Orchestrator) BackendRestarted() { o.slots.Forget(o.cfg.Slot) }

// Request is one query of one session.
type Request struct {
	Session string `json:"session"`
	Query   string `json:"query"`
	Sigil   string `json:"sigil,omitempty"`
	Pin     bool   `json:"pin,omitempty"` // keep this turn verbatim: never compacted or condensed
}

// SessionIDPattern is what a session id must look like.
var SessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Errors the API edge maps to statuses.
var (
	ErrBadRequest = errors.New("bad request")
	ErrForbidden  = errors.New("forbidden")
)

// Summary ends every answer: what was sent, what the backend should have
// reused, what it did, and what the governor measured.
type Summary struct {
	Session         string             `json:"session"`
	Turn            int                `json:"turn"`
	Mode            string             `json:"mode"`
	PromptTokens    int                `json:"prompt_tokens"`
	CachedTokens    int                `json:"cached_tokens"`    // prefix the backend slot already holds
	EvaluatedTokens int                `json:"evaluated_tokens"` // prompt tokens the backend must evaluate
	ReusePercent    float64            `json:"reuse_percent"`
	AnswerTokens    int                `json:"answer_tokens"`
	TTFTMillis      float64            `json:"ttft_ms"`
	PromptEvalMs    float64            `json:"backend_prompt_eval_ms"`
	BackendPromptN  int                `json:"backend_prompt_eval_count"`
	TotalMillis     float64            `json:"total_ms"`
	DoneReason      string             `json:"done_reason"`
	DoneNote        string             `json:"done_note,omitempty"` // why an answer is incomplete
	PrefixBreak     *cache.Break       `json:"prefix_break,omitempty"`
	PrefixNote      string             `json:"prefix_note,omitempty"`
	Codex           governor.CodexPlan `json:"codex"`
	Excerpts        int                `json:"excerpts"` // codex excerpts retrieved for this query (RAG)
	Epoch           int                `json:"epoch"`
	Governor        []governor.Action  `json:"governor,omitempty"` // what the governor did to make it fit
	Budget          governor.Budget    `json:"budget"`
}

// Ask answers one request, calling onToken with each piece of the answer.
func (o *Orchestrator) Ask(ctx context.Context, req Request, onToken func(string) error) (*Summary, error) {
	if !SessionIDPattern.MatchString(req.Session) {
		return nil, fmt.Errorf("%w: session %q must match %s", ErrBadRequest, req.Session, SessionIDPattern)
	}
	sigil, err := o.cfg.Sigils.Resolve(req.Sigil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrForbidden, err)
	}
	if !sigils.Allows(sigil, sigils.ScopeAsk) {
		return nil, fmt.Errorf("%w: sigil %q lacks the %q scope", ErrForbidden, sigil.Name, sigils.ScopeAsk)
	}

	o.mu.Lock()
	defer o.mu.Unlock()
	start := o.cfg.Now()

	p, err := o.prepare(ctx, req, sigil)
	if err != nil {
		return nil, err
	}
	sess, rc, budget, actions := p.sess, p.rc, p.budget, p.actions
	rendered, tokens := p.m.Rendered, p.m.Tokens
	prompt := rendered.Prompt()

	sum := &Summary{
		Session: req.Session, Turn: sess.Count + 1, Mode: rc.Codex.Mode, Codex: o.codex.Plan, Excerpts: len(rc.Query.Excerpts),
		PromptTokens: len(tokens), Budget: budget, Epoch: rc.State.Epoch, Governor: actions,
	}
	sum.CachedTokens = o.slots.Expect(o.cfg.Slot, tokens)
	sum.EvaluatedTokens = sum.PromptTokens - sum.CachedTokens
	sum.ReusePercent = 100 * float64(sum.CachedTokens) / float64(max(1, sum.PromptTokens))
	if prev, ok := o.last[req.Session]; ok {
		sum.PrefixBreak = cache.Compare(prev.rendered, rendered, prev.answer)
	} else if sess.Count == 0 {
		sum.PrefixNote = "first turn of the session"
	} else {
		sum.PrefixNote = "no earlier prompt of this session since the daemon started"
	}
	if sum.PrefixBreak != nil {
		o.log.Info("prefix break", "session", req.Session, "block", sum.PrefixBreak.Block, "reason", sum.PrefixBreak.Reason)
	}

	gen, err := o.backend.Generate(ctx, GenerateRequest{
		Prompt:    prompt,
		MaxTokens: o.cfg.Limits.AnswerReserve,
		NumKeep:   len(tokens),
		Stop:      []string{runcontext.StopSequence},
	}, onToken)
	if err != nil {
		// What the slot holds now is unknown: expect nothing next time.
		o.slots.Forget(o.cfg.Slot)
		return nil, err
	}
	o.slots.Record(o.cfg.Slot, tokens)
	o.last[req.Session] = previous{rendered: rendered, answer: gen.Text}
	if gen.PromptEvalCount > 0 && gen.PromptEvalCount != len(tokens) && !o.wholeOnly {
		// Ollama counts every prompt token, cached or not: a difference means
		// ctxd's count is off. Count whole prompts from now on, and say so.
		o.log.Warn("token count differs from the backend's; counting whole prompts from now on",
			"ctxd", len(tokens), "backend", gen.PromptEvalCount)
		o.wholeOnly = true
	}

	sum.AnswerTokens = gen.EvalCount
	if gen.DoneReason == DoneIncomplete {
		// The answer is kept (the backend's cache holds it, and the next
		// turn extends it) but marked; its tokens are counted here since
		// the backend did not report them.
		if ids, err := o.tok.TokenizeText(gen.Text); err == nil {
			sum.AnswerTokens = len(ids)
		}
		sum.DoneNote = "the backend ended the answer without its final message, so the answer may be cut short and the backend's timings are missing (Ollama aborts a generation that repeats one token 30 times)"
		o.log.Warn("answer incomplete: the backend ended the stream without its final message", "session", req.Session, "answer_tokens", sum.AnswerTokens)
	}
	sum.TTFTMillis = ms(gen.TTFT)
	sum.PromptEvalMs = ms(gen.PromptEvalDuration)
	sum.BackendPromptN = gen.PromptEvalCount
	sum.DoneReason = gen.DoneReason
	sum.TotalMillis = ms(o.cfg.Now().Sub(start))

	js, err := json.Marshal(sum)
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	turn := runcontext.Turn{Query: req.Query, Excerpts: rc.Query.Excerpts, Answer: gen.Text, Verbatim: req.Pin}
	// Recorded even if the caller's context ends now: the backend already
	// holds the answer in its cache, and the next turn must extend it.
	seq, err := o.store.AppendTurn(context.WithoutCancel(ctx), req.Session, turn, js, o.cfg.Now())
	if err != nil {
		delete(o.sessions, req.Session)
		return nil, fmt.Errorf("orchestrator: record turn: %w", err)
	}
	sess.Turns = append(sess.Turns, turn)
	sess.Seqs = append(sess.Seqs, seq)
	sess.Count++
	o.cacheSession(sess)
	o.lastBudget = sum
	o.log.Info("answered", "session", req.Session, "turn", sum.Turn, "prompt_tokens", sum.PromptTokens,
		"cached_tokens", sum.CachedTokens, "ttft_ms", sum.TTFTMillis, "done", sum.DoneReason)
	return sum, nil
}

// prepared is a request made ready for the backend.
type prepared struct {
	sess    sqlite.Session
	rc      *runcontext.RunContext
	m       measured
	budget  governor.Budget
	actions []governor.Action
}

// prepare loads the session, builds and validates the RunContext,
// and has the governor make it fit: compaction, then condensation, then a
// refusal with the numbers.
func (o *Orchestrator) prepare(ctx context.Context, req Request, sigil runcontext.Sigil) (prepared, error) {
	var p prepared
	sess, err := o.session(ctx, req.Session)
	if err != nil {
		return p, err
	}
	env, _ := o.env.Environment()
	if o.codex.Block.Mode == runcontext.ModeRAG && sigils.Allows(sigil, sigils.ScopeSearchCodex) {
		sigil.Tools = []string{sigils.ScopeSearchCodex}
	}
	rc := &runcontext.RunContext{
		Identity:    o.cfg.Identity,
		Codex:       o.codex.Block,
		Environment: env,
		Sigil:       sigil,
		Karma:       runcontext.Karma{},
		State:       runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns},
		Query:       runcontext.Query{Text: req.Query},
	}
	if o.codex.Block.Mode == runcontext.ModeRAG && o.codex.Retriever != nil {
		ex, err := o.codex.Retriever.Search(ctx, req.Query, o.codex.TopK)
		if err != nil {
			return p, fmt.Errorf("orchestrator: retrieve codex excerpts: %w", err)
		}
		rc.Query.Excerpts = ex
	}
	if err := rc.Validate(); err != nil {
		return p, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	var actions []governor.Action
	if act, ok, err := o.compact(ctx, req.Session, &sess, rc); err != nil {
		return p, err
	} else if ok {
		actions = append(actions, act)
	}
	m, err := o.measure(rc, req.Session)
	if err != nil {
		return p, err
	}
	budget, err := o.cfg.Limits.Check(m.Measure)
	var le *governor.LimitError
	// Excerpts are the cheapest thing to give up: the lowest-ranked go first.
	for dropped := 0; errors.As(err, &le) && len(rc.Query.Excerpts) > 0; {
		rc.Query.Excerpts = rc.Query.Excerpts[:len(rc.Query.Excerpts)-1]
		dropped++
		if m, err = o.measure(rc, req.Session); err != nil {
			return p, err
		}
		if budget, err = o.cfg.Limits.Check(m.Measure); err == nil || len(rc.Query.Excerpts) == 0 {
			actions = append(actions, governor.Action{Kind: "excerpts",
				Reason: fmt.Sprintf("%d lowest-ranked codex excerpts left out to fit the window", dropped), Epoch: sess.Epoch})
		}
	}
	if errors.As(err, &le) {
		acts, cerr := o.condense(ctx, req.Session, &sess, rc)
		actions = append(actions, acts...)
		if cerr != nil {
			return p, cerr
		}
		if len(acts) > 0 {
			if m, err = o.measure(rc, req.Session); err != nil {
				return p, err
			}
			budget, err = o.cfg.Limits.Check(m.Measure)
		}
	}
	if err != nil {
		if len(actions) > 0 {
			return p, fmt.Errorf("%w (after: %s)", err, describe(actions))
		}
		return p, err
	}
	return prepared{sess: sess, rc: rc, m: m, budget: budget, actions: actions}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
