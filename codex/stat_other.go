//go:build !linux

package codex

import (
	"io/fs"
	"os"
)

// statOf is what the stat index keeps of a file's metadata: size and
// modification time only on this system.
func statOf(info fs.FileInfo) fileStat {
	return fileStat{Size: info.Size(), MtimeNs: info.ModTime().UnixNano()}
}

// openRegular opens a file the walk found, for reading, refusing with a
// *notRegularError what is not a regular file. On this system the check
// precedes the open: a file swapped for a named pipe between the two may
// still block the open (Linux opens without waiting and checks after).
func openRegular(path string) (*os.File, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, &notRegularError{mode: info.Mode()}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if info, err = f.Stat(); err != nil || !info.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, err
		}
		return nil, &notRegularError{mode: info.Mode()}
	}
	return f, nil
}

// readDir lists a directory, sorted by name.
func readDir(path string) ([]fs.DirEntry, error) { return os.ReadDir(path) }
