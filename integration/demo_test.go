package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/realmodel"
	"github.com/ctxd/ctxd/ollama"
)

var demoWrite = flag.String("demo-write", "", "rewrite the demo exchange block of this README (make readme-demo)")

// demoModel is the trained model `make run` serves (ctxd.toml).
const demoModel = "smollm2-135m-instruct-q4_1.gguf"

// TestReadmeDemo runs `make run`'s daemon as ctxd.toml configures it —
// the managed Ollama, SmolLM2 135M Instruct, this repository as the
// codex — with only its state directory and socket the test's own, and
// the README's demo commands against it as written. The first two
// questions must get answers that read as text (a random-weight model's
// token soup does not), the second must reuse the first's prompt, and
// with -demo-write the exchange, answers and summary lines as printed, is
// written into the README.
func TestReadmeDemo(t *testing.T) {
	needOllama(t)
	root := repoRoot(t)
	model := realmodel.Path(t, demoModel)
	bin := buildCtxd(t)
	raw, err := os.ReadFile(filepath.Join(root, "ctxd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctxd.sock")
	cfg := string(raw)
	for _, r := range []struct{ old, new string }{
		{`state_dir = "var/state"`, `state_dir = "` + filepath.Join(dir, "state") + `"`},
		{`binary = "bin/ollama"`, `binary = "` + ollamatest.Binary(t) + `"`},
		{`gguf = "var/models/` + demoModel + `"`, `gguf = "` + model + `"`},
		{`path = "."`, `path = "` + root + `"`},
		{`dashboard_listen = "127.0.0.1:7480"`, `dashboard_listen = "127.0.0.1:0"`}, // a port of its own
	} {
		if !strings.Contains(cfg, r.old) {
			t.Fatalf("ctxd.toml no longer says %s, which this test relocates", r.old)
		}
		cfg = strings.Replace(cfg, r.old, r.new, 1)
	}
	cfgPath := filepath.Join(dir, "ctxd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	serveDemo(t, root, sock, bin, "serve", "--config", cfgPath)

	block := readmeBlock(t, "demo")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "bin/ctxd ask ") || !strings.HasPrefix(lines[1], "bin/ctxd ask ") {
		t.Fatalf("the demo block no longer opens with two questions:\n%s", block)
	}
	var exchange strings.Builder
	var summaries []string
	for i, l := range lines {
		stdout, stderr := runLine(t, root, sock, strings.Replace(l, "bin/ctxd", bin, 1))
		if strings.HasPrefix(l, "bin/ctxd dashboard") {
			checkDashboardAddress(t, stdout)
		}
		if i >= 2 {
			continue
		}
		answer := strings.TrimSpace(stdout)
		if why := readsAsText(answer); why != "" {
			t.Errorf("%s: the answer does not read as text (%s):\n%s", l, why, answer)
		}
		sum := strings.TrimSpace(stderr)
		summaries = append(summaries, sum)
		cmd, _, _ := strings.Cut(l, "#")
		fmt.Fprintf(&exchange, "$ %s\n%s\n%s\n", strings.TrimSpace(cmd), answer, sum)
	}
	// The second question's prompt holds the first's whole: the backend
	// reuses all of it.
	counts := regexp.MustCompile(`turn (\d+) · .* (\d+) prompt tokens, (\d+) cached`)
	m1, m2 := counts.FindStringSubmatch(summaries[0]), counts.FindStringSubmatch(summaries[1])
	if m1 == nil || m2 == nil || m1[1] != "1" || m2[1] != "2" {
		t.Fatalf("the two questions are not turns 1 and 2 of a session:\n%s\n%s", summaries[0], summaries[1])
	}
	first, _ := strconv.Atoi(m1[2])
	cached, _ := strconv.Atoi(m2[3])
	if cached < first {
		t.Errorf("the second question reused %d tokens, less than the first's whole prompt (%d)", cached, first)
	}
	t.Logf("the exchange:\n%s", exchange.String())
	if *demoWrite != "" {
		writeDemo(t, *demoWrite, exchange.String())
	}
}

// TestServeYourOwnModel: a model of the user's own, named on the command
// line as the README says — a GGUF file the managed Ollama imports (`ctxd
// serve --model NAME --gguf FILE`; make run GGUF=…), and a model an Ollama
// of the user's own already serves (`ctxd serve --backend-url URL --model
// NAME`; make run BACKEND_URL=… MODEL=…) — answers through ctxd in text,
// its turn 2 reusing all of turn 1.
func TestServeYourOwnModel(t *testing.T) {
	needOllama(t)
	root := repoRoot(t)
	model := realmodel.Path(t, demoModel)
	bin := buildCtxd(t)
	for _, how := range []string{"gguf", "ollama-name"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "ctxd.sock")
			codex := filepath.Join(dir, "codex")
			if err := os.MkdirAll(codex, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(codex, "NOTES.md"), []byte("# Notes\n\nThe release train leaves every second Tuesday.\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := fmt.Sprintf("[daemon]\nstate_dir = %q\n[backend]\nbinary = %q\n[codex]\npath = %q\n[limits]\nanswer_reserve = 96\n",
				filepath.Join(dir, "state"), ollamatest.Binary(t), codex)
			cfgPath := filepath.Join(dir, "ctxd.toml")
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"serve", "--config", cfgPath, "--model", "my-smollm2"}
			if how == "gguf" {
				args = append(args, "--gguf", model)
			} else {
				srv := ollamatest.Start(t)
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
				defer cancel()
				if err := ollama.New(srv.URL(), "my-smollm2", ollama.Options{}).Import(ctx, model); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--backend-url", (&url.URL{Scheme: "http", Host: srv.URL().Host}).String())
			}
			serveDemo(t, root, sock, bin, args...)
			firstPrompt := 0
			// The first answer is short: a trained instruct model ends it
			// at its template's end of turn, not at the reserve.
			out, _ := runLine(t, root, sock, bin+" ask --session stop --json "+strconv.Quote("When does the release train leave?"))
			var stop struct {
				DoneReason string `json:"done_reason"`
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &stop); err != nil {
				t.Fatalf("the summary: %v\n%s", err, out)
			}
			// The pinned Ollama's greedy answer ends at "Tuesday."; a newer
			// one samples on past it (measured on v0.17.4), which says
			// nothing of ctxd's stops.
			if stop.DoneReason != ctxd.DoneStop {
				if pinnedOllama(t) {
					t.Errorf("the short answer ended by %q, not at the end of its turn:\n%s", stop.DoneReason, out)
				} else {
					t.Logf("on this Ollama the short answer ran to its reserve (%s)", stop.DoneReason)
				}
			}
			for turn, q := range []string{"When does the release train leave?", "What is the release train?"} {
				out, sum := runLine(t, root, sock, bin+" ask "+strconv.Quote(q))
				if why := readsAsText(out); why != "" {
					t.Errorf("turn %d: the answer does not read as text (%s):\n%s", turn+1, why, out)
				}
				m := regexp.MustCompile(`turn (\d+) · .* (\d+) prompt tokens, (\d+) cached`).FindStringSubmatch(sum)
				if m == nil || m[1] != strconv.Itoa(turn+1) {
					t.Fatalf("turn %d: summary %s", turn+1, sum)
				}
				prompt, _ := strconv.Atoi(m[2])
				cached, _ := strconv.Atoi(m[3])
				if turn == 0 {
					firstPrompt = prompt
				} else if cached < firstPrompt {
					t.Errorf("turn 2 reused %d tokens, less than turn 1's whole prompt (%d)", cached, firstPrompt)
				}
			}
		})
	}
}

// serveDemo starts bin with args in root, its socket sock, and waits until
// `ctxd status` says it is ready; it is stopped at cleanup.
func serveDemo(t *testing.T, root, sock, bin string, args ...string) {
	t.Helper()
	var log bytes.Buffer
	cmd := exec.Command(bin, append(args, "--socket", sock)...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("ctxd serve's log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, _ := exec.Command(bin, "status", "--socket", sock).CombinedOutput()
		if strings.Contains(string(out), " · ready\n") {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("ctxd serve exited: %v\n%s", err, log.String())
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("ctxd serve not ready after 3 minutes:\n%s\n%s", out, log.String())
		}
	}
}

// runLine runs one shell line in root with the daemon's socket, as a user
// in that directory would, and returns its stdout and stderr.
func runLine(t *testing.T, root, sock, line string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", line)
	cmd.Dir, cmd.Stdout, cmd.Stderr = root, &stdout, &stderr
	// No desktop: `ctxd dashboard` prints its address and opens nothing.
	cmd.Env = append(os.Environ(), "CTXD_SOCKET="+sock, "DISPLAY=", "WAYLAND_DISPLAY=")
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", line, err, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String()
}

// functionWords are words any English answer of a few sentences uses.
var functionWords = map[string]bool{"the": true, "a": true, "an": true, "to": true, "and": true, "of": true,
	"is": true, "are": true, "you": true, "in": true, "it": true, "that": true, "this": true, "for": true,
	"can": true, "with": true, "on": true, "be": true, "as": true, "or": true, "by": true, "your": true}

// readsAsText says why s does not read as English text, or "" when it
// does: a dozen words or more, most of them plain words, among them at
// least three different function words. A random-weight model's output —
// subword pieces and punctuation from all over the vocabulary — fails it.
func readsAsText(s string) string {
	words := strings.Fields(s)
	if len(words) < 12 {
		return fmt.Sprintf("%d words", len(words))
	}
	plain, function := 0, map[string]bool{}
	for _, w := range words {
		w = strings.ToLower(strings.TrimFunc(w, func(r rune) bool { return !unicode.IsLetter(r) }))
		if w == "" {
			continue
		}
		if strings.IndexFunc(w, func(r rune) bool { return !unicode.IsLetter(r) && r != '\'' && r != '-' }) < 0 {
			plain++
		}
		if functionWords[w] {
			function[w] = true
		}
	}
	if float64(plain) < 0.6*float64(len(words)) {
		return fmt.Sprintf("%d of %d words are plain words", plain, len(words))
	}
	if len(function) < 3 {
		return fmt.Sprintf("%d different function words", len(function))
	}
	return ""
}

// writeDemo replaces the demo exchange block of the README at path.
func writeDemo(t *testing.T, path, exchange string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- demo-exchange:begin (written by `make readme-demo`) -->\n", "<!-- demo-exchange:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no demo-exchange block", path)
	}
	// Four backticks: the answers may hold fenced code of their own.
	text := fmt.Sprintf("On a %d-core CPU (`make readme-demo` asked these on %s):\n\n````text\n%s````\n",
		runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), exchange)
	s = s[:i+len(begin)] + text + s[j:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkDashboardAddress checks what `ctxd dashboard` printed: the
// dashboard listener's address with a short-lived token, which opens the
// page.
func checkDashboardAddress(t *testing.T, stdout string) {
	t.Helper()
	addr := strings.TrimSpace(stdout)
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+/t/ctxd-dash-[A-Za-z0-9_-]+/dashboard/$`).MatchString(addr) {
		t.Fatalf("ctxd dashboard printed %q, not the dashboard listener's address with a token", addr)
	}
	resp, err := http.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET the printed address: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
}
