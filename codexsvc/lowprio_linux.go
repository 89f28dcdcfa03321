package codexsvc

import (
	"runtime"
	"syscall"
)

// lowPriority puts the calling goroutine on a thread of its own at the
// lowest CPU priority (nice 19). The goroutine must end without unlocking:
// the thread then ends with it instead of returning to the pool niced.
func lowPriority() {
	runtime.LockOSThread()
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19)
}
