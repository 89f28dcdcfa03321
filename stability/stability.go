// Package stability orders a codex's files so that an edit re-evaluates
// as little of it as it can. A backend reuses its cache up to the first
// token that changed, so an edit costs the tokens from the edited file to
// the end of the codex block; the order that costs least on average puts
// a file that seldom changes and is large early, and one that changes
// often and is small late (Smith's rule: ascending by how often a file
// changes over its size; Arrange).
//
// How often a file changes is read from the work tree's own git history
// (with go-git; no git binary): each commit on the first-parent line from
// HEAD counts for the files it changed, the newer commits weighing more (a
// half-life in commits), and a file edited in the work tree since HEAD
// (or not in it) counts one change more. Where the codex is not in a git
// work tree, or its history cannot be read, modification times stand in:
// the oldest first. Ties are broken by path, so the order is the same for
// the same history.
//
// The order is made at a codex epoch (the first load of a tree) and then
// only settled (Settle): after an edit, the files before the first one
// that changed keep their places, and the rest, which the backend
// evaluates again anyway, are arranged again with the edit counted.
package stability

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// File is one file of the codex, as the order needs it.
type File struct {
	Path    string // slash-separated, relative to the codex root
	MtimeNs int64  // its modification time
	Size    int64
}

// Options bound the history read.
type Options struct {
	// MaxCommits is how many commits of the first-parent line are read
	// (0: DefaultMaxCommits).
	MaxCommits int
	// HalfLife is the number of commits over which a change's weight
	// halves (0: DefaultHalfLife). Recent changes predict the next ones
	// best: the replay of real histories (ctxd-bench edits) chose 10.
	HalfLife float64
	// Budget bounds the time the history read takes (0: DefaultBudget);
	// what was read by then is used.
	Budget time.Duration
	// Read reads a file's raw content (as git hashes it) when its stat
	// does not prove it clean against git's index; nil: os.ReadFile
	// below the root.
	Read func(rel string) ([]byte, error)
}

// The defaults of Options' bounds.
const (
	DefaultMaxCommits = 2000
	DefaultHalfLife   = 10
	DefaultBudget     = 10 * time.Second
)

// Fact is what the history says of one file.
type Fact struct {
	Weight   float64 // changes, each weighted by its age in commits (2^(-age/half-life))
	Changes  int     // commits that changed it among those read
	LastUnix int64   // when the newest of them was committed; 0: none read
	Volatile bool    // edited in the work tree since HEAD, or not in HEAD
}

// Ranking is a codex's stability facts and where they came from.
type Ranking struct {
	Source  string // "git" or "mtime"
	Commits int    // commits read (git)
	Head    string // HEAD's commit (git)
	Note    string // why git was not used, or what bounded the read
	Facts   map[string]Fact
	mtimes  map[string]int64
}

// Rank reads the stability facts of files in the codex rooted at root: from
// git where root is inside a work tree with a readable history, else from
// the files' modification times. It fails only when ctx ends.
func Rank(ctx context.Context, root string, files []File, opts Options) (Ranking, error) {
	r := Ranking{Source: "mtime", Facts: make(map[string]Fact, len(files)), mtimes: make(map[string]int64, len(files))}
	for _, f := range files {
		r.mtimes[f.Path] = f.MtimeNs
	}
	g, err := fromGit(ctx, root, files, opts)
	if err != nil {
		if ctx.Err() != nil {
			return Ranking{}, ctx.Err()
		}
		r.Note = err.Error()
		return r, nil
	}
	g.mtimes = r.mtimes
	return g, nil
}

// Order is paths sorted for the least expected re-evaluation: by git,
// Smith's rule (Arrange) on the history's weights, the files edited since
// HEAD counted as one change more; by modification times, the oldest
// first. Ties by path.
func (r Ranking) Order(paths []string, sizes map[string]int64) []string {
	out := slices.Clone(paths)
	if r.Source == "git" {
		Arrange(out, sizes, r.Weights())
		return out
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := cmpInt(r.mtimes[a], r.mtimes[b]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return out
}

// Weights are the ranking's weights: each file's changes, the newer
// weighing more, and a change more for a file edited since HEAD.
func (r Ranking) Weights() Weights {
	w := make(Weights, len(r.Facts))
	for p, f := range r.Facts {
		w[p] = f.Weight
		if f.Volatile {
			w[p]++
		}
	}
	return w
}

// Weights is how often each file changed, each change weighing half as
// much HalfLife changes of the codex later (commits in the history, then
// the daemon's reloads). A file not in it never changed.
type Weights map[string]float64

// Prior is the weight of a file never seen to change: it may still.
const Prior = 0.05

// Step records one change of the codex: every weight decays by one step
// of halfLife, and each changed file's grows by one.
func (w Weights) Step(changed map[string]bool, halfLife float64) {
	if halfLife <= 0 {
		halfLife = DefaultHalfLife
	}
	d := math.Exp2(-1 / halfLife)
	for p := range w {
		w[p] *= d
	}
	for p := range changed {
		w[p]++
	}
}

// Arrange sorts paths in place by Smith's rule for the least expected
// re-evaluation: a change to the file at place i re-evaluates it and every
// file after it, so a file that changes often and is small belongs late,
// one that seldom changes and is large early: ascending by (weight+Prior)
// over size, ties by path.
func Arrange(paths []string, sizes map[string]int64, w Weights) {
	slices.SortFunc(paths, func(a, b string) int {
		// (wa+P)/(sa+1) < (wb+P)/(sb+1), cross-multiplied.
		x := (w[a] + Prior) * float64(sizes[b]+1)
		y := (w[b] + Prior) * float64(sizes[a]+1)
		if d := x - y; math.Abs(d) > 1e-9*math.Max(math.Abs(x), math.Abs(y)) {
			if d < 0 {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Describe is the ranking in a line, for stats and logs.
func (r Ranking) Describe() string {
	if r.Source == "git" {
		s := fmt.Sprintf("git history: %d commits from %s", r.Commits, shortHash(r.Head))
		if r.Note != "" {
			s += " (" + r.Note + ")"
		}
		return s
	}
	if r.Note != "" {
		return "modification times (" + r.Note + ")"
	}
	return "modification times"
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// errNoGit is why a codex outside any work tree is ranked by mtimes.
var errNoGit = errors.New("not in a git work tree")

// fromGit reads the facts from the history of the work tree holding root.
func fromGit(ctx context.Context, root string, files []File, opts Options) (Ranking, error) {
	repo, err := git.PlainOpenWithOptions(root, &git.PlainOpenOptions{DetectDotGit: true})
	if errors.Is(err, git.ErrRepositoryNotExists) {
		return Ranking{}, errNoGit
	}
	if err != nil {
		return Ranking{}, fmt.Errorf("git: %w", err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return Ranking{}, fmt.Errorf("git: %w", err)
	}
	top := wt.Filesystem.Root()
	prefix, err := relPrefix(top, root)
	if err != nil {
		return Ranking{}, err
	}
	head, err := repo.Head()
	if err != nil {
		return Ranking{}, fmt.Errorf("git: no HEAD commit: %w", err)
	}
	commit, err := repo.CommitObject(head.Hash())
	if err != nil {
		return Ranking{}, fmt.Errorf("git: HEAD: %w", err)
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = f.Path
	}
	r, err := History(ctx, commit, prefix, paths, opts)
	if err != nil {
		return Ranking{}, err
	}
	headTree, err := commit.Tree()
	if err != nil {
		return Ranking{}, fmt.Errorf("git: HEAD's tree: %w", err)
	}
	markVolatile(repo, headTree, prefix, root, files, opts, r.Facts)
	return r, nil
}

// relPrefix is root's path below the work tree's top, slash-separated with
// a trailing slash ("" at the top).
func relPrefix(top, root string) (string, error) {
	rt, err := filepath.EvalSymlinks(top)
	if err != nil {
		return "", fmt.Errorf("git: %w", err)
	}
	rr, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", fmt.Errorf("git: %w", err)
	}
	if info, err := os.Stat(rr); err == nil && !info.IsDir() {
		rr = filepath.Dir(rr)
	}
	rel, err := filepath.Rel(rt, rr)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("git: the codex %s is not below the work tree %s", root, top)
	}
	if rel == "." {
		return "", nil
	}
	return filepath.ToSlash(rel) + "/", nil
}

// markVolatile marks the files not in HEAD or differing from it in the
// work tree, as git status would: a file whose size and modification time
// match git's index entry has the entry's hash; another is hashed.
func markVolatile(repo *git.Repository, head *object.Tree, prefix, root string, files []File, opts Options, facts map[string]Fact) {
	idx, err := repo.Storer.Index()
	entries := map[string]int{}
	if err == nil {
		for i, e := range idx.Entries {
			entries[e.Name] = i
		}
	}
	read := opts.Read
	if read == nil {
		dir := root
		if info, err := os.Stat(root); err == nil && !info.IsDir() {
			dir = filepath.Dir(root)
		}
		read = func(rel string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel))) }
	}
	for _, f := range files {
		name := prefix + f.Path
		he, err := head.FindEntry(name)
		if err != nil {
			fact := facts[f.Path]
			fact.Volatile = true // not in HEAD: new in the work tree
			facts[f.Path] = fact
			continue
		}
		sum := plumbing.ZeroHash
		if i, ok := entries[name]; ok {
			e := idx.Entries[i]
			if int64(e.Size) == f.Size && e.ModifiedAt.UnixNano() == f.MtimeNs {
				sum = e.Hash
			}
		}
		if sum == plumbing.ZeroHash {
			data, err := read(f.Path)
			if err != nil {
				continue // unreadable now: the load reports it; the order need not
			}
			sum = blobHash(data)
		}
		if sum != he.Hash {
			fact := facts[f.Path]
			fact.Volatile = true
			facts[f.Path] = fact
		}
	}
}

// blobHash is git's object id of a blob with data.
func blobHash(data []byte) plumbing.Hash {
	h := sha1.New()
	io.WriteString(h, "blob "+strconv.Itoa(len(data))+"\x00")
	h.Write(data)
	var out plumbing.Hash
	copy(out[:], h.Sum(nil))
	return out
}

// Settle is the order after a reload: prev is the order before it (the
// files in the order the backend's cache holds them), paths the files now,
// changed those whose content changed or that are new, sizes their sizes
// and w their weights (the reload's Step already taken). The backend
// re-evaluates from the first changed or removed file on anyway, so the
// files before it keep their places and every file after it may move at
// no cost: they are arranged again (Arrange), which puts what just
// changed late. It returns the order and the index of its first file not
// where it was (len(paths) if none).
func Settle(prev, paths []string, changed map[string]bool, sizes map[string]int64, w Weights) (order []string, from int) {
	now := make(map[string]bool, len(paths))
	for _, p := range paths {
		now[p] = true
	}
	from = len(prev)
	for i, p := range prev {
		if !now[p] || changed[p] {
			from = i
			break
		}
	}
	order = make([]string, 0, len(paths))
	kept := make(map[string]bool, from)
	for _, p := range prev[:from] {
		order = append(order, p)
		kept[p] = true
	}
	var rest []string
	for _, p := range paths {
		if !kept[p] {
			rest = append(rest, p)
		}
	}
	Arrange(rest, sizes, w)
	// The files after from that need not move keep their places: only
	// from the first file that does is anything evaluated again.
	order = append(order, rest...)
	for from < len(order) && from < len(prev) && order[from] == prev[from] && !changed[order[from]] {
		from++
	}
	return order, from
}

// Last is the order after a reload for a backend that shifts cached
// chunks past a change (llama-server's --cache-reuse): the files of prev
// that are still there unchanged keep their order, and the files that
// changed or are new follow them, arranged among themselves (Arrange).
// Such a backend keeps the unchanged files after the first change by
// shifting them, and evaluates only the files moved to the end; Settle's
// order, which arranges everything after the first change again, would
// give it nothing to shift. It returns the order and the index of its
// first file not where it was (len(paths) if none), as Settle does.
func Last(prev, paths []string, changed map[string]bool, sizes map[string]int64, w Weights) (order []string, from int) {
	now := make(map[string]bool, len(paths))
	for _, p := range paths {
		now[p] = true
	}
	order = make([]string, 0, len(paths))
	stays := make(map[string]bool, len(prev))
	for _, p := range prev {
		if now[p] && !changed[p] && !stays[p] {
			order = append(order, p)
			stays[p] = true
		}
	}
	var rest []string
	for _, p := range paths {
		if !stays[p] {
			rest = append(rest, p)
		}
	}
	Arrange(rest, sizes, w)
	order = append(order, rest...)
	return order, From(prev, order, changed)
}

// From is the index of the first file of order that is not rendered as in
// prev (moved, or changed: changed[p]), len(order) if none: where a
// backend's cached prefix of prev ends for order.
func From(prev, order []string, changed map[string]bool) int {
	for i, p := range order {
		if i >= len(prev) || prev[i] != p || changed[p] {
			return i
		}
	}
	return len(order)
}

// History reads the facts of paths (relative to the codex root, which is
// prefix below the repository's top) from the first-parent line of
// commits ending at from, newest first, within opts' bounds. The files'
// work-tree state is not looked at (no file is volatile).
func History(ctx context.Context, from *object.Commit, prefix string, paths []string, opts Options) (Ranking, error) {
	if opts.MaxCommits <= 0 {
		opts.MaxCommits = DefaultMaxCommits
	}
	if opts.HalfLife <= 0 {
		opts.HalfLife = DefaultHalfLife
	}
	if opts.Budget <= 0 {
		opts.Budget = DefaultBudget
	}
	commit := from
	r := Ranking{Source: "git", Head: from.Hash.String(), Facts: make(map[string]Fact, len(paths))}
	want := make(map[string]bool, len(paths))
	for _, p := range paths {
		want[prefix+p] = true
	}
	deadline := time.Now().Add(opts.Budget)
	tree, err := commit.Tree()
	if err != nil {
		return Ranking{}, fmt.Errorf("git: tree of %s: %w", commit.Hash, err)
	}
	for age := 0; age < opts.MaxCommits; age++ {
		if err := ctx.Err(); err != nil {
			return Ranking{}, err
		}
		if time.Now().After(deadline) {
			r.Note = fmt.Sprintf("read for %v, the budget", opts.Budget)
			break
		}
		var parentTree *object.Tree
		parent, err := commit.Parent(0)
		switch {
		case errors.Is(err, object.ErrParentNotFound): // the first commit: its files were all added
		case err != nil:
			// A shallow clone ends here: the parent is not in the store,
			// and the commit's diff against nothing is not its change.
			r.Note = "the history ends at a shallow or incomplete clone"
		default:
			if parentTree, err = parent.Tree(); err != nil {
				return Ranking{}, fmt.Errorf("git: tree of %s: %w", parent.Hash, err)
			}
		}
		if parent == nil && !errors.Is(err, object.ErrParentNotFound) {
			break
		}
		// One diff is bounded by the budget too: a commit of a huge tree
		// must not hold the load.
		dctx, cancel := context.WithDeadline(ctx, deadline)
		changes, err := object.DiffTreeWithOptions(dctx, parentTree, tree, nil)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return Ranking{}, ctx.Err()
			}
			if dctx.Err() != nil {
				r.Note = fmt.Sprintf("read for %v, the budget", opts.Budget)
				break
			}
			return Ranking{}, fmt.Errorf("git: diff of %s: %w", commit.Hash, err)
		}
		w := math.Exp2(-float64(age) / opts.HalfLife)
		when := commit.Committer.When.Unix()
		for _, ch := range changes {
			for _, name := range []string{ch.From.Name, ch.To.Name} {
				if name == "" || !want[name] {
					continue
				}
				rel := strings.TrimPrefix(name, prefix)
				f := r.Facts[rel]
				f.Weight += w
				f.Changes++
				f.LastUnix = max(f.LastUnix, when)
				r.Facts[rel] = f
				if ch.From.Name == ch.To.Name {
					break // one change of one path
				}
			}
		}
		r.Commits = age + 1
		if parentTree == nil {
			break // the first commit
		}
		commit, tree = parent, parentTree
	}
	return r, nil
}
