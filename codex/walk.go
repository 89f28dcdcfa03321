package codex

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"

	"github.com/ctxd/ctxd"
)

// ignoreFiles are read in every directory, in this order (later wins).
var ignoreFiles = []string{".gitignore", ".ignore"}

// entry is one file the walk found.
type entry struct {
	rel  string // slash-separated path relative to the root
	abs  string // where to read it
	size int64
	stat fileStat
}

// walker lists a tree's files (the caller sorts them). Directories are
// walked in parallel: a reload is mostly the walk's system calls.
type walker struct {
	ctx     context.Context // a load that is cancelled stops walking
	root    string          // resolved (symlink-free) absolute root
	include []gitignore.Pattern
	exclude []gitignore.Pattern

	sem chan struct{} // bounds the goroutines walking directories
	wg  sync.WaitGroup

	mu       sync.Mutex      // guards the fields below
	visited  map[string]bool // resolved directories already walked: symlink loops end here
	links    []link          // linked directories, walked after the tree they link into
	files    []entry
	skipped  []ctxd.Skipped
	firstErr error
}

func newWalker(ctx context.Context, root string, opts Options) (*walker, error) {
	w := &walker{ctx: ctx, root: root, visited: map[string]bool{}, sem: make(chan struct{}, 4)}
	for _, p := range opts.Include {
		w.include = append(w.include, gitignore.ParsePattern(p, nil))
	}
	for _, p := range opts.Exclude {
		w.exclude = append(w.exclude, gitignore.ParsePattern(p, nil))
	}
	return w, nil
}

func (w *walker) skip(rel, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.skipped = append(w.skipped, ctxd.Skipped{Path: rel, Reason: reason})
}

// link is a symbolic link to a directory, found by the walk.
type link struct {
	real, rel string
	patterns  []gitignore.Pattern
}

// run walks the tree below the root and waits for every directory. The
// real directories are walked in parallel; then the linked ones, one at a
// time in path order, so which of two ways to one directory is walked and
// which is reported as a duplicate does not depend on timing.
func (w *walker) run() error {
	err := w.walk(w.root, "", nil)
	for {
		w.wg.Wait()
		if err == nil {
			err = w.firstErr
		}
		if err != nil || len(w.links) == 0 {
			return err
		}
		links := w.links
		w.links = nil
		slices.SortFunc(links, func(a, b link) int { return strings.Compare(a.rel, b.rel) })
		for _, l := range links {
			if err = w.walk(l.real, l.rel, l.patterns); err != nil {
				break
			}
			w.wg.Wait()
		}
	}
}

// descend walks a subdirectory on a goroutine of its own if one is free,
// otherwise on this one.
func (w *walker) descend(real, rel string, patterns []gitignore.Pattern) error {
	select {
	case w.sem <- struct{}{}:
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			defer func() { <-w.sem }()
			if err := w.walk(real, rel, patterns); err != nil {
				w.mu.Lock()
				if w.firstErr == nil {
					w.firstErr = err
				}
				w.mu.Unlock()
			}
		}()
		return nil
	default:
		return w.walk(real, rel, patterns)
	}
}

// walk descends into dir (resolved path real, relative path rel) with the
// ignore patterns inherited from its parents.
func (w *walker) walk(real, rel string, inherited []gitignore.Pattern) error {
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("codex: load cancelled: %w", err)
	}
	w.mu.Lock()
	seen := w.visited[real]
	w.visited[real] = true
	w.mu.Unlock()
	if seen {
		w.skip(rel, "directory already included (symbolic link loop or duplicate)")
		return nil
	}
	entries, err := os.ReadDir(real)
	if err != nil {
		if rel == "" {
			return fmt.Errorf("codex: read %s: %w", w.root, err)
		}
		w.skip(rel, fmt.Sprintf("unreadable directory: %v", errors.Unwrap(err)))
		return nil
	}
	domain := splitRel(rel)
	patterns := slices.Clone(inherited)
	for _, name := range ignoreFiles {
		// Only names the listing holds are opened: most directories have
		// no ignore file, and a reload is mostly system calls.
		if _, ok := slices.BinarySearchFunc(entries, name, func(e fs.DirEntry, n string) int { return strings.Compare(e.Name(), n) }); !ok {
			continue
		}
		ps, err := readPatterns(filepath.Join(real, name), domain)
		if err != nil {
			w.skip(join(rel, name), fmt.Sprintf("ignore file unreadable: %v", err))
		}
		patterns = append(patterns, ps...)
	}
	matcher := gitignore.NewMatcher(patterns)
	for _, e := range entries { // ReadDir sorts by name
		name := e.Name()
		childRel := join(rel, name)
		if name == ".git" || name == SettingsFile {
			continue // version control data and the codex's own settings are not content
		}
		childReal := filepath.Join(real, name)
		info, err := e.Info()
		if err != nil {
			w.skip(childRel, fmt.Sprintf("unreadable: %v", err))
			continue
		}
		isLink := info.Mode()&fs.ModeSymlink != 0
		if isLink {
			target, err := filepath.EvalSymlinks(childReal)
			if err != nil {
				w.skip(childRel, fmt.Sprintf("broken symbolic link: %v", errors.Unwrap(err)))
				continue
			}
			if !inside(w.root, target) {
				w.skip(childRel, "symbolic link points outside the codex")
				continue
			}
			if info, err = os.Stat(target); err != nil {
				w.skip(childRel, fmt.Sprintf("unreadable: %v", err))
				continue
			}
			childReal = target
		}
		path := append(slices.Clone(domain), name)
		if matcher.Match(path, info.IsDir()) {
			continue // ignored by .gitignore/.ignore: the tree's owner said so
		}
		if w.excluded(path, info.IsDir()) {
			w.skip(childRel, "excluded by the codex's exclude patterns")
			continue
		}
		switch {
		case info.IsDir() && isLink:
			w.mu.Lock()
			w.links = append(w.links, link{real: childReal, rel: childRel, patterns: patterns})
			w.mu.Unlock()
		case info.IsDir():
			if err := w.descend(childReal, childRel, patterns); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			if len(w.include) > 0 && !gitignore.NewMatcher(w.include).Match(path, false) {
				continue // not among the included files
			}
			w.mu.Lock()
			w.files = append(w.files, entry{rel: childRel, abs: childReal, size: info.Size(), stat: statOf(info)})
			w.mu.Unlock()
		default:
			w.skip(childRel, "not a regular file")
		}
	}
	return nil
}

func (w *walker) excluded(path []string, isDir bool) bool {
	return len(w.exclude) > 0 && gitignore.NewMatcher(w.exclude).Match(path, isDir)
}

// readPatterns reads one ignore file; a missing file has no patterns.
func readPatterns(path string, domain []string) ([]gitignore.Pattern, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ps []gitignore.Pattern
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	return ps, sc.Err()
}

func splitRel(rel string) []string {
	if rel == "" {
		return nil
	}
	return strings.Split(rel, "/")
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// inside reports whether path is root or below it (both resolved).
func inside(root, path string) bool {
	return path == root || strings.HasPrefix(path, root+string(filepath.Separator))
}

// quotePath is how a path appears in rendered text.
func quotePath(p string) string { return strconv.Quote(p) }
