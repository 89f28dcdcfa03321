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
// left by a crash); a live socket or a non-socket is an error.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("daemon: socket dir: %w", err)
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
	// there is no moment at which others could connect.
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("daemon: listen: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("daemon: chmod socket: %w", err)
	}
	return ln, nil
}
