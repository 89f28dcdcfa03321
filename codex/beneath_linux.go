package codex

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// noOpenat2 is set once openat2 is found missing (a kernel before 5.6, or
// a sandbox that refuses it): opens then walk element by element.
var noOpenat2 atomic.Bool

// openBeneath opens rel (slash-separated, relative to dir) beneath the
// directory dir without following a symbolic link in any of its elements
// and without ever leaving dir: a directory swapped for a link after the
// walk listed it, a link in the last element, or ".." out of dir is
// refused (*escapeError), never followed. flags are open(2)'s.
func openBeneath(dir *os.File, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	defer runtime.KeepAlive(dir)
	dfd := int(dir.Fd())
	if !noOpenat2.Load() {
		how := unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		}
		for range 100 {
			fd, err := unix.Openat2(dfd, rel, &how)
			switch err {
			case nil:
				return fd, nil
			case unix.EINTR, unix.EAGAIN: // EAGAIN: a rename raced the lookup
				continue
			case unix.ENOSYS:
				noOpenat2.Store(true)
				return openEachElement(dfd, rel, flags)
			}
			return -1, beneathError(rel, err)
		}
		return -1, beneathError(rel, unix.EAGAIN)
	}
	return openEachElement(dfd, rel, flags)
}

// openEachElement is openBeneath without openat2: each element is opened
// relative to its parent's descriptor with O_NOFOLLOW, so no element can
// be a link, and ".." is refused.
func openEachElement(dfd int, rel string, flags int) (int, error) {
	parts := strings.Split(rel, "/")
	if slices.Contains(parts, "..") {
		return -1, beneathError(rel, unix.EXDEV)
	}
	cur := dfd
	for i, name := range parts {
		last := i == len(parts)-1
		fl := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			fl = flags | unix.O_NOFOLLOW | unix.O_CLOEXEC
		}
		var fd int
		var err error
		for {
			if fd, err = unix.Openat(cur, name, fl, 0); err != unix.EINTR {
				break
			}
		}
		if cur != dfd {
			unix.Close(cur)
		}
		if err != nil {
			if err == unix.ENOTDIR && !last {
				// An element that should be a directory is a link (O_NOFOLLOW
				// with O_DIRECTORY) or a file.
				err = unix.ELOOP
			}
			return -1, beneathError(rel, err)
		}
		cur = fd
	}
	return cur, nil
}

// escapeError is an open refused because the path, as it is now, leads
// through a symbolic link or out of the tree: it changed since the walk
// (or it is hostile).
type escapeError struct{ rel string }

func (e *escapeError) Error() string {
	return "a path element is now a symbolic link or leads out of the codex (not followed)"
}

// beneathError is the error of an open of rel beneath a directory.
func beneathError(rel string, err error) error {
	switch err {
	case unix.ELOOP, unix.EXDEV:
		return &escapeError{rel: rel}
	}
	return &fs.PathError{Op: "open", Path: rel, Err: err}
}

// treeRoot is a codex root held open: every directory and file of the
// tree is opened relative to it (openBeneath), so a tree whose path is
// swapped for another after it was opened is not read.
type treeRoot struct {
	f    *os.File
	path string // where it was found (resolved), for messages and reports
}

// openTreeRoot opens the directory real (absolute, resolved); only names
// the one file of a one-file codex ("" for a tree). With within, it must
// lie beneath one of those directories, and is opened
// beneath the one it lies in, relative to its descriptor: a path element
// swapped for a link since the path was resolved is refused.
func openTreeRoot(real string, within []AllowedDir, only string) (*treeRoot, error) {
	var fd int
	var err error
	if len(within) == 0 {
		for {
			if fd, err = unix.Open(real, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != unix.EINTR {
				break
			}
		}
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: real, Err: err}
		}
	} else if fd, err = openWithin(real, within, only); err != nil {
		return nil, err
	}
	return &treeRoot{f: os.NewFile(uintptr(fd), real), path: real}, nil
}

// openWithin opens the directory real beneath the first of the allowed
// directories it is inside, by that directory's descriptor, once that
// descriptor is proven to be the directory allowed (by identity).
func openWithin(real string, within []AllowedDir, only string) (int, error) {
	why := ""
	for _, w := range within {
		if !w.allows(real, only) {
			continue
		}
		wf, err := os.Open(w.Path)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(wf.Fd()), &st); err != nil || w.ino != 0 && (uint64(st.Dev) != w.dev || st.Ino != w.ino) {
			wf.Close()
			why = "the allowed directory " + w.Path + " was replaced since it was allowed"
			continue
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(real, w.Path), "/")
		fd, err := openBeneath(wf, rel, unix.O_RDONLY|unix.O_DIRECTORY)
		wf.Close()
		if err != nil {
			var esc *escapeError
			if errors.As(err, &esc) {
				return -1, &OutsideError{Path: real, Roots: within, Why: "a directory on its way was swapped for a symbolic link"}
			}
			return -1, fmt.Errorf("open %s: %w", real, err)
		}
		return fd, nil
	}
	return -1, &OutsideError{Path: real, Roots: within, Why: why}
}

// identity is a path's device and inode; zeros if it cannot be read.
func identity(path string) (dev, ino uint64) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0, 0
	}
	return uint64(st.Dev), st.Ino
}

// openRegular opens file rel of the tree for reading. It does not wait
// and follows no symbolic link: a file swapped after the walk for a named
// pipe, a device or a link is refused with a *notRegularError, and one
// whose directories were swapped for links with an *escapeError. links
// is the file's link count.
func openRegular(root *treeRoot, rel string) (f *os.File, links uint64, err error) {
	fd, err := openBeneath(root.f, rel, syscall.O_RDONLY|syscall.O_NONBLOCK)
	if err != nil {
		var esc *escapeError
		if errors.As(err, &esc) && !strings.Contains(rel, "/") {
			return nil, 0, &notRegularError{mode: fs.ModeSymlink}
		}
		return nil, 0, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, 0, &fs.PathError{Op: "fstat", Path: rel, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, 0, &notRegularError{mode: modeOf(st.Mode)}
	}
	// A regular file ignores O_NONBLOCK; cleared, the descriptor is an
	// ordinary blocking one to package os.
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, 0, &fs.PathError{Op: "fcntl", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), rel), uint64(st.Nlink), nil
}

// readDir lists directory rel of the tree, sorted by name, opened beneath
// the root without following links: a directory swapped since the walk
// found it for a link out of the codex is refused, not listed.
func readDir(root *treeRoot, rel string) ([]fs.DirEntry, error) {
	fd, err := openBeneath(root.f, rel, syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	// Named by its full path: a listing's Info (an lstat, for the walk's
	// sizes and types) goes by the directory's name; what is read is
	// opened beneath the root again.
	f := os.NewFile(uintptr(fd), filepath.Join(root.path, rel))
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}
