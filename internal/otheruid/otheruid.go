// Package otheruid runs a test's helper as another user (uid and gid
// 65534, nobody), for tests of attacks from another local user: a socket
// or a port taken by someone else. It needs root and setpriv; Skip says
// why a test cannot run it. Tests only.
package otheruid

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// UID is the user the helper runs as.
const UID = 65534

// Available reports whether a helper can run as UID here: the process is
// root and setpriv is on PATH.
func Available() bool {
	_, err := exec.LookPath("setpriv")
	return os.Getuid() == 0 && err == nil
}

// Skip skips tb unless the process is root and setpriv is on PATH.
func Skip(tb testing.TB) {
	tb.Helper()
	if os.Getuid() != 0 {
		tb.Skip("runs a helper as another user: needs root (the in-process tests cover the rest)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		tb.Skip("runs a helper as another user: needs setpriv (util-linux)")
	}
}

// Dir is a fresh directory under /tmp that the other user may use
// (mode 0777), removed at the end of the test.
func Dir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("/tmp", "ctxd-otheruid-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// Binary is a copy of the running test binary that UID may run (the go
// tool's build directory is root's alone), in a directory of Dir.
func Binary(tb testing.TB) string {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(Dir(tb), "helper.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		tb.Fatal(err)
	}
	return bin
}

// Command runs the test binary bin (from Binary) as UID, running only the
// test named run.
func Command(bin, run string) *exec.Cmd {
	uid := strconv.Itoa(UID)
	return exec.Command("setpriv", "--reuid="+uid, "--regid="+uid, "--clear-groups", "--", bin, "-test.run=^"+run+"$", "-test.count=1")
}

// Start runs the test binary again as UID, running only the test named
// run with env set (KEY=VALUE), and waits until the helper prints ready
// on stdout. The helper is killed at the end of the test.
func Start(tb testing.TB, run, ready string, env ...string) *exec.Cmd {
	tb.Helper()
	bin := Binary(tb)
	dir := filepath.Dir(bin)
	cmd := Command(bin, run)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TMPDIR=" + dir}, env...)
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, out)
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				tb.Fatalf("the helper %s exited before it was ready", run)
			}
			if strings.Contains(l, ready) {
				go func() {
					for range lines {
					}
				}()
				return cmd
			}
		case <-deadline:
			tb.Fatalf("the helper %s was not ready within 30s", run)
		}
	}
}
