package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/httpapi"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// The recorded statuses in testdata are `ctxd status --json` of real
// daemons on the demo model: status-ready.json ready with two slots, two
// sessions and a refused reload; status-starting.json waiting for an
// external backend that is down; status-personas.json on llama-server
// with three personas over two trained models under a budget that holds
// two, one of them evacuated.
var statusCases = []struct {
	name string
	want []string // besides the golden file: what a person must be told
}{
	{"status-ready", []string{
		"ready", "ollama", "model ctxd-demo", "num_ctx 4096 × 2 slots", "RAG: retrieval:",
		"0: idle, warm for session b (2831 tokens held)", "1: idle, empty",
		"0 waiting for a slot", "sessions     2", "2824 cached (99.8%)", "2831 of 4096 tokens, 64 kept for the answer: identity 56 · codex 2638",
		"VRAM low · GPU none", "default (admin, ask,", "trust        no sigil has a token",
		"log level    info", "REFUSED, the previous configuration stays in force: reload: config: c.toml: unknown key limits.bogus_key",
	}},
	{"status-personas", []string{
		"personas     688.2 MiB planned of a 700.0 MiB memory budget",
		"coder: resident · 246.8 MiB planned (num_ctx 4096 × 1 slot) · server holds 216.5 MiB (-12%) · evacuated once, restored once · default",
		"reviewer: evacuated · 246.8 MiB planned (num_ctx 4096 × 1 slot) · on disk: 1 slot, 2494 tokens, 54.9 MiB · evacuated once",
		"writer: resident · 441.4 MiB planned",
	}},
	{"status-starting", []string{"starting: backend not ready: ollama: version: ollama is not reachable", "external · model ctxd-demo", "log level    info"}},
}

// TestStatusOverview renders recorded statuses: the golden files in
// testdata (go test ./cmd/ctxd -run TestStatusOverview -update rewrites
// them), and what each must say.
func TestStatusOverview(t *testing.T) {
	for _, c := range statusCases {
		t.Run(c.name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", c.name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var st httpapi.Status
			if err := json.Unmarshal(raw, &st); err != nil {
				t.Fatal(err)
			}
			got := formatStatus(st)
			golden := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("overview of %s:\n%s\nwant (%s):\n%s", c.name, got, golden, want)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("overview lacks %q:\n%s", w, got)
				}
			}
			if strings.Contains(got, "{") {
				t.Errorf("overview shows JSON:\n%s", got)
			}
		})
	}
}

// TestStatusCommand: `ctxd status` asks the daemon's socket and prints the
// overview; --json prints the daemon's JSON byte for byte.
func TestStatusCommand(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "status-ready.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "ctxd-s-") // short: a socket path is at most ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "ctxd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() { srv.Close(); <-served }()

	var out, errb bytes.Buffer
	if code := run([]string{"status", "--socket", sock, "--json"}, &out, &errb); code != 0 || !bytes.Equal(out.Bytes(), raw) {
		t.Errorf("status --json: exit %d, stderr %q; stdout is the daemon's JSON: %v", code, errb.String(), bytes.Equal(out.Bytes(), raw))
	}
	out.Reset()
	if code := run([]string{"status", "--socket", sock}, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "ctxd ") || !strings.Contains(out.String(), "num_ctx 4096 × 2 slots") {
		t.Errorf("status: exit %d, stderr %q, stdout:\n%s", code, errb.String(), out.String())
	}
	out.Reset()
	if code := run([]string{"status", "--socket", sock, "extra"}, &out, &errb); code != 1 || !strings.Contains(errb.String(), `unexpected argument "extra"`) {
		t.Errorf("status with an argument: exit %d, stderr %q", code, errb.String())
	}
}
