//go:build unix

package codexsvc

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
)

// TestAPipeDoesNotHoldTheLock: a named pipe where the codex root, or its
// settings file, should be fails the load at once, and the next load
// (which waits for the lock) goes ahead. Each used to block the load, and
// every later one, forever.
func TestAPipeDoesNotHoldTheLock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pipe func(dir string) (root, pipe string)
		want string
	}{
		{"root", func(dir string) (string, string) { p := filepath.Join(dir, "pipe"); return p, p }, "named pipe"},
		{"settings", func(dir string) (string, string) { return dir, filepath.Join(dir, codex.SettingsFile) }, "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := newService(t, 100000, false)
			root, pipe := tc.pipe(tree(t, 1, 100))
			if err := syscall.Mkfifo(pipe, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := s.Load(t.Context(), root, nil)
				done <- err
			}()
			select {
			case err := <-done:
				if ctxd.KindOf(err) != ctxd.KindInvalid || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("load: %v (kind %q), want an invalid-input error saying %q", err, ctxd.KindOf(err), tc.want)
				}
			case <-time.After(5 * time.Second):
				if fd, err := syscall.Open(pipe, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					syscall.Close(fd) // ends the blocked read
				}
				t.Fatal("the load blocked for 5s on a named pipe")
			}
			if st, err := s.Load(t.Context(), tree(t, 2, 100), nil); err != nil || st.Files != 2 {
				t.Errorf("the next load: %+v, %v", st, err)
			}
		})
	}
}

// TestWatchIgnoresIgnoredDirectories: what the codex leaves out (its
// ignore files, the daemon's and the codex's exclude patterns) is neither
// watched nor reacted to: with make run's layout, the daemon's state and
// build outputs lie in an ignored var/ inside the codex. A change to an
// ignore file is a change: a directory it no longer ignores is watched.
func TestWatchIgnoresIgnoredDirectories(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 100000, true)
	s.cfg.Settings.Walk.Exclude = []string{"build/"}
	dir := tree(t, 2, 300)
	writeFile := func(rel, content string) {
		t.Helper()
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(".gitignore", "/var/\n*.log\n")
	writeFile(codex.SettingsFile, "[codex]\nexclude = [\"gen/\"]\n")
	for _, d := range []string{"var/state/slots", "var/models", "build", "gen"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Load(t.Context(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	files := st.Files
	for _, rel := range []string{"var/state/sessions.db", "var/state/slots/slot-0.bin", "var/models/m.gguf", "var/new/deeper/x.go",
		"debug.log", "build/out.go", "gen/z.go"} {
		writeFile(rel, "written by something other than the codex's owner\n")
	}
	time.Sleep(3 * debounce)
	if _, _, _, n := snk.published(); n != 1 {
		t.Fatalf("published %d times after writes to ignored and excluded paths only, want once (the load)", n)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, 20*time.Second, what, cond)
	}
	writeFile(".gitignore", "*.log\n")
	waitFor("a changed ignore file reloads", func() bool { st, _ := s.Stats(); return st.Files > files })
	st, _ = s.Stats()
	files = st.Files
	writeFile("var/models/new.go", "package models\n")
	waitFor("a directory no longer ignored is watched", func() bool { st, _ := s.Stats(); return st.Files == files+1 })
}

// TestWatchOfAOneFileCodex: a one-file codex reloads when its file
// changes, not when its neighbours or the tree below its directory do.
func TestWatchOfAOneFileCodex(t *testing.T) {
	t.Parallel()
	s, snk := newService(t, 100000, true)
	dir := tree(t, 2, 100)
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "h00.go")
	if _, err := s.Load(t.Context(), file, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"h01.go", "other.txt", "sub/x.go"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("package x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * debounce)
	if _, _, _, n := snk.published(); n != 1 {
		t.Fatalf("published %d times after changes beside the codex's file, want once (the load)", n)
	}
	if err := os.WriteFile(file, []byte("package x // changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a change to the codex's file reloaded", func() bool { _, _, _, n := snk.published(); return n == 2 })
}

// TestWatcherReloadOfASwappedRootIsRefused (issue 27, finding 1): a codex
// loaded from under a load root is swapped for a link to a directory
// outside (`mv proj proj.old && ln -s /etc proj`) and its watcher fires.
// The reload, by the same path, is refused (the root is checked on every
// load, by opening it beneath the allowed directory), and the codex stays
// the one loaded: the outside file is never served.
func TestWatcherReloadOfASwappedRootIsRefused(t *testing.T) {
	t.Parallel()
	allowed := t.TempDir()
	s, _ := newServiceWith(t, 100000, true, func(c *Config) { c.Settings.Walk.Within = codex.Allow([]string{allowed}) })
	proj := filepath.Join(allowed, "proj")
	if err := os.MkdirAll(proj, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proj, "a.go"), []byte("package a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(t.Context(), proj, nil); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "shadow"), []byte("root:$6$hash:::\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(proj, proj+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(out, proj); err != nil {
		t.Fatal(err)
	}
	// A change in the watched tree (now proj.old) makes the watcher reload
	// proj, which now leads outside.
	if err := os.WriteFile(filepath.Join(proj+".old", "b.go"), []byte("package a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * debounce)
	if _, err := s.File("shadow"); ctxd.KindOf(err) != ctxd.KindNotFound {
		t.Errorf("GET shadow after the swap: %v, want not found", err)
	}
	files, _ := s.Files()
	for _, f := range files {
		if f.Path == "shadow" {
			t.Errorf("the outside directory was loaded: %v", files)
		}
	}
	if _, err := s.Load(t.Context(), proj, nil); ctxd.KindOf(err) != ctxd.KindForbidden {
		t.Errorf("a load of the swapped path: %v, want forbidden", err)
	}
}
