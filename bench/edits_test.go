package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// bytesCounter counts a token a byte.
type bytesCounter struct{}

func (bytesCounter) CountText(s string) (int, error) { return len(s), nil }

// TestReplayEdits replays a small history whose costs are known: the codex
// (src/) is a small file that every commit changes and a large one that
// never does, named so that path order puts the small one first: path
// order re-evaluates everything on every commit, stability order only the
// small file. A commit that changes only files outside src/ is no commit
// of the codex.
func TestReplayEdits(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("the git binary makes this test's fixture: " + err.Error())
	}
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
			"GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_COMMITTER_DATE="+time.Unix(1_700_000_000, 0).Format(time.RFC3339))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q")
	write("src/a_hot.go", "package p // 0\n")
	write("src/z_big.go", strings.Repeat("// a large file that never changes\n", 200))
	write("other/readme.txt", "outside the codex\n")
	git("add", "-A")
	git("commit", "-q", "-m", "first")
	for i := range 6 {
		write("src/a_hot.go", "package p // "+strings.Repeat("x", i+1)+"\n")
		write("other/readme.txt", "changed outside the codex "+strings.Repeat("y", i)+"\n")
		git("commit", "-q", "-am", "hot")
		if i == 2 {
			write("other/readme.txt", "only outside\n")
			git("commit", "-q", "-am", "outside only")
		}
	}
	run, err := ReplayEdits(t.Context(), EditsConfig{Name: "t", Repo: dir, Sub: "src", Commits: 4, Counter: bytesCounter{}})
	if err != nil {
		t.Fatal(err)
	}
	// The four newest commits that touch the codex ("outside only" does
	// not).
	if len(run.Commits) != 4 {
		t.Fatalf("%d commits replayed, want 4", len(run.Commits))
	}
	if run.StartFiles != 2 {
		t.Errorf("the codex at the epoch has %d files, want 2 (a_hot.go, z_big.go)", run.StartFiles)
	}
	for i, c := range run.Commits {
		if c.Files != 1 {
			t.Errorf("commit %d: %d files changed, want 1", i, c.Files)
		}
		// From the first changed token: the edit is past a_hot.go's
		// first line, so part of that file stays cached either way.
		if c.PathTokens < c.CodexTokens-c.Floor || c.PathTokens >= c.CodexTokens {
			t.Errorf("commit %d: path order re-evaluated %d of %d tokens, want all but part of a_hot.go's %d (it comes first)", i, c.PathTokens, c.CodexTokens, c.Floor)
		}
		if c.StableTokens <= 0 || c.StableTokens >= c.Floor {
			t.Errorf("commit %d: stability order re-evaluated %d tokens, want part of a_hot.go's own %d", i, c.StableTokens, c.Floor)
		}
		// In hindsight a_hot.go, which every commit changes, is last too.
		if c.HindsightTokens != c.StableTokens {
			t.Errorf("commit %d: the hindsight order re-evaluated %d tokens, want stability order's %d", i, c.HindsightTokens, c.StableTokens)
		}
		// With cache_reuse the edited file stays last: part of itself.
		if c.ReuseTokens != c.StableTokens {
			t.Errorf("commit %d: with cache_reuse %d tokens re-evaluated, want stability order's %d (a_hot.go is last in both)", i, c.ReuseTokens, c.StableTokens)
		}
	}
	s := run.Summarize()
	if s.StableBetter != 4 || s.StableMedian >= s.PathMedian {
		t.Errorf("summary %+v", s)
	}
	if table := EditsTable([]EditsRun{run}); !strings.Contains(table, "| t | 4 | 2 files") {
		t.Errorf("table:\n%s", table)
	}
}

// TestShiftCost walks a cache and a prompt as llama-server's --cache-reuse
// does: what it finds ahead in the cache, in runs of at least the chunk,
// is shifted; where it finds nothing, the rest is evaluated.
func TestShiftCost(t *testing.T) {
	files := map[string]codexFile{"a": {tokens: 100}, "b": {tokens: 100}, "c": {tokens: 100}, "d": {tokens: 100}, "tiny": {tokens: 10}, "x": {tokens: 100}}
	for _, tc := range []struct {
		name       string
		prev, next []string
		changed    []string
		want       int
	}{
		{"nothing changed", []string{"a", "b"}, []string{"a", "b"}, nil, 0},
		{"a file removed: the rest shifted", []string{"a", "b", "c"}, []string{"a", "c"}, nil, 0},
		{"the edited file moved last", []string{"a", "b", "c", "d"}, []string{"a", "c", "d", "b"}, []string{"b"}, 100},
		{"edited in place: everything from its first change", []string{"a", "b", "c", "d"}, []string{"a", "b", "c", "d"}, []string{"b"}, 270},
		{"a run shorter than the chunk stops the walk", []string{"a", "b", "tiny", "c", "d"}, []string{"a", "tiny", "d", "b", "c"}, []string{"b", "c"}, 310},
		{"a file moved ahead of others", []string{"a", "b", "c"}, []string{"a", "c", "b"}, nil, 100},
		// d's first 31 tokens are as they were: after the common prefix
		// they are kept (less one), and the walk ends inside d.
		{"the last file edited where it is", []string{"a", "b", "d"}, []string{"a", "b", "d"}, []string{"d"}, 70},
		{"a file edited after a shifted run", []string{"a", "x", "b", "c", "d"}, []string{"a", "b", "c", "d"}, []string{"d"}, 70},
		{"too short a head after a short run", []string{"a", "x", "tiny", "d"}, []string{"a", "tiny", "d"}, []string{"d"}, 110},
	} {
		changed := map[string]bool{}
		for _, p := range tc.changed {
			changed[p] = true
		}
		head := func(string) (int, error) { return 31, nil }
		if got, err := shiftCost(tc.prev, tc.next, changed, files, 64, head); err != nil || got != tc.want {
			t.Errorf("%s: %d tokens evaluated, want %d", tc.name, got, tc.want)
		}
	}
}
