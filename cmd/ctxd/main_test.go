package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestCommands(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("XDG_STATE_HOME", filepath.Join(dir, "state")) // systemd-units makes the service's state directory
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"no args", nil, 2, "", "Usage"},
		{"unknown", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"version", []string{"version"}, 0, "ctxd", ""},
		{"genmodel without out", []string{"genmodel"}, 1, "", "--out is required"},
		{"genmodel bad vocab", []string{"genmodel", "--out", filepath.Join(dir, "m.gguf"), "--vocab", "x"}, 1, "", "vocab"},
		{"genmodel", []string{"genmodel", "--out", filepath.Join(dir, "m.gguf"), "--vocab-size", "512"}, 0, "wrote", ""},
		{"ask without question", []string{"ask", "--socket", filepath.Join(dir, "s.sock")}, 1, "", "give a question"},
		{"ask without daemon", []string{"ask", "--socket", filepath.Join(dir, "s.sock"), "hi"}, 1, "", "cannot reach the daemon"},
		{"serve with bad config", []string{"serve", "--config", filepath.Join(dir, "missing.toml")}, 1, "", "missing.toml"},
		{"serve with a bad window", []string{"serve", "--num-ctx", "-5", "--socket", filepath.Join(dir, "s.sock")}, 1, "", "backend.num_ctx"},
		{"serve with an argument", []string{"serve", "extra"}, 1, "", `unexpected argument "extra"`},
		{"units", []string{"systemd-units", filepath.Join(dir, "units")}, 0, "ctxd.socket", ""},
		{"units with a missing config", []string{"systemd-units", "--config", filepath.Join(dir, "missing.toml"), filepath.Join(dir, "u2")}, 1, "", "missing.toml"},
		{"units without a directory", []string{"systemd-units"}, 1, "", "give the directory"},
		{"prompt with an argument", []string{"prompt", "--socket", filepath.Join(dir, "s.sock"), "s1"}, 1, "", `unexpected argument "s1"`},
		{"prompt without daemon", []string{"prompt", "--socket", filepath.Join(dir, "s.sock")}, 1, "", "cannot reach the daemon"},
		{"codex without subcommand", []string{"codex"}, 1, "", "load PATH, or stats"},
		{"codex unknown", []string{"codex", "frob"}, 1, "", `unknown subcommand "frob"`},
		{"codex bench usage", []string{"codex", "bench", dir}, 1, "", "--gguf"},
		{"codex load without daemon", []string{"codex", "load", "--socket", filepath.Join(dir, "s.sock"), dir}, 1, "", "cannot reach the daemon"},
		{"codex stats without daemon", []string{"codex", "stats", "--socket", filepath.Join(dir, "s.sock")}, 1, "", "cannot reach the daemon"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(c.args, &out, &errb)
			if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errb.String(), c.stderr) {
				t.Errorf("code %d stdout %q stderr %q; want code %d, stdout with %q, stderr with %q",
					code, out.String(), errb.String(), c.code, c.stdout, c.stderr)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "units", "ctxd.service")); err != nil {
		t.Errorf("unit not written: %v", err)
	}
}

func TestSchemaCommand(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"schema"}, &out, &bytes.Buffer{}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var v map[string]any
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["$defs"] == nil {
		t.Errorf("schema output is not a JSON Schema: %v", err)
	}
}

// TestTheDaemonLinksNoBenchmarkHarness: the benchmark harness and its
// plotting library are ctxd-bench's, not the daemon's binary's.
func TestTheDaemonLinksNoBenchmarkHarness(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is needed to list the binary's packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/ctxd/ctxd/bench" || strings.HasPrefix(pkg, "gonum.org/") {
			t.Errorf("ctxd links %s", pkg)
		}
	}
}

// TestSessionsAndPromptActAsTheAgent: `ctxd sessions` and `ctxd prompt`
// reach an agent's door sessions: with its token (--token or
// $CTXD_TOKEN) or, on the socket, its sigil's name (--sigil or
// $CTXD_SIGIL).
func TestSessionsAndPromptActAsTheAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.Path+" auth="+r.Header.Get("Authorization")+" sigil="+r.Header.Get("X-Ctxd-Sigil"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/prompt") {
			fmt.Fprint(w, `{"prompt":"the prompt"}`)
			return
		}
		fmt.Fprint(w, `[]`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"sessions", "--token", "ctxd_x"}, nil, "/v1/sessions auth=Bearer ctxd_x sigil="},
		{[]string{"sessions", "--sigil", "agent"}, nil, "/v1/sessions auth= sigil=agent"},
		{[]string{"sessions"}, []string{"CTXD_TOKEN", "ctxd_env"}, "/v1/sessions auth=Bearer ctxd_env sigil="},
		{[]string{"prompt", "--session", "oai-1", "--token", "ctxd_y"}, nil, "/v1/sessions/oai-1/prompt auth=Bearer ctxd_y sigil="},
		{[]string{"prompt", "--session", "oai-1", "--json"}, []string{"CTXD_SIGIL", "agent"}, "/v1/sessions/oai-1/prompt auth= sigil=agent"},
	} {
		t.Setenv("CTXD_TOKEN", "")
		t.Setenv("CTXD_SIGIL", "")
		if c.env != nil {
			t.Setenv(c.env[0], c.env[1])
		}
		var out, errOut bytes.Buffer
		if code := run(append(c.args, "--socket", sock), &out, &errOut); code != 0 {
			t.Errorf("%q: exit %d: %s", c.args, code, errOut.String())
			continue
		}
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if last != c.want {
			t.Errorf("%q: the daemon saw %q; want %q", c.args, last, c.want)
		}
	}
}
