package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrStateInUse means another daemon holds the state directory.
var ErrStateInUse = errors.New("state directory in use")

// lockStateDir makes the state directory private to this user and this
// daemon: it is created 0700; one that exists must belong to this uid and
// is tightened to 0700 if it is open to others; and an exclusive lock on
// its lock file keeps a second daemon out (two daemons on one database
// would each believe they alone write its sessions). release drops the
// lock.
func lockStateDir(dir string, log *slog.Logger) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: daemon.state_dir: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("daemon: daemon.state_dir: %w", err)
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("daemon: daemon.state_dir %s belongs to uid %d, not to this daemon's uid %d: use a directory of your own", dir, st.Uid, os.Getuid())
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("daemon: daemon.state_dir %s is open to others (mode %04o) and could not be made private: %w", dir, perm, err)
		}
		log.Warn("state directory was open to other users; made private", "dir", dir, "was", fmt.Sprintf("%04o", perm), "now", "0700")
	}
	path := filepath.Join(dir, "ctxd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("daemon: lock the state directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		who := "another ctxd"
		if pid := strings.TrimSpace(string(holder)); pid != "" {
			who += " (pid " + pid + ")"
		}
		return nil, fmt.Errorf("daemon: %w: %s is held by %s; stop it, or give this daemon its own daemon.state_dir", ErrStateInUse, dir, who)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
