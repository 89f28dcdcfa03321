package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenRefusesAnUnsafeDirectory: a socket directory someone else
// made first (world-writable, or another uid's) is refused with how to
// fix it, so nobody can swap the socket under the daemon's clients; a
// private one is used.
func TestListenRefusesAnUnsafeDirectory(t *testing.T) {
	t.Parallel()
	open := filepath.Join(t.TempDir(), "squatted")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if ln, err := Listen(filepath.Join(open, "ctxd.sock")); !errors.Is(err, ErrSocketDir) || !strings.Contains(err.Error(), "chmod 700") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("a world-writable socket directory: %v", err)
	}
	mine := filepath.Join(t.TempDir(), "mine")
	ln, err := Listen(filepath.Join(mine, "ctxd.sock"))
	if err != nil {
		t.Fatalf("a fresh directory: %v", err)
	}
	ln.Close()
	if info, _ := os.Stat(mine); info.Mode().Perm() != 0o700 {
		t.Errorf("the socket directory was created %04o", info.Mode().Perm())
	}
	if os.Getuid() != 0 {
		t.Skip("another uid's directory: needs root to chown (the rest ran)")
	}
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if ln, err := Listen(filepath.Join(theirs, "ctxd.sock")); !errors.Is(err, ErrSocketDir) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		if ln != nil {
			ln.Close()
		}
		t.Errorf("another uid's socket directory: %v", err)
	}
}
