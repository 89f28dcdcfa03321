//go:build !linux

package codex

import "io/fs"

// statOf is what the stat index keeps of a file's metadata: size and
// modification time only on this system.
func statOf(info fs.FileInfo) fileStat {
	return fileStat{Size: info.Size(), MtimeNs: info.ModTime().UnixNano()}
}
