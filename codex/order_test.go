package codex

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// gitCommit commits everything in dir with the git binary (the fixture
// only: the codex reads the history with go-git).
func gitCommit(t *testing.T, dir string, n int) {
	t.Helper()
	when := time.Unix(1_700_000_000+int64(n)*60, 0).UTC().Format(time.RFC3339)
	env := append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_AUTHOR_DATE="+when, "GIT_COMMITTER_DATE="+when, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	for _, args := range [][]string{{"add", "-A"}, {"commit", "-q", "-m", "c"}} {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}

// hotAndWarm is a git work tree of four files: a_hot.go changed by the
// three commits after the first, d_warm.go by one of them, b.go and c.go
// by none; its stability order is b.go, c.go, d_warm.go, a_hot.go.
func hotAndWarm(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", dir).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	for _, f := range []string{"a_hot.go", "b.go", "c.go", "d_warm.go"} {
		write(t, dir, f, "package p // "+f+"\n")
	}
	gitCommit(t, dir, 1)
	for i := range 3 {
		write(t, dir, "a_hot.go", "package p // hot "+string(rune('0'+i))+"\n")
		if i == 0 {
			write(t, dir, "d_warm.go", "package p // warm again\n")
		}
		gitCommit(t, dir, 2+i)
	}
	return dir
}

// TestStabilityOrderIsKeptAcrossReloads: a git work tree loads with the
// files its history changed least first; a reload keeps the order before
// the first changed file and arranges the rest again, the change counted;
// a restart (a load with the same cache and no codex before it) keeps the
// order too.
func TestStabilityOrderIsKeptAcrossReloads(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("the git binary makes this test's fixture: " + err.Error())
	}
	dir := hotAndWarm(t)
	cache, err := OpenCache(filepath.Join(t.TempDir(), "cache.bin"), "tok")
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultOptions()
	opts.Order, opts.Cache = ctxd.OrderStability, cache
	c, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c); got != "b.go,c.go,d_warm.go,a_hot.go" {
		t.Fatalf("order %s; want b.go,c.go,d_warm.go,a_hot.go", got)
	}
	if o := c.Order; o.Kind != ctxd.OrderStability || o.Kept || o.From != -1 || !strings.Contains(o.Source, "git history: 4 commits") {
		t.Errorf("order report %+v", o)
	}
	// An edit of c.go: b.go stays first; the files after it are arranged
	// again, c.go (one change before, one now) before a_hot.go (four).
	write(t, dir, "c.go", "package p // edited\n")
	opts.Previous = c
	c2, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c2); got != "b.go,d_warm.go,c.go,a_hot.go" {
		t.Errorf("after editing c.go: %s; want b.go,d_warm.go,c.go,a_hot.go", got)
	}
	if o := c2.Order; !o.Kept || o.From != 1 || !slices.Equal(o.Changed, []string{"c.go"}) || o.Source != c.Order.Source {
		t.Errorf("order report after the edit %+v", o)
	}
	// The map (RAG's block before the working set) lists the files in
	// path order: the edit moved c.go in the codex but not in the map.
	if c2.Map(0) != c.Map(0) {
		t.Errorf("an edit changed the map:\n%s\nbefore:\n%s", c2.Map(0), c.Map(0))
	}
	// A file added and one removed.
	write(t, dir, "e_new.go", "package p // new\n")
	if err := os.Remove(filepath.Join(dir, "d_warm.go")); err != nil {
		t.Fatal(err)
	}
	opts.Previous = c2
	c3, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c3); got != "b.go,e_new.go,c.go,a_hot.go" {
		t.Errorf("after adding and removing: %s; want b.go,e_new.go,c.go,a_hot.go", got)
	}
	if o := c3.Order; o.From != 1 || !slices.Equal(o.Changed, []string{"e_new.go"}) || !slices.Equal(o.Removed, []string{"d_warm.go"}) {
		t.Errorf("order report after adding and removing %+v", o)
	}
	if err := cache.Save(); err != nil {
		t.Fatal(err)
	}
	// A restart: the cache file holds the order; nothing changed.
	cache2, err := OpenCache(cache.path, "tok")
	if err != nil {
		t.Fatal(err)
	}
	opts.Previous, opts.Cache = nil, cache2
	c4, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c4); got != paths(c3) || !c4.Order.Kept || c4.Order.From != 4 || len(c4.Order.Changed) != 0 {
		t.Errorf("after a restart: %s, %+v; want %s kept, nothing moved", got, c4.Order, paths(c3))
	}
	// Path order asked for: path order, whatever the history.
	opts.Order = ctxd.OrderPath
	c5, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c5); got != "a_hot.go,b.go,c.go,e_new.go" || c5.Order.Kind != ctxd.OrderPath {
		t.Errorf("path order: %s, %+v", got, c5.Order)
	}
}

// TestStabilityOrderWithoutGit: outside a work tree the oldest files come
// first, ties by path.
// TestEditsLast: with EditsLast an edit moves only the edited file, to
// the end; the files after it keep their order (where Settle would put
// c.go before a_hot.go, which changed more often), so a backend that
// shifts cached chunks reuses them.
func TestEditsLast(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("the git binary makes this test's fixture: " + err.Error())
	}
	dir := hotAndWarm(t)
	opts := DefaultOptions()
	opts.Order, opts.EditsLast = ctxd.OrderStability, true
	c, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c); got != "b.go,c.go,d_warm.go,a_hot.go" {
		t.Fatalf("order %s; want b.go,c.go,d_warm.go,a_hot.go", got)
	}
	write(t, dir, "c.go", "package p // edited\n")
	write(t, dir, "e_new.go", "package p // new\n")
	opts.Previous = c
	c2, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c2); got != "b.go,d_warm.go,a_hot.go,c.go,e_new.go" && got != "b.go,d_warm.go,a_hot.go,e_new.go,c.go" {
		t.Errorf("after editing c.go and adding e_new.go: %s; want b.go,d_warm.go,a_hot.go, then c.go and e_new.go", got)
	}
	if o := c2.Order; !o.Kept || !o.EditsLast || o.From != 1 || len(o.Changed) != 2 {
		t.Errorf("order report after the edit %+v", o)
	}
	// Nothing changed: the order stays, and says nothing moved.
	opts.Previous = c2
	c3, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if paths(c3) != paths(c2) || c3.Order.EditsLast || c3.Order.From != 5 {
		t.Errorf("an unchanged reload: %s, report %+v", paths(c3), c3.Order)
	}
}

func TestStabilityOrderWithoutGit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := time.Unix(1_700_000_000, 0)
	for i, f := range []string{"new.go", "old.go", "mid.go"} {
		write(t, dir, f, "package p\n")
		at := base.Add(time.Duration([]int{3, 1, 2}[i]) * time.Hour)
		if err := os.Chtimes(filepath.Join(dir, f), at, at); err != nil {
			t.Fatal(err)
		}
	}
	opts := DefaultOptions()
	opts.Order = ctxd.OrderStability
	c, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c); got != "old.go,mid.go,new.go" || !strings.Contains(c.Order.Source, "modification times") {
		t.Errorf("order %s from %q; want old.go,mid.go,new.go from modification times", got, c.Order.Source)
	}
}

// TestAVersionSeenBeforeKeepsItsOrder: switching to another version of the
// tree and back (a branch switch, an edit undone) renders the first
// version in the order it had, so its stable prefix, and a slot saved for
// it, serve again.
func TestAVersionSeenBeforeKeepsItsOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := time.Unix(1_700_000_000, 0)
	for i, f := range []string{"a.go", "b.go", "c.go", "d.go"} {
		write(t, dir, f, "package p // "+f+"\n")
		at := base.Add(time.Duration(i) * time.Hour)
		if err := os.Chtimes(filepath.Join(dir, f), at, at); err != nil {
			t.Fatal(err)
		}
	}
	opts := DefaultOptions()
	opts.Order = ctxd.OrderStability
	v1, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The other branch: a.go and c.go differ.
	write(t, dir, "a.go", "package p // other branch\n")
	write(t, dir, "c.go", "package p // other branch too\n")
	opts.Previous = v1
	v2, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if paths(v2) == paths(v1) || v2.Order.Revisited {
		t.Fatalf("the other branch: %s (%+v); want the changed files moved", paths(v2), v2.Order)
	}
	// Back to the first branch: its order, not a settled one.
	write(t, dir, "a.go", "package p // a.go\n")
	write(t, dir, "c.go", "package p // c.go\n")
	opts.Previous = v2
	v3, err := Load(t.Context(), dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	if paths(v3) != paths(v1) || !v3.Order.Revisited {
		t.Errorf("back on the first branch: %s (%+v); want %s, revisited", paths(v3), v3.Order, paths(v1))
	}
	if v1.Body() != v3.Body() {
		t.Error("the first version renders differently when it comes back")
	}
}
