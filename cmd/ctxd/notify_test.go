package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeStatus is a daemon's status as the test sets it; wedge makes
// StatusLine hang until unwedge (or its context ends).
type fakeStatus struct {
	mu     sync.Mutex
	line   string
	err    error
	wedged chan struct{} // nil: answers at once
}

func (f *fakeStatus) set(line string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.line, f.err = line, err
}

func (f *fakeStatus) wedge() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wedged = make(chan struct{})
}

func (f *fakeStatus) unwedge() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.wedged)
	f.wedged = nil
}

func (f *fakeStatus) StatusLine(ctx context.Context) (string, error) {
	f.mu.Lock()
	w := f.wedged
	f.mu.Unlock()
	if w != nil {
		select {
		case <-w:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.line, f.err
}

// notifySocket listens where systemd would (NOTIFY_SOCKET) and returns
// the notifications as they arrive, one datagram each.
func notifySocket(t *testing.T) <-chan string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctxd-n-") // short: a socket path is at most ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	msgs := make(chan string, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return msgs
}

// next returns the next notification that satisfies want, and every one
// that arrived before it.
func next(t *testing.T, msgs <-chan string, want func(string) bool, what string) (string, []string) {
	t.Helper()
	var before []string
	for {
		select {
		case m := <-msgs:
			if want(m) {
				return m, before
			}
			before = append(before, m)
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s within 30s; got %q", what, before)
		}
	}
}

func is(state string) func(string) bool { return func(m string) bool { return m == state } }

// TestNotifierTellsSystemdHowTheDaemonIs runs the notifier against a real
// notify socket with systemd's watchdog on: STATUS= as the daemon's line
// changes, WATCHDOG=1 only while it answers, READY=1, and STOPPING=1.
func TestNotifierTellsSystemdHowTheDaemonIs(t *testing.T) {
	msgs := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000") // 0.2 s: a reading every 0.1 s
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	src := &fakeStatus{line: "starting: bringing the backend up"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n := notifySystemd(ctx, src, slog.New(slog.DiscardHandler))
	defer n.stop()
	if n.watchdog != 200*time.Millisecond || n.every != 100*time.Millisecond {
		t.Fatalf("watchdog %v, reading every %v; want 200ms and 100ms", n.watchdog, n.every)
	}

	next(t, msgs, is("STATUS=starting: bringing the backend up"), "starting status")
	next(t, msgs, is("WATCHDOG=1"), "watchdog ping while starting")

	src.set("ready · fake 1 slot", nil)
	n.ready()
	// The status may change on a reading before READY=1 is sent.
	seen := map[string]bool{}
	next(t, msgs, func(m string) bool {
		seen[m] = true
		return seen["READY=1"] && seen["STATUS=ready · fake 1 slot"]
	}, "READY=1 and the ready status")

	// A daemon that stops answering is not vouched for until it answers.
	src.wedge()
	_, _ = next(t, msgs, func(m string) bool { return strings.HasPrefix(m, "STATUS=not answering") }, "not-answering status")
	// Pings from readings that ended before the wedge may still be on
	// their way; none comes after the status says it is not answering.
	_, before := next(t, msgs, func(m string) bool {
		return strings.HasPrefix(m, "STATUS=not answering") && m != "STATUS=not answering: its status has not answered for 0s"
	}, "a later not-answering status")
	for _, m := range before {
		if m == "WATCHDOG=1" {
			t.Errorf("a watchdog ping while the daemon did not answer: %q", before)
		}
	}
	src.unwedge()
	next(t, msgs, is("WATCHDOG=1"), "watchdog ping once the daemon answers again")

	// A status that fails is no ping either, and says why.
	src.set("", errors.New("status answered 500"))
	next(t, msgs, is("STATUS=not answering: status answered 500"), "failed status")
	src.set("ready · fake 1 slot", nil)
	next(t, msgs, is("STATUS=ready · fake 1 slot"), "ready status again")

	cancel()
	next(t, msgs, is("STOPPING=1\nSTATUS=stopping"), "STOPPING=1")
	n.stop()
}

// TestNotifierOutsideSystemdSaysNothing: without NOTIFY_SOCKET the
// notifier starts nothing, and ready and stop are harmless.
func TestNotifierOutsideSystemdSaysNothing(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := notifySystemd(t.Context(), &fakeStatus{}, slog.New(slog.DiscardHandler))
	n.ready()
	n.stop()
	if n.watchdog != 0 {
		t.Errorf("watchdog %v outside systemd", n.watchdog)
	}
}
