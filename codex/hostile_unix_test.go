//go:build unix

package codex

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctxd/ctxd/runcontext"
)

// within runs f and fails the test if it has not returned after a few
// seconds: a load that opens a named pipe would otherwise block the test
// binary until its own timeout. The pipes are opened for writing on the
// way out, so a read blocked on one ends.
func within[T any](t *testing.T, pipes []string, f func() T) T {
	t.Helper()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(5 * time.Second):
		for _, p := range pipes {
			if fd, err := syscall.Open(p, syscall.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				syscall.Close(fd)
			}
		}
		t.Fatal("blocked for 5s: opened a named pipe?")
		panic("unreachable")
	}
}

func mkfifo(t *testing.T, path string) string {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(path), 0o755))
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	return path
}

// socket binds a Unix socket in dir, or at a short path if dir is ""
// (socket paths are limited to about 108 bytes), and returns it.
func socket(t *testing.T, dir string) string {
	t.Helper()
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("/tmp", "ctxd-sock")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	path := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Skipf("unix socket: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	return path
}

type loadResult struct {
	c   *Codex
	err error
}

// TestNonRegularRootIsRefused: a codex root that is neither a directory
// nor a regular file is an error that names what it is; a named pipe used
// to block the load (and the daemon's codex lock) forever.
func TestNonRegularRootIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, want string
		path       func(t *testing.T) string
	}{
		{"pipe", "is a named pipe, not a directory", func(t *testing.T) string { return mkfifo(t, filepath.Join(t.TempDir(), "pipe")) }},
		{"socket", "is a socket, not a directory", func(t *testing.T) string { return socket(t, "") }},
		{"device", "is a device, not a directory", func(t *testing.T) string { return "/dev/null" }},
		{"link to a pipe", "is a named pipe, not a directory", func(t *testing.T) string {
			dir := t.TempDir()
			mkfifo(t, filepath.Join(dir, "pipe"))
			must(t, os.Symlink("pipe", filepath.Join(dir, "link")))
			return filepath.Join(dir, "link")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := tc.path(t)
			r := within(t, []string{path}, func() loadResult {
				c, err := Load(t.Context(), path, DefaultOptions())
				return loadResult{c, err}
			})
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("load of a %s root: %v; want an error saying it %s", tc.name, r.err, tc.want)
			}
		})
	}
}

// TestNonRegularFilesInTheTreeAreSkipped: pipes, sockets and links to them
// inside the tree are skipped with a reason, a pipe named like an ignore
// file included, and the load finishes.
func TestNonRegularFilesInTheTreeAreSkipped(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	write(t, dir, "sub/b.go", "package b\n")
	pipes := []string{
		mkfifo(t, filepath.Join(dir, "pipe.go")),
		mkfifo(t, filepath.Join(dir, "sub", ".gitignore")),
	}
	must(t, os.Symlink("pipe.go", filepath.Join(dir, "link.go")))
	socket(t, dir)
	r := within(t, pipes, func() loadResult {
		c, err := Load(t.Context(), dir, DefaultOptions())
		return loadResult{c, err}
	})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := paths(r.c); got != "a.go,sub/b.go" {
		t.Errorf("files = %s", got)
	}
	got := reasons(r.c)
	for _, p := range []string{"pipe.go", "link.go", "sub/.gitignore", "sock"} {
		if !strings.Contains(got[p], "not a regular file") {
			t.Errorf("skip reason for %s = %q, want it to say it is not a regular file", p, got[p])
		}
	}
	if _, ok := got["sock"]; !ok {
		t.Errorf("a socket is not reported: %v", r.c.Skipped)
	}
}

// TestFileSwappedForAPipeAfterTheWalk: a regular file that becomes a named
// pipe, or a link to one, between the walk and the read is skipped, not
// waited on; so is one read again on demand after the load.
func TestFileSwappedForAPipeAfterTheWalk(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	info, err := os.Stat(filepath.Join(dir, "a.go"))
	must(t, err)
	pipe := mkfifo(t, filepath.Join(dir, "pipe"))
	must(t, os.Symlink("pipe", filepath.Join(dir, "link")))
	tree, err := openTreeRoot(dir, nil, "")
	must(t, err)
	for _, name := range []string{"pipe", "link"} {
		e := entry{rel: "a.go", real: name, size: info.Size(), stat: statOf(info)}
		r := within(t, []string{pipe}, func() result { return loadFile(tree, e, DefaultOptions()) })
		if r.skip == nil || r.file != nil {
			t.Errorf("a %s swapped in after the walk was loaded: %+v", name, r.file)
		} else if !strings.Contains(r.skip.Reason, "not a regular file") && !strings.Contains(r.skip.Reason, "symbolic link") {
			t.Errorf("a %s swapped in after the walk: skip reason %q", name, r.skip.Reason)
		}
	}

	// A directory swapped for a pipe, a link to one, or a link out of the
	// codex, between its parent's listing and its own: not waited on, and
	// not followed out of the codex.
	outside := t.TempDir()
	write(t, outside, "secret.txt", "outside the codex")
	must(t, os.Symlink(outside, filepath.Join(dir, "out")))
	for _, name := range []string{"pipe", "link", "out"} {
		w, err := newWalker(t.Context(), tree, DefaultOptions())
		must(t, err)
		err = within(t, []string{pipe}, func() error { return w.walk(filepath.Join(dir, name), "sub", nil) })
		if err != nil || len(w.files) != 0 || len(w.skipped) != 1 || !strings.Contains(w.skipped[0].Reason, "unreadable directory") {
			t.Errorf("a directory swapped for %s: %v, files %v, skipped %v", name, err, w.files, w.skipped)
		}
	}

	c, err := Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	c.DropContent()
	must(t, os.Remove(filepath.Join(dir, "a.go")))
	mkfifo(t, filepath.Join(dir, "a.go"))
	err = within(t, []string{filepath.Join(dir, "a.go")}, func() error { _, err := c.Content(0); return err })
	if !errors.Is(err, ErrChanged) {
		t.Errorf("a file swapped for a pipe, read on demand: %v", err)
	}
}

// TestFileNamesWithControlCharacters: a name the RunContext cannot carry
// (a newline, any control character, invalid UTF-8) is skipped with a
// reason, never loaded: one such file used to make every request fail
// validation while the daemon said it was ready.
func TestFileNamesWithControlCharacters(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "ok.go", "package ok\n")
	for _, name := range []string{"bad\nname.go", "cr\rname.go", "esc\x1b[31m.go", "tab\tdir/x.go", "caf\xe9.go", "del\x7f.go"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte("package x\n"), 0o644); err != nil {
			t.Skipf("this file system refuses the name %q: %v", name, err)
		}
	}
	c, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c); got != "ok.go" {
		t.Errorf("files = %q, want ok.go alone", got)
	}
	got := reasons(c)
	for path, want := range map[string]string{
		`"bad\nname.go"`: "control character", `"cr\rname.go"`: "control character", `"esc\x1b[31m.go"`: "control character",
		`"tab\tdir"`: "control character", `"caf\xe9.go"`: "not valid UTF-8", `"del\x7f.go"`: "control character",
	} {
		if !strings.Contains(got[path], want) {
			t.Errorf("skip reason for %s = %q, want it to mention %q (all skipped: %q)", path, got[path], want, c.Skipped)
		}
	}
	for _, sk := range c.Skipped {
		if strings.ContainsAny(sk.Path, "\n\r\x1b\t\x7f") {
			t.Errorf("a skipped path is reported raw: %q", sk.Path)
		}
	}
	for _, mode := range []string{runcontext.ModeCAG, runcontext.ModeRAG} {
		rc := runcontext.RunContext{
			Identity: runcontext.Identity{Name: "t", Persona: "p"}, Codex: c.Block(mode),
			Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
			Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}}, Query: runcontext.Query{Text: "q"},
		}
		if err := rc.Validate(); err != nil {
			t.Errorf("the %s codex block does not validate: %v", mode, err)
		}
	}

	// A one-file codex is named by the operator: a bad name is an error.
	bad := filepath.Join(dir, "bad\nname.go")
	if _, err := Load(t.Context(), bad, DefaultOptions()); err == nil || !strings.Contains(err.Error(), "control character") {
		t.Errorf("one-file codex with a newline in its name: %v", err)
	}
}

// TestHugeIgnoreFileIsCapped: an ignore file is read up to a cap, in bytes
// and in patterns; what lies past it is not applied, and the load says so.
func TestHugeIgnoreFileIsCapped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, filler string
		lines        int
		want         string
	}{
		{"bytes", "#" + strings.Repeat("x", 1000) + "\n", maxIgnoreBytes/1001 + 10, fmt.Sprintf("first %d bytes", maxIgnoreBytes)},
		{"patterns", "n%d\n", maxIgnorePatterns + 10, fmt.Sprintf("first %d patterns", maxIgnorePatterns)},
		{"one long line", strings.Repeat("y", 2*maxIgnoreBytes) + "\n", 1, fmt.Sprintf("first %d bytes", maxIgnoreBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			var sb strings.Builder
			sb.WriteString("early.txt\n")
			for i := range tc.lines {
				if strings.Contains(tc.filler, "%d") {
					fmt.Fprintf(&sb, tc.filler, i)
				} else {
					sb.WriteString(tc.filler)
				}
			}
			sb.WriteString("late.txt\n")
			write(t, dir, "sub/.gitignore", sb.String())
			write(t, dir, "sub/early.txt", "ignored")
			write(t, dir, "sub/late.txt", "past the cap")
			c, err := Load(t.Context(), dir, DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimPrefix(paths(c), "sub/.gitignore,"); got != "sub/late.txt" {
				t.Errorf("files = %s, want sub/late.txt (its rule lies past the cap) and not sub/early.txt", got)
			}
			var notes []string
			for _, sk := range c.Skipped {
				if sk.Path == "sub/.gitignore" {
					notes = append(notes, sk.Reason)
				}
			}
			if !strings.Contains(strings.Join(notes, "; "), tc.want) {
				t.Errorf("ignore file notes %q, want one saying only its %s are used", notes, tc.want)
			}
		})
	}
}

// TestSecretFilesAreSkippedUnlessAllowed: the walk asks secretFile of
// every file, and of a link's target too; a secret is skipped with its
// reason, include patterns or not, unless the operator's AllowSecret
// names it. Not parallel: it replaces the package's secretFile while no
// other test loads.
func TestSecretFilesAreSkippedUnlessAllowed(t *testing.T) {
	saved := secretFile
	t.Cleanup(func() { secretFile = saved })
	secretFile = func(rel string) (string, bool) {
		if filepath.Base(rel) == ".env" {
			return "secret: environment file", true
		}
		return "", false
	}
	dir := t.TempDir()
	write(t, dir, "a.go", "package a\n")
	write(t, dir, ".env", "TOKEN=x\n")
	write(t, dir, "sub/.env", "TOKEN=y\n")
	must(t, os.Symlink(".env", filepath.Join(dir, "env.txt")))
	c, err := Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	if got := paths(c); got != "a.go" {
		t.Errorf("files = %s, want a.go alone", got)
	}
	r := reasons(c)
	for _, p := range []string{".env", "sub/.env", "env.txt"} {
		if !strings.HasPrefix(r[p], "secret: environment file") || !strings.Contains(r[p], "codex.allow_secret_files") {
			t.Errorf("skip reason for %s = %q", p, r[p])
		}
	}
	opts := DefaultOptions()
	opts.Include = []string{"*.go", ".env"}
	c, err = Load(t.Context(), dir, opts)
	must(t, err)
	if got := paths(c); got != "a.go" {
		t.Errorf("with .env included, files = %s, want a.go alone: include patterns do not bring secrets back", got)
	}
	opts = DefaultOptions()
	opts.AllowSecret = []string{".env"}
	c, err = Load(t.Context(), dir, opts)
	must(t, err)
	if got := paths(c); got != ".env,a.go,env.txt,sub/.env" {
		t.Errorf("with .env allowed by the operator, files = %s", got)
	}
}
