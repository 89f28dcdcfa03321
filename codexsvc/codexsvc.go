// Package codexsvc keeps the daemon's current codex: it loads a tree
// (package codex), plans it whole (CAG) or retrieved (RAG) against the
// governor's budget, indexes it for retrieval (package sqlite), publishes
// it to the request path, and reloads it when its files change.
//
// Loads are serialized and cancellable; reads of the current codex never
// wait for a load, and never see new limits with the plan of the old
// ones: the limits and the codex planned under them are one state,
// swapped whole when a load or a re-plan is done. It does not render
// prompts or talk to a backend: the stable blocks it plans with come from
// the daemon, and their tokens are counted once, in a tokencount.Counter
// shared with the request path.
package codexsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sqlite"
	"github.com/ctxd/ctxd/tokencount"
)

// Sink receives each newly loaded codex: the request path.
type Sink interface {
	// SetCodex hands over a new codex with the limits it was planned
	// under: requests must get both together.
	SetCodex(block runcontext.Codex, plan ctxd.CodexPlan, r ctxd.Retriever, limits governor.Limits)
}

// Settings are the operator's codex settings (the daemon's [codex]
// section), applied to every tree the service loads; a tree's own
// .ctxd.toml may only tighten them.
type Settings struct {
	Walk     codex.Options // caps, include and exclude patterns, redaction (Progress is set per load)
	CAGRatio float64       // share of the prompt budget the codex may fill whole
	Watch    bool          // reload when files change
	// AllowRedactOff lets a tree's .ctxd.toml turn redaction off.
	AllowRedactOff bool
}

// Config is what the service needs.
type Config struct {
	Settings    Settings        // the operator's codex settings
	StateDir    string          // holds codex-cache.bin and codex-index.db
	Limits      governor.Limits // the window the codex is planned against
	Tokenizer   ctxd.Tokenizer  // counts each file's tokens
	TokenizerID string          // names the vocabulary, for the count cache
	Counter     *tokencount.Counter
	Specials    runcontext.Specials // the model's special token texts: the codex block is escaped against them
	// Stable renders the stable blocks around a codex block as a request
	// of the default sigil would: what the CAG/RAG plan weighs.
	Stable func(runcontext.Codex) (runcontext.Rendered, error)
	Sink   Sink
	Logger *slog.Logger
	// SettleMax bounds how long the watcher waits for the tree to go
	// quiet before it reloads (0: settleMax).
	SettleMax time.Duration
}

// Service is the current codex. Its methods are safe for concurrent use.
type Service struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // ends at Close: watchers and their reloads stop
	cancel context.CancelFunc

	state atomic.Pointer[state] // what readers see; never nil

	// loadMu serializes loads and re-plans (the writers); guards cache,
	// index, closed and bgCancel. No reader takes it.
	loadMu sync.Mutex
	cache  *codex.Cache
	index  *sqlite.Index
	closed bool
	room   int // the prompt budget kept for the clients' own prompts (MakeRoom)

	watchMu     sync.Mutex // guards watchCancel
	watchCancel context.CancelFunc
	watchers    sync.WaitGroup

	bgCancel   context.CancelFunc // stops the background count of the current codex; guarded by loadMu
	background sync.WaitGroup
}

// state is the limits loads plan against and the codex last planned
// under them: immutable, swapped whole, so a reader pairs the plan it
// sees with the limits it was made for.
type state struct {
	limits governor.Limits
	cur    *loaded // nil until a load succeeded
}

// loaded is one load's outcome, swapped whole.
type loaded struct {
	path      string
	codex     *codex.Codex
	body      string         // the codex block's body: a reload that renders the same one changed nothing
	retriever ctxd.Retriever // nil in CAG mode
	stats     ctxd.CodexStats

	counted atomic.Pointer[ctxd.CodexStats] // stats with the background count's progress; nil: stats as they are
}

// New returns a service with no codex loaded.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, log: cfg.Logger.With("component", "codex")}
	s.state.Store(&state{limits: cfg.Limits})
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// SetLimits makes l the window loads plan against. If the plan depends
// on what changed (the window, the answer reserve, the character cap),
// the current codex is planned again under l at once: it may switch
// between CAG and RAG. Until the new plan is made, readers see the old
// limits with the old plan, and then the new limits with the new plan,
// never one with the other; they do not wait for it (only other loads
// do). If it fails, the old limits stay and the error says why.
func (s *Service) SetLimits(ctx context.Context, l governor.Limits) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	st := s.state.Load()
	if st.cur == nil || !replans(st.limits, l) {
		s.state.Store(&state{limits: l, cur: st.cur})
		return nil
	}
	_, err := s.loadTwice(ctx, st.cur.path, l, nil)
	return err
}

// MakeRoom keeps at least n tokens of the prompt budget for the clients'
// own prompts (system text, tools, conversation): a client's request did
// not fit beside the codex. The codex is ctxd's to shrink, a client's
// prompt is not: if the codex's share (CAG whole, or RAG's map and
// working set) leaves less than n, it is planned again with a smaller
// share — a whole codex may switch to retrieval, a working set gets
// smaller — and every session's next prompt re-evaluates from the codex
// block on. The room only grows (the largest client's prompt measured),
// so clients of different sizes do not make the codex flip back and
// forth. It reports whether the codex was planned again; like a reload,
// it waits for other loads, and readers keep the old plan meanwhile.
func (s *Service) MakeRoom(ctx context.Context, n int) (bool, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if n <= s.room {
		return false, nil
	}
	st := s.state.Load()
	if st.cur == nil {
		s.room = n
		return false, nil
	}
	old := s.room
	s.room = n
	if plan := st.cur.stats.Plan; plan.Mode == runcontext.ModeNone || plan.Threshold <= st.limits.PromptBudget()-n {
		return false, nil // the codex already leaves that much
	}
	if _, err := s.loadTwice(ctx, st.cur.path, st.limits, nil); err != nil {
		s.room = old
		return false, err
	}
	plan := s.state.Load().cur.stats.Plan
	s.log.Info("codex planned again to leave room for the clients' own prompts", "room_tokens", n, "mode", plan.Mode, "threshold", plan.Threshold)
	return true, nil
}

// replans reports whether a codex planned under a must be planned again
// under b: the window, the answer reserve or the character cap changed.
func replans(a, b governor.Limits) bool {
	return a.NumCtx != b.NumCtx || a.AnswerReserve != b.AnswerReserve || a.MaxChars != b.MaxChars
}

// Plan is the current codex's plan with the limits it was made under, one
// pair: a reader never sees new limits with an old plan. false if no codex
// is loaded (the limits are those the next load plans against). It never
// waits for a load or a re-plan.
func (s *Service) Plan() (governor.Limits, ctxd.CodexPlan, bool) {
	st := s.state.Load()
	if st.cur == nil {
		return st.limits, ctxd.CodexPlan{}, false
	}
	return st.limits, st.cur.stats.Plan, true
}

// ErrClosed is returned by Load after Close.
var ErrClosed = errors.New("codexsvc: closed")

// Stats describes the current codex; false if none is loaded. It never
// waits for a load.
func (s *Service) Stats() (ctxd.CodexStats, bool) {
	l := s.state.Load().cur
	if l == nil {
		return ctxd.CodexStats{}, false
	}
	if st := l.counted.Load(); st != nil {
		return *st, true
	}
	return l.stats, true
}

// Search is the search_codex tool: full-text search of the current codex.
// A codex loaded whole has no index: that is a KindConflict.
func (s *Service) Search(ctx context.Context, query string, k int) ([]ctxd.Excerpt, error) {
	l := s.state.Load().cur
	if l == nil || l.retriever == nil {
		return nil, ctxd.Errorf(ctxd.KindConflict, "the codex is not indexed for search: it is loaded whole (CAG mode) or not at all")
	}
	ex, err := l.retriever.Search(ctx, query, k)
	if err != nil {
		return nil, ctxd.Errorf(ctxd.KindInternal, "codex search: %w", err)
	}
	return ex, nil
}

// Load loads the tree at path, plans and indexes it, makes it the current
// codex and, if the configuration says so, watches it (instead of the one
// before). Loads run one at a time. If ctx ends first, the load stops and
// the current codex stays.
func (s *Service) Load(ctx context.Context, path string, progress func(ctxd.CodexProgress)) (ctxd.CodexStats, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	l, err := s.loadTwice(ctx, path, s.state.Load().limits, progress)
	if err != nil {
		return ctxd.CodexStats{}, err
	}
	if s.cfg.Settings.Watch {
		// Switched before the next load may start: the watcher always
		// follows the codex that is current.
		s.watch(path)
	}
	return l.stats, nil
}

// reload loads path again for its watcher, unless ctx ended (the watcher
// was replaced or the service closed) while it waited for another load.
func (s *Service) reload(ctx context.Context, path string) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := s.loadTwice(ctx, path, s.state.Load().limits, nil)
	return err
}

// loadTwice loads path planned under limits, and once more if a file
// changed while it loaded (the second walk sees the change and reads the
// file again). The caller holds loadMu.
func (s *Service) loadTwice(ctx context.Context, path string, limits governor.Limits, progress func(ctxd.CodexProgress)) (*loaded, error) {
	l, err := s.loadLocked(ctx, path, limits, progress)
	if errors.Is(err, codex.ErrChanged) {
		s.log.Info("a file changed while the codex loaded; loading again", "err", err)
		l, err = s.loadLocked(ctx, path, limits, progress)
	}
	if errors.Is(err, codex.ErrChanged) {
		return nil, ctxd.Errorf(ctxd.KindConflict, "the tree changed while it loaded, twice: %w; the current codex stays", err)
	}
	return l, err
}

// loadLocked loads the tree at path, plans it under limits and, for
// retrieval, indexes it, then makes it the current codex with limits, in
// one swap. The caller holds loadMu.
func (s *Service) loadLocked(ctx context.Context, path string, limits governor.Limits, progress func(ctxd.CodexProgress)) (*loaded, error) {
	if s.closed {
		return nil, ErrClosed
	}
	start := time.Now()
	opts, ratio, err := s.options(path, progress)
	if err != nil {
		return nil, err
	}
	prev := s.state.Load().cur
	if prev != nil && prev.path == path {
		opts.Previous = prev.codex
	} else {
		prev = nil
	}
	c, err := codex.Load(ctx, path, opts)
	if err != nil {
		var kinded *ctxd.Error
		kind := ctxd.KindInvalid
		if errors.As(err, &kinded) {
			kind = "" // as it is
		}
		return nil, loadFailed(ctx, path, kind, err)
	}
	block, plan, err := s.plan(ctx, c, limits, ratio)
	if err != nil {
		return nil, loadFailed(ctx, path, "", err)
	}
	l := &loaded{path: path, codex: c, body: block.Body}
	reindexed := 0
	if plan.Mode == runcontext.ModeRAG {
		if l.retriever, reindexed, err = s.retrieval(ctx, c, block, plan, prev, progress); err != nil {
			return nil, loadFailed(ctx, path, ctxd.KindInternal, err)
		}
	}
	if err := s.cache.Save(); err != nil {
		s.log.Warn("codex cache not saved", "err", err)
	}
	l.stats = statsOf(c, plan, reindexed, time.Since(start), !opts.NoRedact)
	s.publish(l, limits, block, plan, reindexed)
	return l, nil
}

// loadFailed is the error of a load of path that failed with err:
// KindCanceled if ctx ended; otherwise err made of kind, or as it is if
// kind is "".
func loadFailed(ctx context.Context, path string, kind ctxd.Kind, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctxd.Errorf(ctxd.KindCanceled, "codex load of %s cancelled: %w", path, err)
	case kind == "":
		return err
	}
	return ctxd.Errorf(kind, "%w", err)
}

// options are the load options of the tree at path (the daemon's [codex]
// settings merged with the tree's own) and its CAG ratio; they open the
// count cache on first use. A tree may only tighten: it cannot turn secret
// redaction off unless the operator allowed it, nor raise the ratio.
func (s *Service) options(path string, progress func(ctxd.CodexProgress)) (codex.Options, float64, error) {
	settings, _, err := codex.LoadSettings(path, s.cfg.Settings.Walk.Within)
	var kinded *ctxd.Error
	if err != nil && errors.As(err, &kinded) {
		return codex.Options{}, 0, err // a root outside the allowed directories: forbidden
	}
	if err != nil {
		return codex.Options{}, 0, ctxd.Errorf(ctxd.KindInvalid, "%w", err)
	}
	cc := s.cfg.Settings
	if r := settings.Codex.Redact; r != nil && !*r && !cc.AllowRedactOff {
		// The tree is not the operator's to trust: a repository must not
		// be able to put its own credentials into prompts.
		return codex.Options{}, 0, ctxd.Errorf(ctxd.KindForbidden, "codex %s: its %s turns secret redaction off (redact = false), which the operator has not allowed (codex.allow_codex_redact_off)", filepath.Base(path), codex.SettingsFile)
	}
	opts := cc.Walk
	opts.Progress = progress
	opts = opts.Merge(settings.Codex)
	if s.cache == nil {
		if s.cache, err = codex.OpenCache(filepath.Join(s.cfg.StateDir, "codex-cache.bin"), s.cfg.TokenizerID); err != nil {
			return codex.Options{}, 0, ctxd.Errorf(ctxd.KindInternal, "%w", err)
		}
		os.Remove(filepath.Join(s.cfg.StateDir, "codex-cache.gob")) // the cache before the stat index; never read again
	}
	opts.Cache = s.cache
	ratio := cc.CAGRatio
	if settings.Codex.CAGRatio > 0 {
		ratio = min(ratio, settings.Codex.CAGRatio) // a codex may only tighten
	}
	return opts, ratio, nil
}

// retrieval indexes c for retrieval (opening the index on first use),
// publishes the index, and returns c's working set, which starts from the
// recent questions of prev's (the codex before, at the same path; nil if
// none), and how many files were indexed again.
func (s *Service) retrieval(ctx context.Context, c *codex.Codex, block runcontext.Codex, plan ctxd.CodexPlan, prev *loaded, progress func(ctxd.CodexProgress)) (*workingSet, int, error) {
	var err error
	if s.index == nil {
		if s.index, err = sqlite.OpenIndex(ctx, filepath.Join(s.cfg.StateDir, "codex-index.db")); err != nil {
			return nil, 0, err
		}
	}
	var indexing func(done, total int)
	if progress != nil {
		indexing = func(done, total int) {
			progress(ctxd.CodexProgress{Stage: ctxd.CodexStageIndexing, Files: done, TotalFiles: total})
		}
	}
	reindexed, err := s.index.Sync(ctx, c, indexing)
	if err != nil {
		return nil, 0, err
	}
	c.DropContent() // read again on demand: a large tree is not kept in memory
	s.index.Publish()
	var recent []string
	var carried []codex.Piece
	if prev != nil {
		if ws, ok := prev.retriever.(*workingSet); ok {
			// The next question reads the same pieces again, so the block
			// changes only from the first edited one on; or chooses from
			// the same questions, if there were none.
			recent, carried = ws.recentQueries(), ws.piecesToCarry()
		}
	}
	return newWorkingSet(s, c, s.index, block, plan.Threshold, recent, carried), reindexed, nil
}

// publish makes l, planned under limits, the current codex (one swap of
// the state readers see), hands it to the sink, starts its background
// count, and logs what changed. The caller holds loadMu.
func (s *Service) publish(l *loaded, limits governor.Limits, block runcontext.Codex, plan ctxd.CodexPlan, reindexed int) {
	old := s.state.Swap(&state{limits: limits, cur: l}).cur
	s.cfg.Sink.SetCodex(block, plan, l.retriever, limits)
	s.countInBackground(l)
	c := l.codex
	for _, sk := range c.Skipped {
		s.log.Debug("codex file skipped", "path", sk.Path, "reason", sk.Reason)
	}
	s.log.Info("codex loaded", "name", c.Name, "files", len(c.Files), "bytes", c.Bytes(), "read", c.Read,
		"tokens", c.Tokens, "tokens_exact", c.Counted, "skipped", len(c.Skipped), "redactions", c.Redactions(),
		"mode", plan.Mode, "reindexed", reindexed, "ms", l.stats.LoadMillis, "reason", plan.Reason)
	switch {
	case old != nil && old.body == l.body && old.path == l.path:
		s.log.Info("codex unchanged: the cached prefix stays valid", "mode", plan.Mode, "files", l.stats.Files)
	case old != nil:
		s.log.Info("codex replaced; a changed codex block makes the backend rebuild its cached prefix from there", "mode", plan.Mode, "files", l.stats.Files)
	}
}

// plan decides CAG or RAG and returns the block requests will render,
// prerendered. It counts only what the decision needs: a codex whose bytes
// alone prove it over the threshold (see codex.Bound) is not counted at
// all; otherwise files are counted exactly in path order until the running
// count, with the bound of the rest, passes the threshold, or all are
// counted. A codex that may fit is rendered with the stable blocks and
// counted exactly, through the shared counter, so the first request that
// renders them finds their tokens counted.
func (s *Service) plan(ctx context.Context, c *codex.Codex, limits governor.Limits, ratio float64) (runcontext.Codex, ctxd.CodexPlan, error) {
	if len(c.Files) == 0 {
		return runcontext.Codex{Mode: runcontext.ModeNone}, ctxd.CodexPlan{Mode: runcontext.ModeNone, Reason: "the codex has no usable files"}, nil
	}
	threshold := limits.PlanCodex(0, 0, ratio, s.room).Threshold
	bound := s.bound()
	var least int64 // the fewest tokens the codex's files can be in the prompt
	counted := 0
	over, err := c.Count(ctx, s.cfg.Tokenizer, s.cache, func(exact, restBytes int64) bool {
		counted = 0
		for _, f := range c.Files {
			if f.Counted {
				counted++
			}
		}
		// A file counted alone may have one token more than in the prompt
		// (a leading space), never fewer.
		least = max(0, exact-int64(counted*codex.BoundSlack)) + bound.Lower(restBytes)
		return least > int64(threshold)
	})
	if err != nil {
		return runcontext.Codex{}, ctxd.CodexPlan{}, err
	}
	if over {
		plan := limits.PlanCodex(-1, least, ratio, s.room)
		if !c.Counted {
			plan.Reason += fmt.Sprintf(" (at least: %d of %d files counted exactly, the rest bounded by their bytes over the vocabulary's longest token, %d bytes)",
				counted, len(c.Files), bound.MaxTokenBytes)
		}
		return s.ragBlock(c, limits), plan, nil
	}
	if err := c.ReadContent(ctx); err != nil {
		return runcontext.Codex{}, ctxd.CodexPlan{}, ctxd.Errorf(ctxd.KindInternal, "%w", err)
	}
	cag := c.Block(runcontext.ModeCAG)
	cag.Prerender(s.cfg.Specials)
	r, err := s.cfg.Stable(cag)
	if err != nil {
		return cag, ctxd.CodexPlan{}, ctxd.Errorf(ctxd.KindInternal, "codex: render the stable blocks: %w", err)
	}
	n, err := s.cfg.Counter.Stable(r)
	if err != nil {
		return cag, ctxd.CodexPlan{}, ctxd.Errorf(ctxd.KindInternal, "codex: count the stable blocks: %w", err)
	}
	if plan := limits.PlanCodex(n, c.Tokens, ratio, s.room); plan.Mode == runcontext.ModeCAG {
		return cag, plan, nil
	} else {
		return s.ragBlock(c, limits), plan, nil
	}
}

// bound is the vocabulary's token bound; without the vocabulary's longest
// token (a tokenizer that only counts) it bounds nothing from below.
func (s *Service) bound() codex.Bound {
	var b codex.Bound
	if t, ok := s.cfg.Tokenizer.(interface{ MaxTokenBytes() int }); ok {
		b.MaxTokenBytes = t.MaxTokenBytes()
	}
	return b
}

// ragBlock is the map of a codex too large to load whole. It may take a
// tenth of the prompt budget (at a conservative two characters a token).
func (s *Service) ragBlock(c *codex.Codex, limits governor.Limits) runcontext.Codex {
	b := c.BlockWithMap(runcontext.ModeRAG, limits.PromptBudget()/10*2)
	b.Prerender(s.cfg.Specials)
	return b
}

// countInBackground counts the tokens of a codex not counted whole, for
// its stats: one goroutine, on a thread at the lowest CPU priority, until
// done or until the next load or Close. Progress shows in Stats.
func (s *Service) countInBackground(l *loaded) {
	if s.bgCancel != nil {
		s.bgCancel()
	}
	c := l.codex
	if c.Counted {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.bgCancel = cancel
	totalBytes := c.Bytes()
	show := func(n codex.Counts, errText string) {
		st := l.stats
		st.Tokens = n.Exact
		st.Counting = &ctxd.CountProgress{Files: n.Counted, TotalFiles: len(c.Files), Bytes: n.Bytes, TotalBytes: totalBytes, Error: errText}
		if totalBytes > 0 {
			st.Counting.Percent = math.Floor(1000*float64(n.Bytes)/float64(totalBytes)) / 10
		}
		l.counted.Store(&st)
	}
	show(codex.Counts{}, "")
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		defer cancel()
		lowPriority()
		var last time.Time
		n, err := c.CountAll(ctx, s.cfg.Tokenizer, s.cache, 1, func(n codex.Counts) {
			if time.Since(last) > 100*time.Millisecond {
				last = time.Now()
				show(n, "")
			}
		})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("codex token count stopped", "err", err)
				show(n, err.Error())
			}
			return
		}
		st := l.stats
		st.Tokens, st.TokensExact, st.Counting = n.Exact, true, nil
		st.Largest = largest(c, n.Tokens)
		l.counted.Store(&st)
		if err := s.cache.Save(); err != nil {
			s.log.Warn("codex cache not saved", "err", err)
		}
		s.log.Info("codex tokens counted", "name", c.Name, "tokens", n.Exact, "files", n.Counted)
	}()
}

func statsOf(c *codex.Codex, plan ctxd.CodexPlan, reindexed int, took time.Duration, redacting bool) ctxd.CodexStats {
	st := ctxd.CodexStats{
		Name: c.Name, Root: c.Root, Files: len(c.Files), Bytes: c.Bytes(), Tokens: c.Tokens, TokensExact: c.Counted,
		Read: c.Read, Plan: plan, Redactions: c.Redactions(), Skipped: c.Skipped, Reindexed: reindexed,
		LoadMillis: float64(took.Microseconds()) / 1000, Redacting: redacting, Order: c.Order,
	}
	if st.Skipped == nil {
		st.Skipped = []ctxd.Skipped{}
	}
	tokens := make([]int, len(c.Files))
	for i, f := range c.Files {
		st.Lines += int64(f.Lines)
		tokens[i] = -1
		if f.Counted {
			tokens[i] = f.Tokens
		}
		if len(f.Redactions) > 0 {
			st.Redacted = append(st.Redacted, ctxd.FileRedactions{Path: f.Path, Redactions: f.Redactions})
		}
	}
	if c.Counted {
		st.Largest = largest(c, tokens)
	}
	return st
}

// largest is the ten files with the most tokens (-1: not counted).
func largest(c *codex.Codex, tokens []int) []ctxd.FileTokens {
	var out []ctxd.FileTokens
	for i, f := range c.Files {
		if tokens[i] >= 0 {
			out = append(out, ctxd.FileTokens{Path: f.Path, Tokens: tokens[i]})
		}
	}
	slices.SortStableFunc(out, func(a, b ctxd.FileTokens) int { return b.Tokens - a.Tokens })
	return out[:min(10, len(out))]
}

// Close stops watching, waits for the watchers (and any reload they run)
// to end, then closes the index. Loads after Close fail with ErrClosed.
func (s *Service) Close() error {
	s.watchMu.Lock() // no watcher starts after this
	s.cancel()
	s.watchMu.Unlock()
	s.watchers.Wait()
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	s.background.Wait()
	s.closed = true
	if s.index != nil {
		if err := s.index.Close(); err != nil {
			return fmt.Errorf("codexsvc: close index: %w", err)
		}
	}
	return nil
}

// Files lists the current codex's files in path order; false if no codex
// is loaded.
func (s *Service) Files() ([]ctxd.CodexFile, bool) {
	l := s.state.Load().cur
	if l == nil {
		return nil, false
	}
	out := make([]ctxd.CodexFile, len(l.codex.Files))
	for i, f := range l.codex.Files {
		out[i] = ctxd.CodexFile{Path: f.Path, Bytes: f.Size, Lines: f.Lines, SHA256: f.SHA256, Redactions: len(f.Redactions)}
	}
	// Listed for people, in path order, whatever order the prompt has.
	slices.SortFunc(out, func(a, b ctxd.CodexFile) int { return strings.Compare(a.Path, b.Path) })
	return out, true
}

// File is one file of the current codex with its content as prompts see
// it (secrets redacted). An unknown path is KindNotFound; a file that
// changed since the load is KindConflict (the watcher's reload follows).
func (s *Service) File(path string) (ctxd.CodexFileContent, error) {
	l := s.state.Load().cur
	if l == nil {
		return ctxd.CodexFileContent{}, ctxd.Errorf(ctxd.KindNotFound, "no codex is loaded")
	}
	files := l.codex.Files
	i := slices.IndexFunc(files, func(f codex.File) bool { return f.Path == path })
	if i < 0 {
		return ctxd.CodexFileContent{}, ctxd.Errorf(ctxd.KindNotFound, "codex %q has no file %q", l.codex.Name, path)
	}
	text, err := l.codex.Content(i)
	if err != nil {
		return ctxd.CodexFileContent{}, ctxd.Errorf(ctxd.KindConflict, "%v", err)
	}
	f := files[i]
	return ctxd.CodexFileContent{
		CodexFile: ctxd.CodexFile{Path: f.Path, Bytes: f.Size, Lines: f.Lines, SHA256: f.SHA256, Redactions: len(f.Redactions)},
		Content:   text,
	}, nil
}
