package orchestrator

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd/runcontext"
)

func TestCodexChangeNamesTheFiles(t *testing.T) {
	ref := func(p, sum string) runcontext.CodexRef {
		return runcontext.CodexRef{Path: p, SHA256: strings.Repeat(sum, 64)}
	}
	prev := []runcontext.CodexRef{ref("a.go", "a"), ref("b.go", "b"), ref("c.go", "c"), ref("gone.go", "d")}
	cur := []runcontext.CodexRef{ref("a.go", "a"), ref("c.go", "c"), ref("b.go", "e"), ref("new.go", "f")}
	got := codexChange(prev, cur)
	want := "codex files 1 changed (b.go), 1 added (new.go), 1 removed (gone.go); the first 1 of 4 files render as before"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := codexChange(prev, prev); got != "" {
		t.Errorf("the same files: %q", got)
	}
	if got := codexChange(nil, cur); got != "" {
		t.Errorf("no files before: %q", got)
	}
	moved := []runcontext.CodexRef{prev[1], prev[0], prev[2], prev[3]}
	if got := codexChange(prev, moved); got != "codex files moved; the first 0 of 4 files render as before" {
		t.Errorf("moved: %q", got)
	}
}

// TestCodexFingerprintIsTheContentNotTheOrder: the same files in another
// order (codex.order) are the same codex for karma.
func TestCodexFingerprintIsTheContentNotTheOrder(t *testing.T) {
	a := runcontext.CodexRef{Path: "a.go", SHA256: strings.Repeat("a", 64)}
	b := runcontext.CodexRef{Path: "b.go", SHA256: strings.Repeat("b", 64)}
	one := codexFingerprint(runcontext.Codex{Files: []runcontext.CodexRef{a, b}})
	two := codexFingerprint(runcontext.Codex{Files: []runcontext.CodexRef{b, a}})
	if one == "" || one != two {
		t.Errorf("fingerprints %q and %q: want the same, not empty", one, two)
	}
	b.SHA256 = strings.Repeat("c", 64)
	if codexFingerprint(runcontext.Codex{Files: []runcontext.CodexRef{a, b}}) == one {
		t.Error("a changed file kept the fingerprint")
	}
}
