package pgtest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// The kernel sends a child its parent-death signal (Pdeathsig) when the
// thread that started it ends, not the process; the Go runtime may end a
// thread while the test binary runs on. So every program the harness
// runs is started from one thread that never ends: forker's.
var forker struct {
	once sync.Once
	reqs chan startReq
}

type startReq struct {
	cmd  *exec.Cmd
	done chan error
}

// start starts cmd from the forker's thread. That goroutine, locked to its
// thread for good, lives as long as the test binary.
func start(cmd *exec.Cmd) error {
	forker.once.Do(func() {
		forker.reqs = make(chan startReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must not end
			for r := range forker.reqs {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	forker.reqs <- startReq{cmd, done}
	return <-done
}

// run starts cmd (start) and waits for it, returning its combined output.
func run(cmd *exec.Cmd) ([]byte, error) {
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := start(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	return []byte(out.String()), err
}

// ownerFile, in a cluster's directory, holds the pid of the test binary
// that made it.
const ownerFile = "owner.pid"

// dirPrefix begins the name of every cluster's directory under /tmp.
const dirPrefix = "ctxd-pg-"

// sweepOnce removes, once per test binary, the directories that clusters
// of dead test binaries left (one killed at a timeout had no time to
// remove its own; its postgres ended with it).
var sweepOnce sync.Once

func sweep() {
	dirs, _ := filepath.Glob(filepath.Join("/tmp", dirPrefix+"*"))
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // being made, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || alive(pid) || postmasterAlive(dir) {
			continue
		}
		os.RemoveAll(dir)
	}
}

// alive reports whether a process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// postmasterAlive reports whether the postmaster of the cluster in dir
// still runs (its data/postmaster.pid names a live process).
func postmasterAlive(dir string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	return err == nil && alive(pid)
}
