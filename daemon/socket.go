package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ErrInUse means another process is serving on the socket.
var ErrInUse = errors.New("socket in use")

// Listen listens on the Unix socket at path with mode 0600. An existing
// path is removed only if it is a socket that nobody answers on (stale,
// left by a crash); a live socket or a non-socket is an error. The
// socket's directory must be this user's and writable by no one else:
// in a directory another user created (say /tmp/ctxd-UID, made first by
// someone else), they could swap the socket and answer this user's
// clients. While the daemon serves on it, it re-creates the socket (and
// its directory) if they are removed.
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	_, statErr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: socket dir: %w", err)
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		// Its mode, whatever the umask.
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("daemon: socket dir: %w", err)
		}
	}
	if err := checkSocketDir(dir); err != nil {
		return nil, err
	}
	info, err := os.Lstat(path)
	switch {
	case err == nil && info.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("daemon: %s exists and is not a socket; refusing to remove it", path)
	case err == nil:
		conn, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			conn.Close()
			return nil, fmt.Errorf("daemon: %w: another process serves on %s (is ctxd already running?)", ErrInUse, path)
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) && !errors.Is(derr, syscall.ENOENT) {
			return nil, fmt.Errorf("daemon: probe %s: %w", path, derr)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("daemon: remove stale socket: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("daemon: %w", err)
	}
	// Create the socket with no access, then open it to the owner only, so
	// there is no moment at which others could connect. In a directory
	// others cannot enter (0700) no one else can reach it anyway, and the
	// process-wide umask is left alone: Listen also runs while the daemon
	// serves (re-creating a removed socket), when a changed umask would
	// touch whatever else is created at that moment.
	var ln net.Listener
	if dinfo, serr := os.Stat(dir); serr == nil && dinfo.Mode().Perm()&0o077 == 0 {
		ln, err = net.Listen("unix", path)
	} else {
		old := syscall.Umask(0o177)
		ln, err = net.Listen("unix", path)
		syscall.Umask(old)
	}
	if err != nil {
		return nil, fmt.Errorf("daemon: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: chmod socket: %w", err)
	}
	return &ownSocket{UnixListener: ln.(*net.UnixListener), path: path}, nil
}

// ownSocket is a socket Listen made: the daemon re-creates it if its file
// is removed while it serves (see keepSocket). A socket passed in (by
// systemd's socket activation) is its creator's to re-create.
type ownSocket struct {
	*net.UnixListener
	path string
}

// ErrSocketDir is a socket directory someone else could tamper with.
var ErrSocketDir = errors.New("unsafe socket directory")

// checkSocketDir refuses a directory that is not this uid's, or that its
// group or others may write to.
func checkSocketDir(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("daemon: socket dir: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("daemon: %w: %s is not a directory", ErrSocketDir, dir)
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("daemon: %w: %s belongs to uid %d, not to you (uid %d): another user may have created it to take the socket's place; "+
			"remove it (as root or its owner), or set daemon.socket in a directory of your own (such as $XDG_RUNTIME_DIR)", ErrSocketDir, dir, st.Uid, os.Getuid())
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("daemon: %w: %s is writable by others (mode %04o), who could replace the socket; run `chmod 700 %s`, or remove it and let ctxd create it",
			ErrSocketDir, dir, perm, dir)
	}
	return nil
}
