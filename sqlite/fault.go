package sqlite

import (
	"errors"
	"fmt"
	"path/filepath"
	"syscall"
	"time"

	msqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// idleClose is how long each of the store's connections (the writer and
// the readers), and the database files with it, stay open with nothing to
// do. Files held open for ever would hide a state directory made
// read-only, moved or replaced (the kernel checks permissions when a file
// is opened, and will not remount a file system read-only under an open
// writer): closed when idle, the store meets such a fault at the next
// request, names it, and uses the directory again once it is fixed, with
// no restart. Reopening costs about a millisecond.
const idleClose = 10 * time.Second

// fault explains err when the disk or the file system under the store
// failed it (full, read-only, gone, an I/O error) rather than ctxd: a
// cause the client and the log should read as such, and one that passes
// when the disk does. Any other error (and nil) is returned as it is.
func (s *Store) fault(err error) error {
	var se *msqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	var what string
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL:
	case sqlite3.SQLITE_READONLY:
		what = "could not be written"
	case sqlite3.SQLITE_CANTOPEN:
		what = "could not be opened"
	case sqlite3.SQLITE_IOERR:
		what = "met an I/O error"
	default:
		return err
	}
	// A full disk fails SQLite in several ways (growing the write-ahead
	// log's index is an I/O error): the file system says which it is.
	var fs syscall.Statfs_t
	if what == "" || syscall.Statfs(filepath.Dir(s.path), &fs) == nil && fs.Bavail == 0 {
		return fmt.Errorf("the session store %s could not be written: the disk holding it is full (free space there; ctxd writes again at once, with no restart): %w", s.path, err)
	}
	return fmt.Errorf("the session store %s %s: %s (once that is fixed ctxd uses it again, with no restart): %w", s.path, what, s.whyNotWritable(), err)
}

// whyNotWritable says what keeps the store's directory or file from being
// written, as far as the system tells.
func (s *Store) whyNotWritable() string {
	const wOK = 2 // access(2)'s W_OK
	for _, p := range []struct{ path, name string }{{filepath.Dir(s.path), "its directory"}, {s.path, "its file"}} {
		switch err := syscall.Access(p.path, wOK); {
		case errors.Is(err, syscall.EROFS):
			return fmt.Sprintf("%s %s is on a read-only file system", p.name, p.path)
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
			return fmt.Sprintf("%s %s is not writable by ctxd's user", p.name, p.path)
		case errors.Is(err, syscall.ENOENT):
			return fmt.Sprintf("%s %s is gone", p.name, p.path)
		case err != nil:
			return fmt.Sprintf("%s %s: %v", p.name, p.path, err)
		}
	}
	return "the disk or the file system failed it"
}
