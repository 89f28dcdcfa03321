package codex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"

	"github.com/ctxd/ctxd"
)

// ignoreFiles are read in every directory, in this order (later wins).
var ignoreFiles = []string{".gitignore", ".ignore"}

// An ignore file is read up to these caps; rules past them are not applied
// (and the load says so): a hostile tree cannot make the walk hold an
// unbounded pattern list, nor match every path against one.
const (
	maxIgnoreBytes    = 1 << 20
	maxIgnorePatterns = 10000
)

// secretFile says whether a file is a secret (a .env, a private key) that
// is left out unless the include patterns name it: SecretFile, a variable
// so a test can swap it.
var secretFile = SecretFile

// entry is one file the walk found.
type entry struct {
	rel  string // slash-separated path relative to the root
	real string // where to read it: the file's own path below the root, links resolved
	size int64
	stat fileStat
}

// walker lists a tree's files (the caller sorts them). Directories are
// walked in parallel: a reload is mostly the walk's system calls.
type walker struct {
	ctx     context.Context // a load that is cancelled stops walking
	root    *treeRoot       // held open: everything is read beneath it
	include []gitignore.Pattern
	exclude []gitignore.Pattern
	// allowSecret names the secret files the operator lets load.
	allowSecret []string

	sem chan struct{} // bounds the goroutines walking directories
	wg  sync.WaitGroup

	mu       sync.Mutex      // guards the fields below
	visited  map[string]bool // resolved directories already walked: symlink loops end here
	links    []link          // linked directories, walked after the tree they link into
	files    []entry
	skipped  []ctxd.Skipped
	firstErr error
}

func newWalker(ctx context.Context, root *treeRoot, opts Options) (*walker, error) {
	w := &walker{ctx: ctx, root: root, visited: map[string]bool{}, sem: make(chan struct{}, 4), allowSecret: opts.AllowSecret}
	for _, p := range opts.Include {
		w.include = append(w.include, gitignore.ParsePattern(p, nil))
	}
	for _, p := range opts.Exclude {
		w.exclude = append(w.exclude, gitignore.ParsePattern(p, nil))
	}
	return w, nil
}

// skip reports a path left out, quoted if its name is one that cannot be
// shown raw (see nameProblem).
func (w *walker) skip(rel, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.skipped = append(w.skipped, ctxd.Skipped{Path: safePath(rel), Reason: reason})
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
	err := w.walk(w.root.path, "", nil)
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
	entries, err := readDir(w.root, w.below(real))
	if err != nil {
		if rel == "" {
			return fmt.Errorf("codex: read %s: %w", w.root.path, err)
		}
		w.skip(rel, fmt.Sprintf("unreadable directory: %v", errors.Unwrap(err)))
		return nil
	}
	domain := splitRel(rel)
	// Only names the listing holds are opened: most directories have no
	// ignore file, and a reload is mostly system calls.
	listed := func(name string) (fs.FileMode, bool) {
		i, ok := slices.BinarySearchFunc(entries, name, func(e fs.DirEntry, n string) int { return strings.Compare(e.Name(), n) })
		if !ok {
			return 0, false
		}
		return entries[i].Type(), true
	}
	own, notes := dirPatterns(w.root, w.below(real), rel, listed)
	for _, n := range notes {
		w.skip(n.Path, n.Reason)
	}
	patterns := append(slices.Clone(inherited), own...)
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
			if !inside(w.root.path, target) {
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
		if reason := nameProblem(name); reason != "" {
			w.skip(childRel, reason)
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
			if reason, ok := w.secret(childRel, childReal, isLink); ok {
				w.skip(childRel, reason)
				continue
			}
			w.mu.Lock()
			w.files = append(w.files, entry{rel: childRel, real: w.below(childReal), size: info.Size(), stat: statOf(info)})
			w.mu.Unlock()
		default:
			w.skip(childRel, (&notRegularError{mode: info.Mode()}).Error())
		}
	}
	return nil
}

func (w *walker) excluded(path []string, isDir bool) bool {
	return len(w.exclude) > 0 && gitignore.NewMatcher(w.exclude).Match(path, isDir)
}

// secret says whether a file is a secret left out of the codex: by its
// path, or a link's by its target's too. Include patterns do not bring a
// secret file back (a codex's own settings add to them); only the
// operator's allow_secret_files, by name, does.
func (w *walker) secret(rel, real string, isLink bool) (string, bool) {
	check := func(p string) (string, bool) {
		reason, ok := secretFile(p)
		if ok && len(w.allowSecret) > 0 && gitignore.NewMatcher(w.secretAllowed()).Match(splitRel(p), false) {
			return "", false
		}
		return reason, ok
	}
	if reason, ok := check(rel); ok {
		return reason + "; the daemon's codex.allow_secret_files can name it", true
	}
	if isLink {
		if reason, ok := check(w.below(real)); ok {
			return reason + " (a link's target); the daemon's codex.allow_secret_files can name it", true
		}
	}
	return "", false
}

// secretAllowed is allowSecret as patterns.
func (w *walker) secretAllowed() []gitignore.Pattern {
	ps := make([]gitignore.Pattern, 0, len(w.allowSecret))
	for _, p := range w.allowSecret {
		ps = append(ps, gitignore.ParsePattern(p, nil))
	}
	return ps
}

// below is the path real (absolute, resolved, inside the root) relative
// to the root, slash-separated; "" for the root itself.
func (w *walker) below(real string) string { return belowRoot(w.root.path, real) }

func belowRoot(root, real string) string {
	if real == root {
		return ""
	}
	return filepath.ToSlash(strings.TrimPrefix(real, strings.TrimSuffix(root, string(filepath.Separator))+string(filepath.Separator)))
}

// dirPatterns reads the ignore files of directory below (relative to the
// tree's root, links resolved; rel is how the codex names it) that listed
// says it holds, and returns their patterns and notes on what could not
// be read or applied (paths relative to the root). An ignore file that is
// a link is read only if it leads to a file inside the codex.
func dirPatterns(root *treeRoot, below, rel string, listed func(name string) (fs.FileMode, bool)) ([]gitignore.Pattern, []ctxd.Skipped) {
	var (
		patterns []gitignore.Pattern
		notes    []ctxd.Skipped
	)
	domain := splitRel(rel)
	for _, name := range ignoreFiles {
		mode, ok := listed(name)
		if !ok {
			continue
		}
		path := join(below, name)
		switch {
		case mode&fs.ModeSymlink != 0:
			target, err := filepath.EvalSymlinks(filepath.Join(root.path, filepath.FromSlash(path)))
			if err != nil {
				continue // dangling: no patterns; the walk reports the link
			}
			if !inside(root.path, target) {
				notes = append(notes, ctxd.Skipped{Path: join(rel, name), Reason: "ignore file is a symbolic link out of the codex: not read"})
				continue
			}
			path = belowRoot(root.path, target)
		case !mode.IsRegular():
			continue // the walk reports it as not a regular file
		}
		ps, note, err := readPatterns(root, path, domain)
		if err != nil {
			note = fmt.Sprintf("ignore file unreadable: %v", err)
		}
		if note != "" {
			notes = append(notes, ctxd.Skipped{Path: join(rel, name), Reason: note})
		}
		patterns = append(patterns, ps...)
	}
	return patterns, notes
}

// readPatterns reads one ignore file (path below the root), up to
// maxIgnoreBytes and maxIgnorePatterns; note says what lay past them, not
// applied. A missing file has no patterns; one that is not a regular file
// is an error.
func readPatterns(root *treeRoot, path string, domain []string) (ps []gitignore.Pattern, note string, err error) {
	f, _, err := openRegular(root, path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxIgnoreBytes+1))
	if err != nil {
		return nil, "", err
	}
	if len(data) > maxIgnoreBytes {
		// A line the cap cuts is not a rule.
		data = data[:bytes.LastIndexByte(data[:maxIgnoreBytes], '\n')+1]
		note = fmt.Sprintf("ignore file over %d bytes: only the rules in its first %d bytes are applied", maxIgnoreBytes, maxIgnoreBytes)
	}
	for line := range strings.Lines(string(data)) {
		line = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(ps) == maxIgnorePatterns {
			return ps, fmt.Sprintf("ignore file over %d patterns: only its first %d patterns are applied", maxIgnorePatterns, maxIgnorePatterns), nil
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	return ps, note, nil
}

// nameProblem says why a file name cannot be part of the codex, or "" if
// it can. Every request carries the codex's paths, and the RunContext
// refuses control characters in them: one file named with a newline would
// fail every request. Such names are skipped, and reported quoted.
func nameProblem(name string) string {
	if !utf8.ValidString(name) {
		return "file name is not valid UTF-8 (the path is shown quoted)"
	}
	if strings.IndexFunc(name, unicode.IsControl) >= 0 {
		return "file name has a control character (the path is shown quoted)"
	}
	return ""
}

// safePath is rel as a report shows it: quoted if any of its names has a
// problem, so no path can break a line of a log or a terminal's output.
func safePath(rel string) string {
	if nameProblem(rel) != "" {
		return strconv.Quote(rel)
	}
	return rel
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
	return path == root || strings.HasPrefix(path, strings.TrimSuffix(root, string(filepath.Separator))+string(filepath.Separator))
}

// resolve is path made absolute with its links resolved.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// AllowedDir is a directory a codex root must lie beneath, pinned by
// its identity (device and inode) when it was allowed: a directory put in
// its place since, through a link or a rename, is not it.
type AllowedDir struct {
	Path     string // resolved
	File     string // for a one-file codex: the directory allows this file of it alone
	dev, ino uint64
}

// allows reports whether a codex of directory real (the file only of it,
// for a one-file codex) lies beneath d, by path.
func (d AllowedDir) allows(real, only string) bool {
	if d.File != "" {
		return real == d.Path && only == d.File
	}
	return inside(d.Path, real)
}

// Allow pins the directories paths (resolved now); a path that is a
// file allows that file alone, as a one-file codex. One that does not
// exist yet is pinned by its path alone.
func Allow(paths []string) []AllowedDir {
	var out []AllowedDir
	for _, p := range paths {
		real, err := resolve(p)
		if err != nil {
			real = filepath.Clean(p)
		}
		d := AllowedDir{Path: real}
		if info, err := os.Stat(real); err == nil && !info.IsDir() {
			d.Path, d.File = filepath.Dir(real), filepath.Base(real)
		}
		d.dev, d.ino = identity(d.Path)
		out = append(out, d)
	}
	return out
}

// OutsideError is a codex root that is not (or no longer) beneath any of
// the directories the operator allows: checked on every load and reload,
// by opening the root beneath the allowed directory's descriptor.
type OutsideError struct {
	Path  string       // the root, resolved
	Roots []AllowedDir // the allowed directories
	Why   string       // what made it so, where known
}

func (e *OutsideError) Error() string {
	var roots []string
	for _, r := range e.Roots {
		roots = append(roots, filepath.Join(r.Path, r.File))
	}
	msg := fmt.Sprintf("%s is not under a directory the operator allows (codex.path and codex.load_roots: %s)", e.Path, strings.Join(roots, ", "))
	if e.Why != "" {
		msg += ": " + e.Why
	}
	return msg
}

// quotePath is how a path appears in rendered text.
func quotePath(p string) string { return strconv.Quote(p) }

// notRegularError: a path the walk found to be a regular file is, when
// opened, something else.
type notRegularError struct{ mode fs.FileMode }

func (e *notRegularError) Error() string { return "not a regular file (" + fileKind(e.mode) + ")" }

// fileKind names what a file that is not regular is.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsDir():
		return "a directory"
	}
	return "an irregular file"
}

// Ignorer tells a watcher which paths below a codex root a load leaves
// out: those its ignore files ignore, the exclude patterns exclude, files
// the include patterns do not name, and version control data. A change
// there cannot change the codex, and a directory there need not be
// watched. Ignore files and the root's settings file are never ignored,
// whatever the patterns say: a change to them changes what loads.
//
// It reads each directory's ignore files once, when first asked about a
// path below it; after an ignore file changes, make a new one. It does not
// follow symbolic links (the watcher does not watch through them). It is
// not safe for concurrent use.
type Ignorer struct {
	root     string
	tree     *treeRoot // opened on first use; nil if it cannot be
	opened   bool
	include  []gitignore.Pattern
	exclude  []gitignore.Pattern
	patterns map[string][]gitignore.Pattern // by directory ("" the root): the patterns in force in it
}

// NewIgnorer returns the Ignorer of the directory root with opts' include
// and exclude patterns.
func NewIgnorer(root string, opts Options) *Ignorer {
	w, _ := newWalker(context.Background(), nil, opts)
	return &Ignorer{root: root, include: w.include, exclude: w.exclude, patterns: map[string][]gitignore.Pattern{}}
}

// Ignored reports whether the path rel (slash-separated, relative to the
// root) is left out of the codex, as a directory if isDir.
func (ig *Ignorer) Ignored(rel string, isDir bool) bool {
	parts := splitRel(rel)
	if len(parts) == 0 {
		return false
	}
	for i, name := range parts {
		last := i == len(parts)-1
		if last && !isDir && (slices.Contains(ignoreFiles, name) || i == 0 && name == SettingsFile) {
			return false // it shapes the load, whatever the patterns say
		}
		if name == ".git" || name == SettingsFile {
			return true
		}
		dir := !last || isDir
		path := parts[:i+1]
		if gitignore.NewMatcher(ig.patternsIn(strings.Join(parts[:i], "/"))).Match(path, dir) {
			return true
		}
		if len(ig.exclude) > 0 && gitignore.NewMatcher(ig.exclude).Match(path, dir) {
			return true
		}
	}
	return !isDir && len(ig.include) > 0 && !gitignore.NewMatcher(ig.include).Match(parts, false)
}

// patternsIn is the patterns in force in directory rel: its parents' and
// its own ignore files'.
func (ig *Ignorer) patternsIn(rel string) []gitignore.Pattern {
	if ps, ok := ig.patterns[rel]; ok {
		return ps
	}
	var inherited []gitignore.Pattern
	if rel != "" {
		parent := ""
		if i := strings.LastIndexByte(rel, '/'); i >= 0 {
			parent = rel[:i]
		}
		inherited = ig.patternsIn(parent)
	}
	if !ig.opened {
		ig.opened = true
		if real, err := resolve(ig.root); err == nil {
			ig.tree, _ = openTreeRoot(real, nil, "")
		}
	}
	var own []gitignore.Pattern
	if ig.tree != nil {
		real := filepath.Join(ig.tree.path, filepath.FromSlash(rel))
		own, _ = dirPatterns(ig.tree, rel, rel, func(name string) (fs.FileMode, bool) {
			info, err := os.Lstat(filepath.Join(real, name))
			if err != nil {
				return 0, false
			}
			return info.Mode(), true
		})
	}
	ps := append(slices.Clone(inherited), own...)
	ig.patterns[rel] = ps
	return ps
}

// Rules reports whether a file at rel shapes what a load ignores: an
// ignore file, or the root's settings file (its include and exclude
// patterns). After such a file changes, make a new Ignorer.
func (ig *Ignorer) Rules(rel string) bool {
	return rel == SettingsFile || slices.Contains(ignoreFiles, rel[strings.LastIndexByte(rel, '/')+1:])
}
