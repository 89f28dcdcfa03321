package logtest

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// Lines is an io.Writer for a text log handler: it keeps the log line by
// line and also sends each line to the test's log.
type Lines struct {
	t     testing.TB
	mu    sync.Mutex // guards lines
	lines []string
}

// NewLines returns an empty log that also writes to t's log.
func NewLines(t testing.TB) *Lines { return &Lines{t: t} }

func (l *Lines) Write(p []byte) (int, error) {
	s := strings.TrimRight(string(p), "\n")
	l.t.Log(s)
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	return len(p), nil
}

// Find is the first line holding every one of subs, without its time
// (a text handler's leading time=...).
func (l *Lines) Find(subs ...string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			if _, rest, ok := strings.Cut(line, " level="); ok && strings.HasPrefix(line, "time=") {
				line = "level=" + rest
			}
			return line, true
		}
	}
	return "", false
}

// Wait waits up to within for a line holding every one of subs and
// returns it; the test fails if none comes.
func (l *Lines) Wait(t testing.TB, within time.Duration, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if line, ok := l.Find(subs...); ok {
			return line
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q within %v", subs, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
