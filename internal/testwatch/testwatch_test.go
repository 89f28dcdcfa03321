package testwatch

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

const dump = `goroutine 1 [chan receive, 29 minutes]:
testing.(*T).Run(0xc000102ea0, {0x1, 0x2}, 0x3)
	/usr/lib/go/src/testing/testing.go:1751 +0x3ab
main.main()
	_testmain.go:99 +0x1

goroutine 12154 [select, 25 minutes]:
github.com/ctxd/ctxd/client.(*Client).Ask(0xc0001, {0x2})
	/check/work/main/client/client.go:120 +0x45
github.com/ctxd/ctxd/integration.askAll(0xc0002)
	/check/work/main/integration/harness_test.go:300 +0x99
github.com/ctxd/ctxd/integration.TestSomethingHangs.func2(0xc0003)
	/check/work/main/integration/hang_test.go:41 +0x77
testing.tRunner(0xc0004, 0xc0005)
	/usr/lib/go/src/testing/testing.go:1690 +0xf4
created by testing.(*T).Run in goroutine 12100
	/usr/lib/go/src/testing/testing.go:1743 +0x390

goroutine 12177 [select, 25 minutes]:
github.com/ctxd/ctxd/daemon.(*Daemon).Run(0x1, {0x2})
	/check/work/main/daemon/daemon.go:194 +0xac5
created by github.com/ctxd/ctxd/integration.startOpts in goroutine 12154
	/check/work/main/integration/harness_test.go:162 +0x629
`

func TestBriefNamesTheHungTest(t *testing.T) {
	var b strings.Builder
	Brief(&b, dump, ModulePrefix())
	got := b.String()
	for _, want := range []string{
		"TestSomethingHangs (goroutine 12154, select, 25 minutes)",
		"client.(*Client).Ask at client/client.go:120",
		"integration.askAll at integration/harness_test.go:300",
		"integration.TestSomethingHangs.func2 at integration/hang_test.go:41",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("brief lacks %q:\n%s", want, got)
		}
	}
	// The daemon's goroutine runs no test function, and the test runner's
	// own goroutine is not this repository's code.
	if strings.Contains(got, "12177") || strings.Contains(got, "goroutine 1,") {
		t.Errorf("brief names a goroutine outside the tests:\n%s", got)
	}
}

func TestBriefOfThisTest(t *testing.T) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var b strings.Builder
	Brief(&b, string(buf), ModulePrefix())
	if !strings.Contains(b.String(), "TestBriefOfThisTest (goroutine ") {
		t.Errorf("the brief of a live dump does not name the running test:\n%s", b.String())
	}
}

func TestBriefWithoutTests(t *testing.T) {
	var b strings.Builder
	Brief(&b, "goroutine 1 [running]:\nmain.main()\n\t/x/main.go:1 +0x1\n", ModulePrefix())
	if !strings.Contains(b.String(), "no goroutine is inside a test function") {
		t.Errorf("got %q", b.String())
	}
}

// TestWatchEndsTheBinary runs this test binary again with a short
// timeout and a test that outlives it: the watch must name that test in
// the output's tail and end the binary before Go's own panic.
func TestWatchEndsTheBinary(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run", "^TestWatchHelper$", "-test.timeout", "3s")
	cmd.Env = append(os.Environ(), "TESTWATCH_HELPER=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("helper ended with %v, want exit status 2:\n%s", err, out)
	}
	s := string(out)
	if strings.Contains(s, "panic: test timed out") {
		t.Errorf("Go's own timeout panic came first:\n%s", s)
	}
	i := strings.LastIndex(s, "still running:")
	if i < 0 || !strings.Contains(s[i:], "TestWatchHelper (goroutine ") || !strings.Contains(s[i:], "testwatch.TestWatchHelper at testwatch/testwatch_test.go:") {
		t.Errorf("the tail does not name the hung test:\n%s", s)
	}
	if k := strings.Index(s, "every goroutine:"); k < 0 || strings.LastIndex(s, "before ran") < k {
		t.Errorf("the before function's output does not follow the goroutine dump:\n%s", s)
	}
}

func TestWatchHelper(t *testing.T) {
	if os.Getenv("TESTWATCH_HELPER") == "" {
		t.Skip("run by TestWatchEndsTheBinary")
	}
	stop := Watch(func() { fmt.Fprintln(os.Stderr, "before ran") })
	defer stop()
	time.Sleep(30 * time.Second)
}
