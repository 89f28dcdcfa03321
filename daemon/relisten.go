package daemon

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// socketCheckInterval is how often the daemon checks that its socket's
// file is still where clients look for it.
const socketCheckInterval = time.Second

// keepSocket watches the socket ln listens on. A socket whose file is
// removed while the daemon serves (a tmp cleaner, `rm -r` of its
// directory) still serves the connections it has, but no client can
// reach it any more. A socket Listen made is then made again, at the same
// path and with the same checks, and served on from then on; one passed
// in (systemd's socket activation) is systemd's to re-create, and the log
// says so. Other listeners (TCP, an abstract socket) are returned as they
// are. Closing the listener returned stops the watch.
func (d *Daemon) keepSocket(ln net.Listener) net.Listener {
	var path string
	own := false
	switch l := ln.(type) {
	case *ownSocket:
		path, own = l.path, true
	case *net.UnixListener:
		path = l.Addr().String()
	default:
		return ln
	}
	if path == "" || path[0] == '@' {
		return ln // an abstract or unnamed socket has no file to lose
	}
	log := d.log.With("component", "socket")
	if !own {
		log.Info("the socket was passed in (systemd socket activation): systemd owns it, and ctxd does not re-create it if its file is removed", "socket", path)
	}
	r := &relistener{path: path, relisten: own, log: log, cur: ln, ino: inode(path),
		stop: make(chan struct{}), done: make(chan struct{})}
	go r.watch(socketCheckInterval)
	return r
}

// relistener serves on the socket at path, replacing its listener by a
// new one on the same path when the socket's file is gone (relisten), or
// only logging that it is gone (a socket it did not create).
type relistener struct {
	path     string
	relisten bool
	log      *slog.Logger

	mu     sync.Mutex // guards cur, ino and closed
	cur    net.Listener
	ino    uint64 // the socket file's inode: another file at path is not this socket
	closed bool

	stop chan struct{} // closed by Close: the watch ends
	done chan struct{} // closed when the watch has ended
}

// Accept accepts on the current listener; when the watch replaced it, the
// old one's error is not the caller's, and Accept goes on with the new.
func (r *relistener) Accept() (net.Conn, error) {
	for {
		r.mu.Lock()
		ln := r.cur
		r.mu.Unlock()
		c, err := ln.Accept()
		if err == nil {
			return c, nil
		}
		r.mu.Lock()
		replaced := r.cur != ln && !r.closed
		r.mu.Unlock()
		if !replaced {
			return nil, err
		}
	}
}

// Close stops the watch and closes the current listener (which removes
// its socket file). Closing again does nothing.
func (r *relistener) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	ln := r.cur
	r.mu.Unlock()
	close(r.stop)
	<-r.done
	return ln.Close()
}

func (r *relistener) Addr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur.Addr()
}

// watch checks the socket's file every interval until Close.
func (r *relistener) watch(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	reported := "" // the problem last logged: one that lasts is logged once
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.mu.Lock()
		ino := r.ino
		r.mu.Unlock()
		why := r.gone(ino)
		if why == "" {
			reported = ""
			continue
		}
		r.keepPath() // whatever is at the path now is not this listener's to remove
		if !r.relisten {
			if reported == "" {
				r.log.Error("socket lost: clients cannot connect; it was passed in by systemd, which owns it and must re-create it (systemctl --user restart ctxd.socket ctxd)",
					"socket", r.path, "why", why)
				reported = why
			}
			continue
		}
		if reported == "" {
			r.log.Error("socket lost: clients cannot connect until it is re-created", "socket", r.path, "why", why)
			reported = why
		}
		ln, err := Listen(r.path)
		if err != nil {
			if msg := err.Error(); msg != reported {
				r.log.Error("socket lost: cannot listen on it again yet; retrying", "socket", r.path, "err", err)
				reported = msg
			}
			continue
		}
		if !r.swap(ln) {
			ln.Close()
			return
		}
		r.log.Info("socket re-created: listening again", "socket", r.path)
		reported = ""
	}
}

// keepPath stops the current listener from removing the file at its path
// when it closes: its own file is gone, and another process's socket may
// stand there now.
func (r *relistener) keepPath() {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch l := r.cur.(type) {
	case *ownSocket:
		l.SetUnlinkOnClose(false)
	case *net.UnixListener:
		l.SetUnlinkOnClose(false)
	}
}

// gone says why clients cannot reach the socket at its path any more (""
// when they can, or when it cannot tell).
func (r *relistener) gone(ino uint64) string {
	info, err := os.Lstat(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		if _, derr := os.Stat(filepath.Dir(r.path)); errors.Is(derr, fs.ErrNotExist) {
			return "its directory " + filepath.Dir(r.path) + " was removed"
		}
		return "its file was removed"
	case err != nil:
		return ""
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && ino != 0 && uint64(st.Ino) != ino {
		return "another file took its place"
	}
	return ""
}

// swap makes ln the listener Accept serves, and closes the old one
// without removing the path (the new socket's now); false if the
// relistener was closed meanwhile.
func (r *relistener) swap(ln net.Listener) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	old := r.cur
	r.cur, r.ino = ln, inode(r.path)
	if o, ok := old.(*ownSocket); ok {
		o.SetUnlinkOnClose(false)
	}
	old.Close() // its Accept returns, and Accept goes on with ln
	return true
}

// inode is the inode of the file at path; 0 if there is none.
func inode(path string) uint64 {
	info, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
