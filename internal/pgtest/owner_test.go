package pgtest

import (
	"os"
	"syscall"
)

// owner is the uid that owns the file fi describes (-1 if unknown).
func owner(fi os.FileInfo) int {
	if fi == nil {
		return -1
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return -1
	}
	return int(st.Uid)
}
