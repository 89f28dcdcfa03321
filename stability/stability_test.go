package stability

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// gitRepo makes a work tree at dir with commits made by the git binary
// (the fixture only: ctxd reads the history with go-git).
type gitRepo struct {
	t   *testing.T
	dir string
	n   int
}

func newRepo(t *testing.T) *gitRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("the git binary makes this test's fixtures: " + err.Error())
	}
	r := &gitRepo{t: t, dir: t.TempDir()}
	r.git("init", "-q", "-b", "main")
	return r
}

func (r *gitRepo) git(args ...string) {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-C", r.dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func (r *gitRepo) write(rel, text string) {
	r.t.Helper()
	p := filepath.Join(r.dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// commit writes files and commits them, a minute after the last commit.
func (r *gitRepo) commit(files ...string) {
	r.t.Helper()
	r.n++
	for _, f := range files {
		r.write(f, pad(f+" version "+time.Duration(r.n).String()))
	}
	r.git("add", "-A")
	when := time.Unix(1_700_000_000+int64(r.n)*60, 0).UTC().Format(time.RFC3339)
	cmd := exec.Command("git", "-C", r.dir, "commit", "-q", "-m", "c")
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_AUTHOR_DATE="+when, "GIT_COMMITTER_DATE="+when, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git commit: %v\n%s", err, out)
	}
}

// pad makes every fixture file the same size, so only the history orders
// them.
func pad(s string) string { return fmt.Sprintf("%-60s\n", s) }

// sizes are the files' sizes.
func sizes(fs []File) map[string]int64 {
	m := map[string]int64{}
	for _, f := range fs {
		m[f.Path] = f.Size
	}
	return m
}

// files lists the regular files below root (not .git), as a load would.
func files(t *testing.T, root string) ([]File, []string) {
	t.Helper()
	var fs []File
	var paths []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fs = append(fs, File{Path: filepath.ToSlash(rel), MtimeNs: info.ModTime().UnixNano(), Size: info.Size()})
		paths = append(paths, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs, paths
}

func TestGitHistoryOrdersTheStableFirst(t *testing.T) {
	r := newRepo(t)
	r.commit("z/stable.go", "hot.go", "warm.go", "edited.go", "a_once.go")
	r.commit("hot.go", "warm.go")
	r.commit("hot.go")
	r.commit("hot.go")
	// In the work tree: an edit since HEAD and a file git does not know.
	r.write("edited.go", pad("changed now"))
	r.write("new.go", pad("untracked"))
	fs, paths := files(t, r.dir)
	rk, err := Rank(context.Background(), r.dir, fs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rk.Source != "git" || rk.Commits != 4 {
		t.Fatalf("ranking from %s over %d commits (%s); want git over 4", rk.Source, rk.Commits, rk.Note)
	}
	got := rk.Order(paths, sizes(fs))
	// a_once.go and z/stable.go changed once, in the same commit: by path.
	// new.go is one change (made now); warm.go changed twice, edited.go
	// once and again now (the edit counts as a change), hot.go four times.
	want := []string{"a_once.go", "z/stable.go", "new.go", "warm.go", "edited.go", "hot.go"}
	if !slices.Equal(got, want) {
		t.Errorf("order %v; want %v", got, want)
	}
	if f := rk.Facts["hot.go"]; f.Changes != 4 || f.Volatile {
		t.Errorf("hot.go: %+v; want 4 changes, not volatile", f)
	}
	if !rk.Facts["edited.go"].Volatile || !rk.Facts["new.go"].Volatile {
		t.Errorf("edited.go %+v, new.go %+v: want both volatile", rk.Facts["edited.go"], rk.Facts["new.go"])
	}
	// The same history gives the same order.
	again, err := Rank(context.Background(), r.dir, fs, Options{})
	if err != nil || !slices.Equal(again.Order(paths, sizes(fs)), got) {
		t.Errorf("a second ranking gave %v (%v); want %v", again.Order(paths, sizes(fs)), err, got)
	}
	if d := rk.Describe(); !strings.Contains(d, "git history: 4 commits") {
		t.Errorf("describe: %q", d)
	}
}

func TestNewerChangesWeighMore(t *testing.T) {
	r := newRepo(t)
	r.commit("old.go", "recent.go")
	for range 5 {
		r.commit("old.go") // five changes, long ago
	}
	for range 30 {
		r.commit("other.go")
	}
	r.commit("recent.go")
	r.commit("recent.go")
	fs, paths := files(t, r.dir)
	// With a half-life of 4 commits, old.go's five changes 31–35 commits
	// ago weigh less than recent.go's two in the last two commits.
	rk, err := Rank(context.Background(), r.dir, fs, Options{HalfLife: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := rk.Order(paths, sizes(fs))
	if slices.Index(got, "old.go") > slices.Index(got, "recent.go") {
		t.Errorf("order %v: old.go's old changes outweigh recent.go's new ones", got)
	}
	// MaxCommits bounds the read.
	rk, err = Rank(context.Background(), r.dir, fs, Options{MaxCommits: 3})
	if err != nil || rk.Commits != 3 || rk.Facts["old.go"].Changes != 0 {
		t.Errorf("read %d commits (%v), old.go %+v; want 3 and no change of old.go", rk.Commits, err, rk.Facts["old.go"])
	}
}

func TestCodexBelowTheWorkTree(t *testing.T) {
	r := newRepo(t)
	r.commit("sub/a.go", "sub/b.go", "top.go")
	r.commit("sub/a.go", "top.go")
	fs, paths := files(t, filepath.Join(r.dir, "sub"))
	rk, err := Rank(context.Background(), filepath.Join(r.dir, "sub"), fs, Options{})
	if err != nil || rk.Source != "git" {
		t.Fatalf("ranking %+v, %v; want git", rk, err)
	}
	if got := rk.Order(paths, sizes(fs)); !slices.Equal(got, []string{"b.go", "a.go"}) {
		t.Errorf("order %v; want [b.go a.go]", got)
	}
	if rk.Facts["a.go"].Changes != 2 {
		t.Errorf("a.go: %+v; want 2 changes (paths relative to the codex root)", rk.Facts["a.go"])
	}
}

func TestShallowCloneUsesWhatItHas(t *testing.T) {
	r := newRepo(t)
	for i := range 6 {
		if i%2 == 0 {
			r.commit("a.go", "b.go")
		} else {
			r.commit("a.go")
		}
	}
	clone := filepath.Join(t.TempDir(), "c")
	cmd := exec.Command("git", "clone", "-q", "--depth", "3", "file://"+r.dir, clone)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	fs, paths := files(t, clone)
	rk, err := Rank(context.Background(), clone, fs, Options{})
	if err != nil || rk.Source != "git" {
		t.Fatalf("ranking %+v, %v; want git", rk, err)
	}
	if rk.Commits != 2 || !strings.Contains(rk.Note, "shallow") {
		t.Errorf("read %d commits, note %q; want the 2 whose parents are present, and the shallow end named", rk.Commits, rk.Note)
	}
	if got := rk.Order(paths, sizes(fs)); !slices.Equal(got, []string{"b.go", "a.go"}) {
		t.Errorf("order %v; want [b.go a.go]", got)
	}
}

func TestWithoutGitModificationTimesOrder(t *testing.T) {
	dir := t.TempDir()
	base := time.Unix(1_700_000_000, 0)
	for i, name := range []string{"new.go", "old.go", "b_same.go", "a_same.go"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		at := base.Add(time.Duration(3-min(i, 2)) * time.Hour) // new.go newest; the _same files tie
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	fs, paths := files(t, dir)
	rk, err := Rank(context.Background(), dir, fs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rk.Source != "mtime" || !strings.Contains(rk.Describe(), "not in a git work tree") {
		t.Errorf("source %s, %q; want modification times, saying why", rk.Source, rk.Describe())
	}
	if got := rk.Order(paths, sizes(fs)); !slices.Equal(got, []string{"a_same.go", "b_same.go", "old.go", "new.go"}) {
		t.Errorf("order %v; want the oldest first, ties by path", got)
	}
}

func TestRankStopsWithItsContext(t *testing.T) {
	r := newRepo(t)
	r.commit("a.go")
	fs, _ := files(t, r.dir)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Rank(ctx, r.dir, fs, Options{}); err == nil {
		t.Error("a ranking with its context ended succeeded")
	}
}

func TestArrangeBySmithsRule(t *testing.T) {
	// A change re-evaluates the file and all after it: large files that
	// seldom change first, small ones that often change last; a large
	// file that changes often goes before a small one that seldom does
	// (its own size is paid at each of its changes wherever it is).
	paths := []string{"big_hot", "big_cold", "small_hot", "small_cold"}
	sz := map[string]int64{"big_hot": 10000, "big_cold": 10000, "small_hot": 100, "small_cold": 100}
	w := Weights{"big_hot": 3, "small_hot": 3}
	Arrange(paths, sz, w)
	if want := []string{"big_cold", "big_hot", "small_cold", "small_hot"}; !slices.Equal(paths, want) {
		t.Errorf("arranged %v; want %v", paths, want)
	}
	// Step decays every weight and adds one to each changed file.
	w.Step(map[string]bool{"small_cold": true}, 1)
	if w["big_hot"] != 1.5 || w["small_cold"] != 1 {
		t.Errorf("after a step: %v", w)
	}
}

func TestSettle(t *testing.T) {
	same := func(ps ...string) map[string]int64 {
		m := map[string]int64{}
		for _, p := range ps {
			m[p] = 100
		}
		return m
	}
	prev := []string{"s1", "s2", "e1", "s3", "e2", "s4", "gone"}
	now := []string{"s1", "s2", "e1", "s3", "e2", "s4", "b_new", "a_new"}
	changed := map[string]bool{"e1": true, "e2": true, "a_new": true, "b_new": true}
	w := Weights{}
	w.Step(changed, 0)
	order, from := Settle(prev, now, changed, same(now...), w)
	want := []string{"s1", "s2", "s3", "s4", "a_new", "b_new", "e1", "e2"}
	if !slices.Equal(order, want) || from != 2 {
		t.Errorf("settled %v from %d; want %v from 2", order, from, want)
	}
	// Only a removal: the files after it keep their order.
	order, from = Settle([]string{"a", "b", "c"}, []string{"a", "c"}, nil, same("a", "c"), Weights{})
	if !slices.Equal(order, []string{"a", "c"}) || from != 1 {
		t.Errorf("settled %v from %d; want [a c] from 1", order, from)
	}
	// Nothing changed: the same order, nothing to evaluate again.
	order, from = Settle([]string{"a", "b"}, []string{"b", "a"}, nil, same("a", "b"), Weights{"a": 5})
	if !slices.Equal(order, []string{"a", "b"}) || from != 2 {
		t.Errorf("settled %v from %d; want [a b] from 2", order, from)
	}
	// Only an addition: appended; the first new place is the cache's end.
	order, from = Settle([]string{"a", "b"}, []string{"a", "b", "c"}, map[string]bool{"c": true}, same("a", "b", "c"), Weights{"c": 1})
	if !slices.Equal(order, []string{"a", "b", "c"}) || from != 2 {
		t.Errorf("settled %v from %d; want [a b c] from 2", order, from)
	}
	// Editing the file that was just moved last costs only itself.
	w.Step(map[string]bool{"e2": true}, 0)
	order, from = Settle(want, now, map[string]bool{"e2": true}, same(now...), w)
	if !slices.Equal(order, want) || from != len(want)-1 {
		t.Errorf("settled %v from %d; want %v from %d", order, from, want, len(want)-1)
	}
}

// TestLast: the unchanged files keep their order, the removed ones leave
// no gap, and what changed or is new follows them, so a backend that
// shifts cached chunks evaluates only those.
func TestLast(t *testing.T) {
	same := func(ps ...string) map[string]int64 {
		m := map[string]int64{}
		for _, p := range ps {
			m[p] = 100
		}
		return m
	}
	prev := []string{"s1", "s2", "e1", "s3", "gone", "e2", "s4"}
	now := []string{"s1", "s2", "e1", "s3", "e2", "s4", "b_new", "a_new"}
	changed := map[string]bool{"e1": true, "e2": true, "a_new": true, "b_new": true}
	w := Weights{}
	w.Step(changed, 0)
	order, from := Last(prev, now, changed, same(now...), w)
	want := []string{"s1", "s2", "s3", "s4", "a_new", "b_new", "e1", "e2"}
	if !slices.Equal(order, want) || from != 2 {
		t.Errorf("last %v from %d; want %v from 2", order, from, want)
	}
	// Unchanged files are never rearranged, whatever their weights say
	// (Settle would put b first here).
	order, from = Last([]string{"a", "x", "b", "c"}, []string{"a", "x", "b", "c"}, map[string]bool{"x": true}, same("a", "x", "b", "c"), Weights{"b": 0, "c": 9})
	if !slices.Equal(order, []string{"a", "b", "c", "x"}) || from != 1 {
		t.Errorf("last %v from %d; want [a b c x] from 1", order, from)
	}
	// Nothing changed: the order before, whole.
	order, from = Last([]string{"b", "a"}, []string{"a", "b"}, nil, same("a", "b"), Weights{"a": 5})
	if !slices.Equal(order, []string{"b", "a"}) || from != 2 {
		t.Errorf("last %v from %d; want [b a] from 2", order, from)
	}
}
