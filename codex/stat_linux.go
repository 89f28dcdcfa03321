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
