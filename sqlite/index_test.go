package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd/codex"
)

func TestIndexSyncAndSearch(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	put := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	put("socket.go", "package daemon\n\n// Listen opens the unix socket.\nfunc Listen(path string) error {\n\treturn nil\n}\n\nfunc Render() string {\n\treturn \"blocks\"\n}\n")
	put("README.md", "# ctxd\nA sidecar.\n\n## Sockets\nThe daemon listens on a unix socket.\n")
	put("notes.txt", "unrelated words about gardening\n")
	load := func() *codex.Codex {
		c, err := codex.Load(t.Context(), dir, codex.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	x, err := OpenIndex(ctx, filepath.Join(t.TempDir(), "index.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if n, err := x.Sync(ctx, load(), nil); err != nil || n != 3 {
		t.Fatalf("first sync: %d files, %v", n, err)
	}
	x.Publish()
	got, err := x.Search(ctx, "Where is the socket opened? (OR NEAR\"", 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 2 {
		t.Fatalf("search found %d excerpts: %+v", len(got), got)
	}
	var where []string
	for _, e := range got {
		where = append(where, e.Path+":"+e.Lines)
		if strings.Contains(e.Text, "gardening") {
			t.Errorf("irrelevant excerpt ranked: %+v", e)
		}
	}
	if !strings.Contains(strings.Join(where, " "), "socket.go:1-") && !strings.Contains(strings.Join(where, " "), "socket.go:3-") {
		t.Errorf("excerpts %v lack the Listen function", where)
	}
	if n, err := x.Sync(ctx, load(), nil); err != nil || n != 0 {
		t.Errorf("unchanged sync re-indexed %d files (%v)", n, err)
	}
	x.Publish()
	put("notes.txt", "now about sockets too\n")
	if err := os.Remove(filepath.Join(dir, "README.md")); err != nil {
		t.Fatal(err)
	}
	if n, err := x.Sync(ctx, load(), nil); err != nil || n != 1 {
		t.Errorf("one changed file: re-indexed %d (%v)", n, err)
	}
	x.Publish()
	got, _ = x.Search(ctx, "sockets", 10)
	for _, e := range got {
		if e.Path == "README.md" {
			t.Errorf("a deleted file is still indexed: %+v", e)
		}
	}
	if none, _ := x.Search(ctx, "?!", 3); len(none) != 0 {
		t.Errorf("punctuation-only query found %v", none)
	}
}

// TestSyncOfAChangedFileFailsAndReturns: a file that changed since the
// load fails the sync (the reload that follows indexes it), and the sync
// returns: its chunkers, hundreds of files ahead, stop.
func TestSyncOfAChangedFileFailsAndReturns(t *testing.T) {
	dir := t.TempDir()
	for i := range 600 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%03d.go", i)), []byte(fmt.Sprintf("package p\n\nfunc F%d() {}\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, err := codex.Load(t.Context(), dir, codex.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	c.DropContent()
	if err := os.WriteFile(filepath.Join(dir, "f000.go"), []byte("package p // changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	x, err := OpenIndex(t.Context(), filepath.Join(t.TempDir(), "index.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	done := make(chan error, 1)
	go func() { _, err := x.Sync(t.Context(), c, nil); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, codex.ErrChanged) {
			t.Errorf("sync of a changed file: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the sync did not return")
	}
}
