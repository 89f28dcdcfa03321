package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/sqlite"
)

// TestStateDirIsPrivateAndSingleOwner: a second daemon on the same state
// directory is refused (two would corrupt each other's view of sessions);
// a directory open to others is made private; one of another uid is
// refused; the database is created 0600.
func TestStateDirIsPrivateAndSingleOwner(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	release, err := lockStateDir(dir, daemontest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockStateDir(dir, daemontest.Logger(t)); !errors.Is(err, ErrStateInUse) || !strings.Contains(err.Error(), "pid") {
		t.Errorf("a second daemon on the same state directory: %v", err)
	}
	release()
	again, err := lockStateDir(dir, daemontest.Logger(t))
	if err != nil {
		t.Fatalf("after the first let go: %v", err)
	}
	again()

	loose := filepath.Join(t.TempDir(), "loose")
	if err := os.Mkdir(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	rel, err := lockStateDir(loose, daemontest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	rel()
	if info, _ := os.Stat(loose); info.Mode().Perm() != 0o700 {
		t.Errorf("a world-writable state directory is left %04o", info.Mode().Perm())
	}

	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "ctxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if info, err := os.Stat(filepath.Join(dir, "ctxd.db")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("database mode %v %v", info.Mode().Perm(), err)
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
	if _, err := lockStateDir(theirs, daemontest.Logger(t)); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("another uid's state directory: %v", err)
	}
}
