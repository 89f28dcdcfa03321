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
	"time"

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

// TestReloadReadsOnlyChangedFiles: an unchanged tree reloads from the stat
// index without opening a file; a changed file is read, scanned and
// counted alone; a file modified within the timestamps' granularity of a
// scan is read again however unchanged its metadata looks.
func TestReloadReadsOnlyChangedFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b", "c", "d"} {
		write(t, dir, n+".go", "package "+n+"\n")
	}
	write(t, dir, "bin.dat", "\x00\x01binary")
	old := time.Now().Add(-time.Hour)
	for _, n := range []string{"a.go", "b.go", "c.go", "d.go", "bin.dat"} {
		must(t, os.Chtimes(filepath.Join(dir, n), old, old))
	}
	cachePath := filepath.Join(t.TempDir(), "cache")
	counter := &countingCounter{}
	var prev *Codex
	load := func() *Codex {
		t.Helper()
		cache, err := OpenCache(cachePath, "tok-1")
		if err != nil {
			t.Fatal(err)
		}
		c, err := Load(t.Context(), dir, Options{Cache: cache, Previous: prev})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Count(t.Context(), counter, cache, func(int64, int64) bool { return false }); err != nil {
			t.Fatal(err)
		}
		if err := cache.Save(); err != nil {
			t.Fatal(err)
		}
		prev = c
		return c
	}
	first := load()
	if first.Read != 5 || counter.calls.Load() != 4 || first.Tokens != int64(4*len("package a\n")) || !first.Counted {
		t.Fatalf("first load: %d files read, %d counted, %d tokens", first.Read, counter.calls.Load(), first.Tokens)
	}
	prev = nil // a daemon restart: nothing in memory
	again := load()
	if again.Read != 0 || counter.calls.Load() != 4 || len(again.Skipped) != 1 {
		t.Errorf("unchanged reload: %d files read, %d counted, skipped %v", again.Read, counter.calls.Load(), again.Skipped)
	}
	if again.Files[1].HasContent {
		t.Error("an unchanged file's content was read")
	}
	if s, err := again.Content(1); err != nil || s != "package b\n" {
		t.Errorf("content on demand = %q, %v", s, err)
	}
	write(t, dir, "b.go", "package b // changed\n")
	changed := load()
	if changed.Read != 1 || counter.calls.Load() != 5 {
		t.Errorf("one changed file: %d files read, %d counted; want 1 and 5", changed.Read, counter.calls.Load())
	}
	if changed.Tokens != first.Tokens+int64(len(" // changed")) {
		t.Errorf("tokens after change = %d", changed.Tokens)
	}
	// b.go was just written: racily clean until a scan starts past its
	// timestamp's granularity, so the next reload reads it again.
	if racyAgain := load(); racyAgain.Read != 1 || counter.calls.Load() != 5 {
		t.Errorf("racily clean file: %d files read, %d counted; want 1 read, no count", racyAgain.Read, counter.calls.Load())
	}
	time.Sleep(50 * time.Millisecond)
	load()
	if settled := load(); settled.Read != 0 {
		t.Errorf("settled tree: %d files read", settled.Read)
	}
	if c, _ := OpenCache(cachePath, "tok-2"); c.Len() != 0 {
		t.Error("a cache for another tokenizer was reused")
	}
	// The content of b.go before the change is referenced by no file: pruned.
	cache, _ := OpenCache(cachePath, "tok-1")
	if cache.Len() != 4 {
		t.Errorf("cache holds %d contents, want the 4 files' only", cache.Len())
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
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}}, Query: runcontext.Query{Text: "q"},
	}
	if err := rc.Validate(); err != nil {
		t.Errorf("the loaded codex does not validate: %v", err)
	}
}

// TestDamagedCacheStartsOver: a truncated or foreign cache file is not an
// error and not trusted: the load reads every file.
func TestDamagedCacheStartsOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	cachePath := filepath.Join(t.TempDir(), "cache")
	cache, err := OpenCache(cachePath, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(t.Context(), dir, Options{Cache: cache}); err != nil {
		t.Fatal(err)
	}
	must(t, cache.Save())
	good, err := os.ReadFile(cachePath)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"truncated": good[:len(good)-7], "foreign": []byte("not a cache at all"), "trailing": append(good, 1)} {
		must(t, os.WriteFile(cachePath, data, 0o600))
		c, err := OpenCache(cachePath, "tok")
		if err != nil || c.Len() != 0 {
			t.Errorf("%s cache: %v, %d entries", name, err, c.Len())
		}
	}
}

// TestContentChangedSinceLoad: content read on demand is checked against
// the hash the load recorded.
func TestContentChangedSinceLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	c, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	c.DropContent()
	write(t, dir, "a.go", "package b\n")
	if _, err := c.Content(0); !errors.Is(err, ErrChanged) {
		t.Errorf("changed file read on demand: %v", err)
	}
}
