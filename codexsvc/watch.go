package codexsvc

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/ctxd/ctxd/codex"
)

// debounce is how long the watcher waits after the last change before it
// reloads: an editor's save, a formatter over the tree or a git checkout is
// one reload, not hundreds. A tree that never goes quiet (a build writing
// into it) still reloads settleMax after the first change it has not
// loaded: the wait is bounded.
const (
	debounce  = 750 * time.Millisecond
	settleMax = 10 * time.Second
)

// watch starts watching path for changes (stopping any earlier watch)
// until Close. It returns once the watches are in place. The caller holds
// loadMu, so a reload of the earlier watch cannot slip in after it.
func (s *Service) watch(path string) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	if s.watchCancel != nil {
		s.watchCancel()
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.watchCancel = cancel
	s.watchers.Add(1)
	watching := make(chan struct{})
	go func() {
		defer s.watchers.Done()
		s.watchTree(ctx, path, watching)
	}()
	<-watching
}

// watchTree reloads the codex when files under root change, in debounced
// batches, until ctx ends. What the codex leaves out (its ignore files'
// and exclude patterns' paths, the daemon's own state) is not watched,
// and changes there are not reacted to: with make run's layout, build
// outputs and every answer's writes land in the codex's ignored var/.
func (s *Service) watchTree(ctx context.Context, root string, watching chan<- struct{}) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		close(watching)
		s.log.Warn("codex changes will not be watched", "err", err)
		return
	}
	defer fw.Close()
	t := s.newTreeWatch(fw, root)
	t.addTree(t.dir)
	close(watching)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	pending, rulesChanged := 0, false
	var first time.Time // the first change not loaded yet
	bound := s.cfg.SettleMax
	if bound <= 0 {
		bound = settleMax
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-fw.Events:
			if !ok {
				return
			}
			relevant, rules := t.event(ev)
			if relevant {
				rulesChanged = rulesChanged || rules
				if pending == 0 {
					first = time.Now()
				}
				pending++
				timer.Reset(max(0, min(debounce, bound-time.Since(first))))
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return
			}
			s.log.Warn("codex watcher", "err", err)
		case <-timer.C:
			if rulesChanged {
				rulesChanged = false
				t.rulesChanged()
			}
			s.log.Info("codex files changed; reloading", "events", pending, "waited_ms", time.Since(first).Milliseconds())
			pending = 0
			if err := s.reload(ctx, root); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed) {
				s.log.Error("codex reload failed; keeping the previous codex", "err", err)
			}
		}
	}
}

// treeWatch is one watch of a codex: the directories it watches and what
// in them it ignores. It is used by its watchTree goroutine alone.
type treeWatch struct {
	s    *Service
	w    *fsnotify.Watcher
	dir  string            // the directory watched: the root, or a one-file codex's directory
	file string            // a one-file codex's name in dir; "" for a tree
	own  func(string) bool // the daemon's own state directory
	ig   *codex.Ignorer    // what a load of the tree leaves out
}

func (s *Service) newTreeWatch(w *fsnotify.Watcher, root string) *treeWatch {
	t := &treeWatch{s: s, w: w, dir: root}
	if info, err := os.Stat(root); err == nil && !info.IsDir() {
		// A one-file codex: its directory is watched, not the tree below
		// it, for the file and the settings file beside it.
		t.dir, t.file = filepath.Dir(root), filepath.Base(root)
	}
	// The daemon's own state (sessions, caches, saved slots) may lie inside
	// the codex tree, as with make run's: its writes are not the codex's
	// changes, and watching them would reload on every answer.
	t.own = s.ownDir(t.dir)
	t.ig = s.ignorer(t.dir)
	return t
}

// ignored reports whether a change at p cannot change the codex.
func (t *treeWatch) ignored(p string) bool {
	if t.own(p) {
		return true
	}
	rel, err := filepath.Rel(t.dir, p)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return false
	}
	if t.file != "" {
		return rel != t.file && rel != codex.SettingsFile
	}
	rel = filepath.ToSlash(rel)
	if info, err := os.Stat(p); err == nil {
		return t.ig.Ignored(rel, info.IsDir())
	}
	// Gone: it was a file or a directory, left out only if either would be.
	return t.ig.Ignored(rel, false) && t.ig.Ignored(rel, true)
}

// addTree watches top and the directories below it that are not ignored
// (top alone for a one-file codex).
func (t *treeWatch) addTree(top string) {
	_ = filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		if p != t.dir && t.ignored(p) {
			return filepath.SkipDir
		}
		if err := t.w.Add(p); err != nil {
			t.s.log.Warn("cannot watch codex directory", "dir", p, "err", err)
			return filepath.SkipAll
		}
		if t.file != "" {
			return filepath.SkipDir // the directory alone
		}
		return nil
	})
}

// event takes one change: whether it can change the codex (relevant),
// and whether it changed what is ignored (rules). A directory created is
// watched at once.
func (t *treeWatch) event(ev fsnotify.Event) (relevant, rules bool) {
	if t.ignored(ev.Name) {
		return false, false
	}
	if rel, err := filepath.Rel(t.dir, ev.Name); err == nil && t.file == "" && t.ig.Rules(filepath.ToSlash(rel)) {
		rules = true // what is ignored changes with the reload
	}
	if ev.Has(fsnotify.Create) && t.file == "" {
		if info, err := os.Stat(ev.Name); err == nil && info.IsDir() {
			t.addTree(ev.Name)
		}
	}
	return true, rules
}

// rulesChanged reads what is ignored again: directories newly ignored are
// unwatched, and those no longer ignored are watched.
func (t *treeWatch) rulesChanged() {
	t.ig = t.s.ignorer(t.dir)
	for _, p := range t.w.WatchList() {
		if p != t.dir && t.ignored(p) {
			_ = t.w.Remove(p)
		}
	}
	t.addTree(t.dir)
}

// ignorer is what a load of the tree at dir leaves out, with the daemon's
// include and exclude patterns and the codex's settings. Settings that do
// not load leave the daemon's patterns alone: the load reports them.
func (s *Service) ignorer(dir string) *codex.Ignorer {
	settings, _, err := codex.LoadSettings(dir, s.cfg.Settings.Walk.Within)
	if err != nil {
		settings = codex.Settings{}
	}
	cc := s.cfg.Settings.Walk
	return codex.NewIgnorer(dir, codex.Options{Include: cc.Include, Exclude: cc.Exclude}.Merge(settings.Codex))
}

// ownDir reports whether a directory is the daemon's state directory or
// lies under it, by path and, through symlinks and bind mounts, by
// identity. When the state directory holds the codex root itself, nothing
// is filtered (the root must be watched), and the log says the daemon's
// own writes will reload the codex.
func (s *Service) ownDir(root string) func(string) bool {
	none := func(string) bool { return false }
	if s.cfg.StateDir == "" {
		return none
	}
	state, err := filepath.Abs(s.cfg.StateDir)
	if err != nil {
		return none
	}
	under := func(p string) bool {
		p, err := filepath.Abs(p)
		if err != nil {
			return false
		}
		rel, err := filepath.Rel(state, p)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	if under(root) {
		s.log.Warn("the state directory holds the codex: the daemon's own writes will reload it; keep daemon.state_dir outside codex.path", "state_dir", state, "codex", root)
		return none
	}
	stateInfo, statErr := os.Stat(state)
	return func(p string) bool {
		if under(p) {
			return true
		}
		if statErr != nil {
			return false
		}
		info, err := os.Stat(p)
		return err == nil && os.SameFile(info, stateInfo)
	}
}
