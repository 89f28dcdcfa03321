package codex

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestIgnorerAgreesWithTheWalk: what the Ignorer says a load leaves out
// is what a load leaves out, file by file; a directory it leaves out holds
// nothing that loads; ignore files are never left out of a watch.
func TestIgnorerAgreesWithTheWalk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, ".gitignore", "*.log\nbuild/\n!keep.log\n/var/\n")
	write(t, dir, "a.go", "package a\n")
	write(t, dir, "debug.log", "noise")
	write(t, dir, "keep.log", "kept by negation")
	write(t, dir, "build/out.go", "package out\n")
	write(t, dir, "var/state/s.db", "state")
	write(t, dir, "sub/var/v.go", "package v\n")
	write(t, dir, "sub/.ignore", "secret*.md\n")
	write(t, dir, "sub/b.go", "package b\n")
	write(t, dir, "sub/secret-plan.md", "hidden by .ignore")
	write(t, dir, "sub/deeper/.gitignore", "/local.txt\n")
	write(t, dir, "sub/deeper/local.txt", "ignored here only")
	write(t, dir, "sub/deeper/c.md", "# C")
	write(t, dir, "local.txt", "not ignored at the root")
	write(t, dir, "vendor/v.go", "package v\n")
	write(t, dir, ".git/HEAD", "ref: refs/heads/main")
	for _, opts := range []Options{{Exclude: []string{"vendor/"}}, {Include: []string{"*.go"}}, {Exclude: []string{"*.md"}, Include: []string{"sub/"}}} {
		c, err := Load(t.Context(), dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		var loaded []string
		for _, f := range c.Files {
			loaded = append(loaded, f.Path)
		}
		ig := NewIgnorer(dir, opts)
		err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || p == dir {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			rel = filepath.ToSlash(rel)
			if e.IsDir() {
				// Left out only if no file below it loads.
				if ig.Ignored(rel, true) && slices.ContainsFunc(loaded, func(f string) bool { return strings.HasPrefix(f, rel+"/") }) {
					t.Errorf("%+v: directory %s is ignored, but files below it load", opts, rel)
				}
				return nil
			}
			got, want := ig.Ignored(rel, false), !slices.Contains(loaded, rel)
			if ig.Rules(rel) {
				want = false // watched whatever the patterns say
			}
			if got != want {
				t.Errorf("%+v: %s: ignored %t, want %t", opts, rel, got, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ig := NewIgnorer(dir, Options{Exclude: []string{"vendor/"}})
	for _, d := range []string{".git", "build", "var", "var/state", "vendor"} {
		if !ig.Ignored(d, true) {
			t.Errorf("directory %s would be watched", d)
		}
	}
	for _, d := range []string{"sub", "sub/var", "sub/deeper"} {
		if ig.Ignored(d, true) {
			t.Errorf("directory %s would not be watched", d)
		}
	}
}
