// Package testwatch names the tests still running shortly before a test
// binary's -test.timeout would end it. Go's own timeout panic prints every
// goroutine, which for a package of whole daemons runs to thousands of
// lines; a CI log that keeps only its tail then loses the line that says
// which test hung. Watch prints the whole dump first and a brief of the
// running tests (their names and where in this repository they wait)
// last, and ends the binary itself.
package testwatch

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"
)

// maxMargin is how long before the binary's timeout the brief is printed
// (a tenth of a shorter timeout): long enough to print it before Go's own
// panic.
const maxMargin = 45 * time.Second

// Watch starts the watch for the binary's -test.timeout (flags must be
// parsed). It returns a stop function for TestMain to call after m.Run;
// before must print anything else worth keeping in the tail (a digest of
// failures), and may be nil. A binary without a timeout is not watched.
func Watch(before func()) (stop func()) {
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() {}
	}
	timeout, err := time.ParseDuration(f.Value.String())
	if err != nil || timeout <= 0 {
		return func() {}
	}
	margin := min(maxMargin, timeout/10)
	t := time.AfterFunc(timeout-margin, func() {
		buf := make([]byte, 64<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "\ntestwatch: %v of the %v timeout have passed; every goroutine:\n\n", timeout-margin, timeout)
		os.Stderr.Write(buf)
		if before != nil {
			before()
		}
		fmt.Fprintf(os.Stderr, "\ntestwatch: the test binary is about to time out (-test.timeout %v); still running:\n", timeout)
		Brief(os.Stderr, string(buf), ModulePrefix())
		os.Exit(2)
	})
	return func() { t.Stop() }
}

// ModulePrefix is the import path prefix of this repository's code.
func ModulePrefix() string { return "github.com/ctxd/ctxd/" }

var (
	goroutineHead = regexp.MustCompile(`^goroutine (\d+) \[([^\]]*)\]:`)
	testFunc      = regexp.MustCompile(`\.(Test[A-Za-z0-9_]*|Benchmark[A-Za-z0-9_]*)(\.func[0-9.]+)?\(`)
)

// Brief writes, for each goroutine of a dump that runs inside a test
// function, the test's name, the goroutine's state, and the dump's frames
// in this repository (prefix), innermost first, at most eight.
func Brief(w io.Writer, dump, prefix string) {
	type g struct {
		id, state, test string
		frames          []string
	}
	var gs []g
	var cur *g
	sc := bufio.NewScanner(strings.NewReader(dump))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var fn string
	for sc.Scan() {
		line := sc.Text()
		if m := goroutineHead.FindStringSubmatch(line); m != nil {
			gs = append(gs, g{id: m[1], state: m[2]})
			cur = &gs[len(gs)-1]
			continue
		}
		if cur == nil || line == "" {
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			fn = line
			if strings.HasPrefix(fn, prefix) && cur.test == "" {
				if m := testFunc.FindStringSubmatch(fn); m != nil {
					cur.test = m[1]
				}
			}
			continue
		}
		if strings.HasPrefix(fn, prefix) && !strings.HasPrefix(fn, "created by") && len(cur.frames) < 8 {
			name := fn
			if i := strings.LastIndex(name, "("); i > 0 {
				name = name[:i] // the arguments
			}
			file := strings.TrimSpace(line)
			if i := strings.LastIndex(file, " +0x"); i >= 0 {
				file = file[:i]
			}
			cur.frames = append(cur.frames, strings.TrimPrefix(name, prefix)+" at "+short(file))
		}
	}
	var running []g
	for _, x := range gs {
		if x.test != "" {
			running = append(running, x)
		}
	}
	sort.SliceStable(running, func(i, j int) bool { return running[i].test < running[j].test })
	if len(running) == 0 {
		fmt.Fprintln(w, "  (no goroutine is inside a test function)")
		return
	}
	for _, x := range running {
		fmt.Fprintf(w, "  %s (goroutine %s, %s)\n", x.test, x.id, x.state)
		for _, f := range x.frames {
			fmt.Fprintf(w, "      %s\n", f)
		}
	}
}

// short keeps a file path's last two elements and its line.
func short(file string) string {
	parts := strings.Split(file, "/")
	if len(parts) > 2 {
		parts = parts[len(parts)-2:]
	}
	return strings.Join(parts, "/")
}
