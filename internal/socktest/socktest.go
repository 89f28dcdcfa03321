// Package socktest sends raw HTTP requests to a daemon's Unix socket, for
// tests that check statuses and bodies the Go client would turn into
// errors.
package socktest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
)

// Do sends method path with body (and contentType, if set) over the Unix
// socket and returns the status and the body of the answer.
func Do(tb testing.TB, socket, method, path, contentType, body string) (int, string) {
	tb.Helper()
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return DoHeader(tb, socket, method, path, h, body)
}

// DoHeader is Do with request headers.
func DoHeader(tb testing.TB, socket, method, path string, h http.Header, body string) (int, string) {
	tb.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, err := http.NewRequest(method, "http://ctxd"+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header = h.Clone()
	resp, err := hc.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Stream posts an ask (body) to /v1/ask and sends every NDJSON event it
// reads to out, until the answer ends; a failure is reported on tb.
func Stream(tb testing.TB, socket, body string, out chan<- ctxd.Event) {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		tb.Error(err)
		return
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		tb.Error(err)
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev ctxd.Event
		if err := json.Unmarshal(bytes.TrimSpace(sc.Bytes()), &ev); err != nil {
			tb.Errorf("bad event %q: %v", sc.Text(), err)
			return
		}
		out <- ev
	}
}
