package httpapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// capServer serves a handler that answers "ok" (after reading any body)
// on a Unix socket through serveCapped with a cap of n connections. The
// channel receives once each time the server has recorded a connection as
// idle (after the listener saw it), so a test can order idle times.
func capServer(t *testing.T, n int) (string, <-chan struct{}) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			connAuthenticated(r) // as the daemon's authentication does, before the body
			_, _ = io.Copy(io.Discard, r.Body)
			fmt.Fprint(w, "ok")
		}),
		ReadHeaderTimeout: time.Minute, IdleTimeout: time.Hour, // never what frees a place here
	}
	idle := make(chan struct{}, 64)
	srv.ConnState = func(_ net.Conn, s http.ConnState) { // runs after the listener's own record
		if s == http.StateIdle {
			select {
			case idle <- struct{}{}:
			default:
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- serveCapped(srv, ln, n, 0) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return sock, idle
}

// get sends GET / on conn and reads the answer.
func get(t *testing.T, conn net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Fatalf("answer %q", b)
	}
}

func dialUnix(t *testing.T, sock string) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closed is whether the server has closed conn (a read ends with EOF
// rather than waiting).
func closed(conn net.Conn) bool {
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, err := conn.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || err != nil && strings.Contains(err.Error(), "reset")
}

// askAsync sends GET / on a new connection and reports the answer's error.
func askAsync(sock string) <-chan error { return getAsync(sock, "/") }

// getAsync sends GET path on a new connection and reports the answer's
// error (a status other than 200 is one).
func getAsync(sock, path string) <-chan error {
	res := make(chan error, 1)
	go func() {
		tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		resp, err := (&http.Client{Transport: tr, Timeout: time.Minute}).Get("http://x" + path)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
			}
		}
		res <- err
	}()
	return res
}

// TestCapClosesTheLongestIdleConnection: with the cap held by connections
// kept alive between requests, a new connection is served at once, and
// the longest-idle connection is the one closed to make room.
func TestCapClosesTheLongestIdleConnection(t *testing.T) {
	t.Parallel()
	const n = 4
	sock, idle := capServer(t, n)
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = dialUnix(t, sock)
		get(t, conns[i], bufio.NewReader(conns[i]))
		// The client has its answer before the server records the
		// connection idle; wait for that record, so idle times follow
		// the order of the connections.
		select {
		case <-idle:
		case <-time.After(30 * time.Second):
			t.Fatalf("the server never recorded connection %d idle", i)
		}
	}
	select {
	case err := <-askAsync(sock):
		if err != nil {
			t.Fatalf("a new connection at the cap: %v", err)
		}
	case <-time.After(30 * time.Second): // a guard: without eviction it waits for the hour-long idle timeout
		t.Fatal("a new connection at the cap was not served while idle connections held every place")
	}
	if !closed(conns[0]) {
		t.Error("the longest-idle connection was not the one closed")
	}
	for i, c := range conns[1:] {
		if closed(c) {
			t.Errorf("idle connection %d closed too: one was enough", i+1)
		}
	}
}

// TestCapKeepsRequestsInProgress: connections whose requests are in
// progress (a body still coming) are never closed to make room; a new
// connection gets a spare place, where health is answered at once and
// any other request waits until one of them ends.
func TestCapKeepsRequestsInProgress(t *testing.T) {
	t.Parallel()
	const n = 4
	sock, _ := capServer(t, n)
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = dialUnix(t, sock)
		fmt.Fprint(conns[i], "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{")
	}
	time.Sleep(2 * newConnGrace) // every one past the grace: only its state protects it
	// A new connection takes a spare place past the cap, where health is
	// answered at once.
	if err := <-getAsync(sock, "/v1/health"); err != nil {
		t.Errorf("health on a spare place: %v", err)
	}
	// Spare places taken by connections whose headers never end are
	// given to new ones: health is still answered.
	var spares []net.Conn
	for range spareConns {
		c := dialUnix(t, sock)
		fmt.Fprint(c, "GET /v1/health HTTP/1.1\r\nHost: x\r\n") // headers that do not end
		spares = append(spares, c)
	}
	defer func() {
		for _, c := range spares {
			c.Close()
		}
	}()
	time.Sleep(2 * unauthGrace)
	if err := <-getAsync(sock, "/v1/health"); err != nil {
		t.Errorf("health with every spare place taken by headers that never end: %v", err)
	}
	// Any other request waits for a place of its own.
	res := askAsync(sock)
	select {
	case err := <-res:
		t.Fatalf("a new connection was answered (%v) while every place held a request in progress", err)
	case <-time.After(time.Second):
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			t.Errorf("connection %d with its body on the way was closed: %v", i, err)
		}
	}
	fmt.Fprint(conns[0], "}") // its request ends: the connection goes idle, and may go
	if err := <-res; err != nil {
		t.Fatalf("the waiting request once a request ended: %v", err)
	}
}

// TestCapClosesSilentNewConnections: connections that connect and send
// nothing hold no place past the grace period when another arrives.
func TestCapClosesSilentNewConnections(t *testing.T) {
	t.Parallel()
	const n = 4
	sock, _ := capServer(t, n)
	for range n {
		dialUnix(t, sock)
	}
	if err := <-askAsync(sock); err != nil {
		t.Fatalf("a new connection while silent ones held every place: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
