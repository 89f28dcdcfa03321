//go:build !linux

package codex

import (
	"io/fs"
	"os"
	"slices"
	"strings"
)

// statOf is what the stat index keeps of a file's metadata: size and
// modification time only on this system.
func statOf(info fs.FileInfo) fileStat {
	return fileStat{Size: info.Size(), MtimeNs: info.ModTime().UnixNano()}
}

// escapeError is an open refused because the path leads out of the tree.
type escapeError struct{ rel string }

func (e *escapeError) Error() string {
	return "a path element is now a symbolic link or leads out of the codex (not followed)"
}

// treeRoot is a codex root: on this system files are opened through
// os.Root, which keeps every open beneath it (following links only where
// they stay inside).
type treeRoot struct {
	r    *os.Root
	path string
}

// identity is not read on this system: allowed directories are checked
// by path.
func identity(string) (dev, ino uint64) { return 0, 0 }

func openTreeRoot(real string, within []AllowedDir, only string) (*treeRoot, error) {
	if len(within) > 0 {
		ok := false
		for _, w := range within {
			if w.allows(real, only) {
				ok = true
				break
			}
		}
		if !ok {
			return nil, &OutsideError{Path: real, Roots: within}
		}
	}
	r, err := os.OpenRoot(real)
	if err != nil {
		return nil, err
	}
	return &treeRoot{r: r, path: real}, nil
}

// openRegular opens file rel of the tree for reading, refusing with a
// *notRegularError what is not a regular file. On this system the check
// follows the open: a named pipe swapped in may still block it. links is
// 1: the link count is not checked here.
func openRegular(root *treeRoot, rel string) (*os.File, uint64, error) {
	info, err := root.r.Lstat(rel)
	if err != nil {
		return nil, 0, err
	}
	if !info.Mode().IsRegular() {
		return nil, 0, &notRegularError{mode: info.Mode()}
	}
	f, err := root.r.Open(rel)
	if err != nil {
		if strings.Contains(err.Error(), "escapes") {
			return nil, 0, &escapeError{rel: rel}
		}
		return nil, 0, err
	}
	if info, err = f.Stat(); err != nil || !info.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, 0, err
		}
		return nil, 0, &notRegularError{mode: info.Mode()}
	}
	return f, 1, nil
}

// readDir lists directory rel of the tree, sorted by name.
func readDir(root *treeRoot, rel string) ([]fs.DirEntry, error) {
	if rel == "" {
		rel = "."
	}
	f, err := root.r.Open(rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}
