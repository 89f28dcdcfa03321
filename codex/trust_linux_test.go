package codex

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
)

// The attacks of the second trust round (issue 27) on the codex's reads,
// each as the round ran it; docs/security.md lists them.

// outsideTree is a directory outside every allowed one, holding a file an
// attacker wants read ("shadow").
func outsideTree(t *testing.T) string {
	t.Helper()
	out := t.TempDir()
	write(t, out, "shadow", "root:$6$secret-hash:19000:0:99999:7:::\n")
	return out
}

// TestRootSwappedForALinkIsRefused (finding 1): a user who owns a
// directory under a load root loads it, then swaps it for a link to a
// directory outside (`mv proj proj.old && ln -s /etc proj`). The reload,
// by the same path, is refused: the root is opened beneath the allowed
// directory's descriptor on every load, not checked once by its path.
func TestRootSwappedForALinkIsRefused(t *testing.T) {
	allowed := t.TempDir()
	proj := filepath.Join(allowed, "proj")
	write(t, proj, "a.go", "package a\n")
	within := Allow([]string{allowed})
	opts := DefaultOptions()
	opts.Within = within
	c, err := Load(t.Context(), proj, opts)
	must(t, err)
	if paths(c) != "a.go" {
		t.Fatalf("files = %s", paths(c))
	}
	out := outsideTree(t)
	must(t, os.Rename(proj, proj+".old"))
	must(t, os.Symlink(out, proj))
	c, err = Load(t.Context(), proj, opts)
	if err == nil {
		t.Fatalf("the swapped root loaded: %s", paths(c))
	}
	if ctxd.KindOf(err) != ctxd.KindForbidden || !strings.Contains(err.Error(), "codex.load_roots") {
		t.Errorf("the swapped root: %v (kind %s), want forbidden, naming codex.load_roots", err, ctxd.KindOf(err))
	}
	if _, _, err := LoadSettings(proj, within); err == nil || ctxd.KindOf(err) != ctxd.KindForbidden {
		t.Errorf("the swapped root's settings: %v, want forbidden", err)
	}

	// The allowed directory itself replaced by another of the same name
	// (by whoever could): not the directory the operator allowed.
	allowed2 := t.TempDir()
	write(t, allowed2, "p/a.go", "package a\n")
	within2 := Allow([]string{allowed2})
	must(t, os.Rename(allowed2, allowed2+".old"))
	write(t, allowed2, "p/x.go", "package x\n")
	opts.Within = within2
	if _, err := Load(t.Context(), filepath.Join(allowed2, "p"), opts); err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("a load under a replaced allowed directory: %v, want refused as replaced", err)
	}
}

// TestDirectorySwappedAfterTheWalkIsNotFollowed (finding 2): a directory
// inside the tree is swapped for a link out of it after the walk listed
// it, before its files are read (the round did it on inotify, 10 of 10).
// The read goes beneath the root's descriptor and refuses the link; so
// does a later read on demand.
func TestDirectorySwappedAfterTheWalkIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "w/d/shadow", "package d // the codex's own file\n")
	out := outsideTree(t)
	tree, err := openTreeRoot(dir, nil, "")
	must(t, err)
	w, err := newWalker(t.Context(), tree, DefaultOptions())
	must(t, err)
	must(t, w.run())
	if len(w.files) != 1 || w.files[0].rel != "w/d/shadow" {
		t.Fatalf("walk found %+v", w.files)
	}
	// The swap, between the walk and the read.
	must(t, os.Rename(filepath.Join(dir, "w/d"), filepath.Join(dir, "w/d.old")))
	must(t, os.Symlink(out, filepath.Join(dir, "w/d")))
	r := loadFile(tree, w.files[0], DefaultOptions())
	if r.file != nil {
		t.Fatalf("read through the swapped directory: %q", r.file.Content)
	}
	var esc *escapeError
	if r.skip == nil || !strings.Contains(r.skip.Reason, "symbolic link") {
		t.Errorf("skip = %+v, want a reason naming the link", r.skip)
	}
	_, _, err = openRegular(tree, "w/d/shadow")
	if !errors.As(err, &esc) {
		t.Errorf("open through the link: %v, want an escape refused", err)
	}

	// On demand, after a load: the file's content is read again beneath
	// the root, and the link is refused.
	must(t, os.Remove(filepath.Join(dir, "w/d")))
	must(t, os.Rename(filepath.Join(dir, "w/d.old"), filepath.Join(dir, "w/d")))
	c, err := Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	c.DropContent()
	must(t, os.Rename(filepath.Join(dir, "w/d"), filepath.Join(dir, "w/d.old")))
	must(t, os.Symlink(out, filepath.Join(dir, "w/d")))
	if s, err := c.Content(0); err == nil || strings.Contains(s, "root:") {
		t.Errorf("content on demand through the link: %q, %v", s, err)
	}

	// Without openat2 (an old kernel), element by element: the same.
	noOpenat2.Store(true)
	defer noOpenat2.Store(false)
	if _, _, err := openRegular(tree, "w/d/shadow"); !errors.As(err, &esc) {
		t.Errorf("open through the link, element by element: %v, want an escape refused", err)
	}
	if f, _, err := openRegular(tree, "w/d.old/shadow"); err != nil {
		t.Errorf("a plain open, element by element: %v", err)
	} else {
		f.Close()
	}
}

// TestCodexSettingsCannotBringSecretsBack (finding 3): a repository's own
// .ctxd.toml with include = ["**"] loads none of its secret files; the
// operator's codex.allow_secret_files can name one.
func TestCodexSettingsCannotBringSecretsBack(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, SettingsFile, "[codex]\ninclude = [\"**\"]\n")
	write(t, dir, "main.go", "package main\n")
	secrets := []string{".netrc", ".pgpass", ".env", "kubeconfig", ".vault-token", "id_rsa", "infra/prod.tfstate", ".kube/config"}
	for _, p := range secrets {
		write(t, dir, p, "machine h login u password hunter2\n")
	}
	s, _, err := LoadSettings(dir, nil)
	must(t, err)
	opts := DefaultOptions().Merge(s.Codex)
	c, err := Load(t.Context(), dir, opts)
	must(t, err)
	if got := paths(c); got != "main.go" {
		t.Errorf("files = %s, want main.go alone", got)
	}
	r := reasons(c)
	for _, p := range secrets {
		if !strings.Contains(r[p], "codex.allow_secret_files") {
			t.Errorf("%s: skip reason %q", p, r[p])
		}
	}
	opts.AllowSecret = []string{".pgpass"}
	c, err = Load(t.Context(), dir, opts)
	must(t, err)
	if got := paths(c); got != ".pgpass,main.go" {
		t.Errorf("with .pgpass allowed by the operator: files = %s", got)
	}
}

// TestSettingsAndIgnoreFilesStayInside (finding 10): a .ctxd.toml that is
// a link out of the tree is not read (its keys never reach an error); an
// ignore file that is a link out is not read either, and says so; a file
// with a second hard link loads only if the operator allows it.
func TestSettingsAndIgnoreFilesStayInside(t *testing.T) {
	dir := t.TempDir()
	out := t.TempDir()
	write(t, out, "private.toml", "database_password_of_the_admin = 1\n")
	write(t, out, "ignore", "main.go\n")
	write(t, dir, "main.go", "package main\n")
	must(t, os.Symlink(filepath.Join(out, "private.toml"), filepath.Join(dir, SettingsFile)))
	_, _, err := LoadSettings(dir, nil)
	if err == nil || !strings.Contains(err.Error(), "symbolic link") || strings.Contains(err.Error(), "database_password") {
		t.Errorf("a settings file linked out: %v, want refused as a link, none of its keys named", err)
	}
	must(t, os.Remove(filepath.Join(dir, SettingsFile)))

	must(t, os.Symlink(filepath.Join(out, "ignore"), filepath.Join(dir, ".gitignore")))
	c, err := Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	if paths(c) != "main.go" {
		t.Errorf("an ignore file linked out was applied: files = %s", paths(c))
	}
	said := false
	for _, sk := range c.Skipped {
		said = said || sk.Path == ".gitignore" && strings.Contains(sk.Reason, "out of the codex")
	}
	if !said {
		t.Errorf("an ignore file linked out is not reported as such: %v", c.Skipped)
	}
	// A link to an ignore file inside the codex is still read.
	write(t, dir, "rules/ignore", "main.go\n")
	must(t, os.Remove(filepath.Join(dir, ".gitignore")))
	must(t, os.Symlink("rules/ignore", filepath.Join(dir, ".gitignore")))
	c, err = Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	if strings.Contains(paths(c), "main.go") {
		t.Errorf("an ignore file linked inside was not applied: files = %s", paths(c))
	}
	must(t, os.Remove(filepath.Join(dir, ".gitignore")))

	// A hard link: the same file as one outside the codex.
	write(t, out, "passwd", "root:x:0:0::/root:/bin/sh\n")
	if err := os.Link(filepath.Join(out, "passwd"), filepath.Join(dir, "passwd.txt")); err != nil {
		t.Skipf("hard link across the test's directories: %v", err)
	}
	c, err = Load(t.Context(), dir, DefaultOptions())
	must(t, err)
	if strings.Contains(paths(c), "passwd.txt") || !strings.Contains(reasons(c)["passwd.txt"], "codex.allow_hard_links") {
		t.Errorf("a hard-linked file: files %s, reason %q", paths(c), reasons(c)["passwd.txt"])
	}
	opts := DefaultOptions()
	opts.AllowHardLinks = true
	c, err = Load(t.Context(), dir, opts)
	must(t, err)
	if !strings.Contains(paths(c), "passwd.txt") {
		t.Errorf("a hard-linked file the operator allows: files %s", paths(c))
	}
}
