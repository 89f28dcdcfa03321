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
// reloads: an editor's save or a git checkout is one reload, not hundreds.
const debounce = 750 * time.Millisecond

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
	w, err := fsnotify.NewWatcher()
	if err != nil {
		close(watching)
		s.log.Warn("codex changes will not be watched", "err", err)
		return
	}
	defer w.Close()
	dir, file := root, ""
	if info, err := os.Stat(root); err == nil && !info.IsDir() {
		// A one-file codex: its directory is watched, not the tree below
		// it, for the file and the settings file beside it.
		dir, file = filepath.Dir(root), filepath.Base(root)
	}
	// The daemon's own state (sessions, caches, saved slots) may lie inside
	// the codex tree, as with make run's: its writes are not the codex's
	// changes, and watching them would reload on every answer.
	own := s.ownDir(dir)
	ig := s.ignorer(dir)
	// ignored reports whether a change at p cannot change the codex.
	ignored := func(p string) bool {
		if own(p) {
			return true
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return false
		}
		if file != "" {
			return rel != file && rel != codex.SettingsFile
		}
		rel = filepath.ToSlash(rel)
		if info, err := os.Stat(p); err == nil {
			return ig.Ignored(rel, info.IsDir())
		}
		// Gone: it was a file or a directory, left out only if either would be.
		return ig.Ignored(rel, false) && ig.Ignored(rel, true)
	}
	addTree := func(top string) {
		_ = filepath.WalkDir(top, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			if p != dir && ignored(p) {
				return filepath.SkipDir
			}
			if err := w.Add(p); err != nil {
				s.log.Warn("cannot watch codex directory", "dir", p, "err", err)
				return filepath.SkipAll
			}
			if file != "" {
				return filepath.SkipDir // the directory alone
			}
			return nil
		})
	}
	addTree(dir)
	close(watching)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	pending, rulesChanged := 0, false
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ignored(ev.Name) {
				continue
			}
			if rel, err := filepath.Rel(dir, ev.Name); err == nil && file == "" && ig.Rules(filepath.ToSlash(rel)) {
				rulesChanged = true // what is ignored changes with the reload
			}
			if ev.Has(fsnotify.Create) && file == "" {
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
			s.log.Warn("codex watcher", "err", err)
		case <-timer.C:
			if rulesChanged {
				// Directories newly ignored are unwatched, and those no
				// longer ignored are watched.
				rulesChanged = false
				ig = s.ignorer(dir)
				for _, p := range w.WatchList() {
					if p != dir && ignored(p) {
						_ = w.Remove(p)
					}
				}
				addTree(dir)
			}
			s.log.Info("codex files changed; reloading", "events", pending)
			pending = 0
			if err := s.reload(ctx, root); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed) {
				s.log.Error("codex reload failed; keeping the previous codex", "err", err)
			}
		}
	}
}

// ignorer is what a load of the tree at dir leaves out, with the daemon's
// include and exclude patterns and the codex's settings. Settings that do
// not load leave the daemon's patterns alone: the load reports them.
func (s *Service) ignorer(dir string) *codex.Ignorer {
	settings, _, err := codex.LoadSettings(dir)
	if err != nil {
		settings = codex.Settings{}
	}
	cc := s.cfg.Codex
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
