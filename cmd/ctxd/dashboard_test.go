package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
)

// TestDashboardCommand: `ctxd dashboard` asks the daemon for a token as
// the sigil named and prints the address that opens the page: the
// dashboard listener's, else the TCP listener's (loopback for one on
// every interface); with neither it says how to get one.
func TestDashboardCommand(t *testing.T) {
	t.Setenv("DISPLAY", "")
	t.Setenv("WAYLAND_DISPLAY", "")
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var answer ctxd.DashboardToken
	var asked string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = r.Method + " " + r.URL.String()
		a := answer
		a.Sigil = r.URL.Query().Get("sigil")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for _, c := range []struct {
		name           string
		dashboard, tcp string
		code           int
		stdout, stderr string
	}{
		{"dashboard listener", "127.0.0.1:7480", "127.0.0.1:11435", 0, "http://127.0.0.1:7480/t/ctxd-dash-x/dashboard/\n", `as sigil "ops"`},
		{"tcp listener", "", "127.0.0.1:11435", 0, "http://127.0.0.1:11435/t/ctxd-dash-x/dashboard/\n", "expires"},
		{"every interface", "", "0.0.0.0:11435", 0, "http://127.0.0.1:11435/t/ctxd-dash-x/dashboard/\n", ""},
		{"every interface, v6", "", "[::]:11435", 0, "http://[::1]:11435/t/ctxd-dash-x/dashboard/\n", ""},
		{"socket only", "", "", 1, "", "daemon.dashboard_listen"},
	} {
		answer = ctxd.DashboardToken{Token: "ctxd-dash-x", Path: "/t/ctxd-dash-x/dashboard/", Dashboard: c.dashboard, TCP: c.tcp}
		var out, errOut bytes.Buffer
		code := run([]string{"dashboard", "--socket", sock, "--sigil", "ops"}, &out, &errOut)
		if code != c.code || out.String() != c.stdout || !strings.Contains(errOut.String(), c.stderr) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.name, code, out.String(), errOut.String(), c.code, c.stdout, c.stderr)
		}
		if asked != "POST /v1/dashboard/token?sigil=ops" {
			t.Errorf("%s: asked %q", c.name, asked)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"dashboard", "--socket", filepath.Join(t.TempDir(), "none.sock")}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "cannot reach the daemon") {
		t.Errorf("without a daemon: exit %d, %q", code, errOut.String())
	}
	if code := run([]string{"dashboard", "extra"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), `unexpected argument "extra"`) {
		t.Errorf("with an argument: exit %d, %q", code, errOut.String())
	}
}
