package codex

import (
	"io/fs"
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
