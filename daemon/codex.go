package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sqlite"
)

// CodexStats describes the loaded codex (GET /v1/codex, ctxd codex stats).
type CodexStats struct {
	Name       string             `json:"name"`
	Root       string             `json:"root"`
	Files      int                `json:"files"`
	Bytes      int64              `json:"bytes"`
	Tokens     int64              `json:"tokens"`
	Plan       governor.CodexPlan `json:"plan"`
	Largest    []FileTokens       `json:"largest"`
	Redactions int                `json:"redactions"`
	Redacted   []FileRedactions   `json:"redacted,omitempty"`
	Skipped    []codex.Skipped    `json:"skipped"`
	Reindexed  int                `json:"reindexed"`
	LoadMillis float64            `json:"load_ms"`
	Redacting  bool               `json:"redacting"`
}

// FileTokens is one file's size in tokens.
type FileTokens struct {
	Path   string `json:"path"`
	Tokens int    `json:"tokens"`
}

// FileRedactions lists what was redacted in one file.
type FileRedactions struct {
	Path       string            `json:"path"`
	Redactions []codex.Redaction `json:"redactions"`
}

// codexSet is the loaded codex and what came of it, swapped whole.
type codexSet struct {
	c     *codex.Codex
	state orchestrator.CodexState
	stats CodexStats
}

// loadCodex loads, counts, plans and (for RAG) indexes the codex at path.
// It serializes with other loads.
func (d *Daemon) loadCodex(ctx context.Context, path string, progress func(codex.Progress)) (*codexSet, error) {
	d.codexMu.Lock()
	defer d.codexMu.Unlock()
	start := time.Now()
	settings, _, err := codex.LoadSettings(path)
	if err != nil {
		return nil, err
	}
	opts := codex.Options{
		MaxFileBytes: d.cfg.Codex.MaxFileBytes, MaxTotalBytes: d.cfg.Codex.MaxTotalBytes,
		Include: d.cfg.Codex.Include, Exclude: d.cfg.Codex.Exclude, NoRedact: !d.cfg.Codex.Redact,
		Progress: progress,
	}.Merge(settings.Codex)
	d.mu.RLock()
	tok, limits, tokID := d.tok, d.limits, d.tokID
	d.mu.RUnlock()
	if tok != nil {
		opts.Counter = tok
		if d.codexCache == nil || d.codexCacheID != tokID {
			cache, err := codex.OpenCache(filepath.Join(d.cfg.Daemon.StateDir, "codex-cache.gob"), tokID)
			if err != nil {
				return nil, err
			}
			d.codexCache, d.codexCacheID = cache, tokID
		}
		opts.Cache = d.codexCache
	}
	c, err := codex.Load(path, opts)
	if err != nil {
		return nil, err
	}
	if opts.Cache != nil {
		if err := opts.Cache.Save(); err != nil {
			d.log.Warn("codex cache not saved", "err", err)
		}
	}
	set := &codexSet{c: c}
	ratio := d.cfg.Codex.CAGRatio
	if settings.Codex.CAGRatio > 0 {
		ratio = min(ratio, settings.Codex.CAGRatio) // a codex may only tighten
	}
	plan, err := d.planCodex(c, limits, ratio)
	if err != nil {
		return nil, err
	}
	// The map of a RAG codex may take a tenth of the prompt budget (at a
	// conservative two characters a token).
	mapChars := limits.PromptBudget() / 10 * 2
	state := orchestrator.CodexState{Block: c.BlockWithMap(plan.Mode, mapChars), Plan: plan, TopK: d.cfg.Codex.TopK}
	reindexed := 0
	if plan.Mode == runcontext.ModeRAG {
		if d.index == nil {
			if d.index, err = sqlite.OpenIndex(ctx, filepath.Join(d.cfg.Daemon.StateDir, "codex-index.db")); err != nil {
				return nil, err
			}
		}
		if reindexed, err = d.index.Sync(ctx, c); err != nil {
			return nil, err
		}
		state.Retriever = d.index
	}
	set.state = state
	set.stats = statsOf(c, plan, reindexed, time.Since(start), !opts.NoRedact)
	for _, s := range c.Skipped {
		d.log.Debug("codex file skipped", "path", s.Path, "reason", s.Reason)
	}
	d.log.Info("codex loaded", "name", c.Name, "files", len(c.Files), "bytes", c.Bytes(), "tokens", c.Tokens,
		"skipped", len(c.Skipped), "redactions", c.Redactions(), "mode", plan.Mode, "reindexed", reindexed,
		"ms", set.stats.LoadMillis, "reason", plan.Reason)
	return set, nil
}

// planCodex decides CAG or RAG. Without a tokenizer yet (the backend is
// not up) the codex is planned later, when it is.
func (d *Daemon) planCodex(c *codex.Codex, limits governor.Limits, ratio float64) (governor.CodexPlan, error) {
	if len(c.Files) == 0 {
		return governor.CodexPlan{Mode: runcontext.ModeNone, Reason: "the codex has no usable files"}, nil
	}
	d.mu.RLock()
	tok := d.tok
	d.mu.RUnlock()
	if tok == nil || limits.NumCtx == 0 {
		return governor.CodexPlan{Mode: runcontext.ModeCAG, Reason: "not planned yet: the backend is not ready"}, nil
	}
	if c.Tokens > int64(limits.PromptBudget()) {
		return limits.PlanCodex(-1, c.Tokens, ratio), nil
	}
	// Count the stable blocks exactly, as they will render.
	env, _ := d.probe.Environment()
	sigil, _ := d.sigils.Resolve("")
	r := runcontext.Render(&runcontext.RunContext{
		Identity: d.identity(), Codex: c.Block(runcontext.ModeCAG), Environment: env, Sigil: sigil,
	})
	n, err := tok.CountText(r.Prompt()[:r.Offset(runcontext.BlockState)])
	if err != nil {
		return governor.CodexPlan{}, fmt.Errorf("daemon: count the codex: %w", err)
	}
	return limits.PlanCodex(n, c.Tokens, ratio), nil
}

func statsOf(c *codex.Codex, plan governor.CodexPlan, reindexed int, took time.Duration, redacting bool) CodexStats {
	st := CodexStats{
		Name: c.Name, Root: c.Root, Files: len(c.Files), Bytes: c.Bytes(), Tokens: c.Tokens, Plan: plan,
		Redactions: c.Redactions(), Skipped: c.Skipped, Reindexed: reindexed,
		LoadMillis: float64(took.Microseconds()) / 1000, Redacting: redacting,
	}
	if st.Skipped == nil {
		st.Skipped = []codex.Skipped{}
	}
	for _, f := range c.Files {
		st.Largest = append(st.Largest, FileTokens{f.Path, f.Tokens})
		if len(f.Redactions) > 0 {
			st.Redacted = append(st.Redacted, FileRedactions{f.Path, f.Redactions})
		}
	}
	slices.SortStableFunc(st.Largest, func(a, b FileTokens) int { return b.Tokens - a.Tokens })
	st.Largest = st.Largest[:min(10, len(st.Largest))]
	return st
}

// applyCodex makes set the codex requests see.
func (d *Daemon) applyCodex(set *codexSet) {
	d.mu.Lock()
	old := d.codex
	d.codex = set
	orch := d.orch
	d.mu.Unlock()
	if orch != nil {
		orch.SetCodex(set.state)
	}
	if old != nil && old.state.Block.Body != set.state.Block.Body {
		d.log.Info("codex changed; the backend will rebuild the cached prefix from the codex block on",
			"mode", set.state.Plan.Mode, "files", set.stats.Files)
	}
}

// watchCodex reloads the codex when files under its root change, in
// debounced batches, until ctx ends.
func (d *Daemon) watchCodex(ctx context.Context, root string, watching chan<- struct{}) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		close(watching)
		d.log.Warn("codex changes will not be watched", "err", err)
		return
	}
	defer w.Close()
	addTree := func(dir string) {
		_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			if e.Name() == ".git" {
				return filepath.SkipDir
			}
			if err := w.Add(p); err != nil {
				d.log.Warn("cannot watch codex directory", "dir", p, "err", err)
				return filepath.SkipAll
			}
			return nil
		})
	}
	dir := root
	if info, err := os.Stat(root); err == nil && !info.IsDir() {
		dir = filepath.Dir(root)
	}
	addTree(dir)
	close(watching)
	const debounce = 750 * time.Millisecond
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	pending := 0
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) {
				if info, err := os.Stat(ev.Name); err == nil && info.IsDir() {
					addTree(ev.Name)
				}
			}
			pending++
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			d.log.Warn("codex watcher", "err", err)
		case <-timer.C:
			if ctx.Err() != nil {
				return
			}
			d.log.Info("codex files changed; reloading", "events", pending)
			pending = 0
			set, err := d.loadCodex(ctx, root, nil)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					d.log.Error("codex reload failed; keeping the previous codex", "err", err)
				}
				continue
			}
			d.applyCodex(set)
		}
	}
}

// codexSyncState guards the codex load machinery.
type codexSyncState struct {
	codexMu      sync.Mutex // serializes loads; guards codexCache, codexCacheID, index
	codexCache   *codex.Cache
	codexCacheID string
	index        *sqlite.Index

	watchMu     sync.Mutex // guards watchCancel
	watchCancel context.CancelFunc
	watchers    sync.WaitGroup
}

// watch starts watching path (stopping any earlier watch) until ctx ends.
// It returns once the watches are in place.
func (d *Daemon) watch(ctx context.Context, path string) {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.watchCancel != nil {
		d.watchCancel()
	}
	wctx, cancel := context.WithCancel(ctx)
	d.watchCancel = cancel
	d.watchers.Add(1)
	watching := make(chan struct{})
	go func() {
		defer d.watchers.Done()
		d.watchCodex(wctx, path, watching)
	}()
	<-watching
}
