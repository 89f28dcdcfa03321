package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sigilDaemon answers GET /v1/sigil on a Unix socket: 401 unless the
// request carries the token "good".
func sigilDaemon(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctxd-mcp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error": "Authorization: the token matches no sigil (wrong, or revoked)", "kind": "unauthorized"}`))
			return
		}
		_, _ = w.Write([]byte(`{"name": "coder", "scopes": ["ask"], "authenticated": true}`))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestMCPCommand(t *testing.T) {
	dir := t.TempDir()
	sock := sigilDaemon(t)
	cases := []struct {
		name   string
		args   []string
		env    string // $CTXD_TOKEN
		stderr string
	}{
		{"without daemon", []string{"mcp", "--socket", filepath.Join(dir, "s.sock")}, "", "cannot reach the daemon"},
		{"with an argument", []string{"mcp", "--socket", sock, "serve"}, "", `unexpected argument "serve"`},
		{"with a bad flag", []string{"mcp", "--sigil", "x"}, "", "flag provided but not defined: -sigil"},
		{"with a wrong token", []string{"mcp", "--socket", sock, "--token", "bad"}, "", "matches no sigil"},
		{"with a wrong token from the environment", []string{"mcp", "--socket", sock}, "bad", "matches no sigil"},
		{"the flag's token over the environment's", []string{"mcp", "--socket", sock, "--token", "bad"}, "good", "matches no sigil"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CTXD_TOKEN", c.env)
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			if code == 0 || out.Len() != 0 || !strings.Contains(errb.String(), c.stderr) {
				t.Errorf("code %d stdout %q stderr %q; want a failure, nothing on stdout, stderr with %q", code, out.String(), errb.String(), c.stderr)
			}
		})
	}
}
