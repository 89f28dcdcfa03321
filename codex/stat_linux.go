package codex

import (
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
)

// statOf is what the stat index keeps of a file's metadata.
func statOf(info fs.FileInfo) fileStat {
	st := fileStat{Size: info.Size(), MtimeNs: info.ModTime().UnixNano()}
	if s, ok := info.Sys().(*syscall.Stat_t); ok {
		st.CtimeNs = s.Ctim.Sec*1e9 + s.Ctim.Nsec
		st.Ino, st.Dev = s.Ino, uint64(s.Dev)
	}
	return st
}

// openRegular opens a file the walk found, for reading. It does not wait
// and does not follow a symbolic link in the last element (the walk
// resolved those): a file swapped after the walk for a named pipe, a
// device or a link to one is refused with a *notRegularError, never
// waited on.
func openRegular(path string) (*os.File, error) {
	var fd int
	for {
		var err error
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.ELOOP {
			return nil, &notRegularError{mode: fs.ModeSymlink}
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, &notRegularError{mode: modeOf(st.Mode)}
	}
	// A regular file ignores O_NONBLOCK; cleared, the descriptor is an
	// ordinary blocking one to package os.
	if err := syscall.SetNonblock(fd, false); err != nil {
		syscall.Close(fd)
		return nil, &fs.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// modeOf is the type bits of a raw stat mode.
func modeOf(m uint32) fs.FileMode {
	switch m & syscall.S_IFMT {
	case syscall.S_IFIFO:
		return fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		return fs.ModeSocket
	case syscall.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		return fs.ModeDevice
	case syscall.S_IFDIR:
		return fs.ModeDir
	case syscall.S_IFLNK:
		return fs.ModeSymlink
	}
	return fs.ModeIrregular
}

// readDir lists a directory the walk found, sorted by name, without
// following a symbolic link in the last element (the walk resolved
// those): a directory swapped since for a link out of the codex is
// refused, not listed.
func readDir(path string) ([]fs.DirEntry, error) {
	var fd int
	for {
		var err error
		fd, err = syscall.Open(path, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		if err == nil {
			break
		}
		if err != syscall.EINTR {
			return nil, &fs.PathError{Op: "open", Path: path, Err: err}
		}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}
