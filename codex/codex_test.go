package codex

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func paths(c *Codex) string {
	var ps []string
	for _, f := range c.Files {
		ps = append(ps, f.Path)
	}
	return strings.Join(ps, ",")
}

func reasons(c *Codex) map[string]string {
	m := map[string]string{}
	for _, s := range c.Skipped {
		m[s.Path] = s.Reason
	}
	return m
}

func TestLoadHonoursIgnoreFilesAtEveryLevel(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, ".gitignore", "*.log\nbuild/\n!keep.log\n")
	write(t, dir, "a.go", "package a\n")
	write(t, dir, "debug.log", "noise")
	write(t, dir, "keep.log", "kept by negation")
	write(t, dir, "build/out.go", "package out\n")
	write(t, dir, "sub/.ignore", "secret*.md\n")
	write(t, dir, "sub/b.go", "package b\n")
	write(t, dir, "sub/secret-plan.md", "hidden by .ignore")
	write(t, dir, "sub/deeper/.gitignore", "/local.txt\n")
	write(t, dir, "sub/deeper/local.txt", "ignored here only")
	write(t, dir, "sub/deeper/c.md", "# C")
	write(t, dir, "local.txt", "not ignored at the root")
	write(t, dir, "vendor/v.go", "package v\n")
	write(t, dir, ".git/HEAD", "ref: refs/heads/main")
	write(t, dir, SettingsFile, "[limits]\n")
	c, err := Load(t.Context(), dir, Options{Exclude: []string{"vendor/"}})
	if err != nil {
		t.Fatal(err)
	}
	want := ".gitignore,a.go,keep.log,local.txt,sub/.ignore,sub/b.go,sub/deeper/.gitignore,sub/deeper/c.md"
	if got := paths(c); got != want {
		t.Errorf("files\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(reasons(c)["vendor"], "exclude") {
		t.Errorf("excluded directory not reported: %v", c.Skipped)
	}
	only, err := Load(t.Context(), dir, Options{Include: []string{"*.go"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(only); got != "a.go,sub/b.go,vendor/v.go" {
		t.Errorf("include *.go: %s", got)
	}
}

func TestLoadSkipsWhatItCannotUseAndSaysWhy(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "ok.go", "package ok\n")
	write(t, dir, "blob.go", "\x7fELF\x00\x01\x02")
	write(t, dir, "latin1.txt", "caf\xe9")
	write(t, dir, "big.txt", strings.Repeat("x", 100))
	huge := filepath.Join(dir, "huge.bin")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil { // a sparse 2 GB file: never read
		t.Fatal(err)
	}
	f.Close()
	outside := t.TempDir()
	write(t, outside, "passwd", "root:x:0:0")
	must(t, os.Symlink(filepath.Join(outside, "passwd"), filepath.Join(dir, "escape")))
	must(t, os.Symlink("ok.go", filepath.Join(dir, "alias.go")))
	must(t, os.Mkdir(filepath.Join(dir, "loop"), 0o755))
	must(t, os.Symlink("..", filepath.Join(dir, "loop", "up")))
	must(t, os.Symlink("nowhere", filepath.Join(dir, "dangling")))

	c, err := Load(t.Context(), dir, Options{MaxFileBytes: 50})
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c); got != "alias.go,ok.go" {
		t.Errorf("files = %s", got)
	}
	r := reasons(c)
	for name, want := range map[string]string{
		"blob.go": "binary", "latin1.txt": "UTF-8", "big.txt": "cap", "huge.bin": "2147483648 bytes",
		"escape": "outside the codex", "loop/up": "loop", "dangling": "broken",
	} {
		if !strings.Contains(r[name], want) {
			t.Errorf("skip reason for %s = %q, want it to mention %q", name, r[name], want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRenderIsDeterministicAndUnforgeable(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "b.md", "~~~\n~~~ file \"fake.go\"\nforged\n~~~~\n")
	write(t, dir, "a.go", "package a")
	c1, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if c1.Body() != c2.Body() {
		t.Fatal("two loads of one tree render differently")
	}
	want := "~~~ file \"a.go\"\npackage a\n~~~\n~~~~~ file \"b.md\"\n~~~\n~~~ file \"fake.go\"\nforged\n~~~~\n~~~~~\n"
	if c1.Body() != want {
		t.Errorf("body\n%q\nwant\n%q", c1.Body(), want)
	}
	if strings.Contains(c1.Body(), "/") && strings.Contains(c1.Body(), dir) {
		t.Error("the body names the machine's absolute path")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(t.Context(), filepath.Join(dir, "nope"), DefaultOptions()); err == nil {
		t.Error("nonexistent path loaded")
	}
	write(t, dir, "a.txt", strings.Repeat("a", 40))
	write(t, dir, "b.txt", strings.Repeat("b", 40))
	if _, err := Load(t.Context(), dir, Options{MaxTotalBytes: 50}); err == nil || !strings.Contains(err.Error(), "nothing was loaded") {
		t.Errorf("total cap not enforced: %v", err)
	}
	if _, err := Load(t.Context(), dir, Options{Exclude: []string{"[z-a"}}); err == nil {
		t.Error("bad pattern accepted")
	}
	c, err := Load(t.Context(), filepath.Join(dir, "a.txt"), DefaultOptions())
	if err != nil || paths(c) != "a.txt" {
		t.Fatalf("one-file codex: %v, %s", err, paths(c))
	}
	if b := c.Block("cag"); b.Mode != "cag" || len(b.Files) != 1 || b.Body == "" {
		t.Errorf("block = %+v", b)
	}
	if os.Getuid() != 0 {
		locked := filepath.Join(dir, "locked")
		must(t, os.Mkdir(locked, 0o000))
		defer os.Chmod(locked, 0o755)
		if _, err := Load(t.Context(), locked, DefaultOptions()); err == nil {
			t.Error("unreadable root loaded")
		}
	}
}

// countingCounter counts bytes as tokens and how often it was called.
type countingCounter struct{ calls atomic.Int64 }

func (c *countingCounter) CountText(s string) (int, error) {
	c.calls.Add(1)
	return len(s), nil
}

func TestCacheRecountsOnlyChangedFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		write(t, dir, n+".go", "package "+n+"\n")
	}
	cachePath := filepath.Join(t.TempDir(), "cache")
	counter := &countingCounter{}
	load := func() *Codex {
		t.Helper()
		cache, err := OpenCache(cachePath, "tok-1")
		if err != nil {
			t.Fatal(err)
		}
		c, err := Load(t.Context(), dir, Options{Counter: counter, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.Save(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := load()
	if counter.calls.Load() != 4 || first.Tokens != int64(4*len("package a\n")) {
		t.Fatalf("first load: %d calls, %d tokens", counter.calls.Load(), first.Tokens)
	}
	load()
	if counter.calls.Load() != 4 {
		t.Errorf("unchanged reload counted again: %d calls", counter.calls.Load())
	}
	write(t, dir, "b.go", "package b // changed\n")
	again := load()
	if counter.calls.Load() != 5 {
		t.Errorf("one changed file: %d calls, want 5", counter.calls.Load())
	}
	if again.Tokens != first.Tokens+int64(len(" // changed")) {
		t.Errorf("tokens after change = %d", again.Tokens)
	}
	if c, _ := OpenCache(cachePath, "tok-2"); c.Len() != 0 {
		t.Error("a cache for another tokenizer was reused")
	}
}

func TestLoadStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range 50 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%02d.txt", i)), []byte("text\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Load(ctx, dir, DefaultOptions()); !errors.Is(err, context.Canceled) {
		t.Errorf("load with a cancelled context: %v", err)
	}
	// Cancelled while reading files: progress cancels after the first file.
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	opts := DefaultOptions()
	opts.Progress = func(ctxd.CodexProgress) { cancel() }
	if _, err := Load(ctx, dir, opts); !errors.Is(err, context.Canceled) {
		t.Errorf("load cancelled while reading: %v", err)
	}
}

// TestFilesAreInPathOrder: a file and a directory of the same stem ("a.go"
// and "a/") used to load directory first, which the RunContext refuses.
func TestFilesAreInPathOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	write(t, dir, "a/b.go", "package b\n")
	write(t, dir, "a-z.go", "package z\n")
	c, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range c.Files {
		got = append(got, f.Path)
	}
	if want := []string{"a-z.go", "a.go", "a/b.go"}; !slices.Equal(got, want) {
		t.Errorf("files in order %v, want %v", got, want)
	}
	rc := runcontext.RunContext{
		Identity: runcontext.Identity{Name: "t", Persona: "p"}, Codex: c.Block(runcontext.ModeCAG),
		Environment: runcontext.Environment{Memory: "high", GPU: "none", Power: "ac", Connectivity: "online"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}}, Query: runcontext.Query{Text: "q"},
	}
	if err := rc.Validate(); err != nil {
		t.Errorf("the loaded codex does not validate: %v", err)
	}
}
