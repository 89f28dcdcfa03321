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
}

// walker lists a tree's files in sorted order.
type walker struct {
	ctx     context.Context // a load that is cancelled stops walking
	root    string          // resolved (symlink-free) absolute root
	include []gitignore.Pattern
	exclude []gitignore.Pattern
	visited map[string]bool // resolved directories already walked: symlink loops end here
	files   []entry
	skipped []ctxd.Skipped
}

func newWalker(ctx context.Context, root string, opts Options) (*walker, error) {
	w := &walker{ctx: ctx, root: root, visited: map[string]bool{}}
	for _, p := range opts.Include {
		w.include = append(w.include, gitignore.ParsePattern(p, nil))
	}
	for _, p := range opts.Exclude {
		w.exclude = append(w.exclude, gitignore.ParsePattern(p, nil))
	}
	return w, nil
}

func (w *walker) skip(rel, reason string) {
	w.skipped = append(w.skipped, ctxd.Skipped{Path: rel, Reason: reason})
}

// walk descends into dir (resolved path real, relative path rel) with the
// ignore patterns inherited from its parents.
func (w *walker) walk(real, rel string, inherited []gitignore.Pattern) error {
	if err := w.ctx.Err(); err != nil {
		return fmt.Errorf("codex: load cancelled: %w", err)
	}
	if w.visited[real] {
		w.skip(rel, "directory already included (symbolic link loop or duplicate)")
		return nil
	}
	w.visited[real] = true
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
		case info.IsDir():
			if err := w.walk(childReal, childRel, patterns); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			if len(w.include) > 0 && !gitignore.NewMatcher(w.include).Match(path, false) {
				continue // not among the included files
			}
			w.files = append(w.files, entry{rel: childRel, abs: childReal, size: info.Size()})
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
