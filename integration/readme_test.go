package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readmeBlock is the sh block between the README's markers.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "<!-- "+name+":begin")
	j := strings.Index(s, "<!-- "+name+":end -->")
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s block", name)
	}
	block := s[i:j]
	start := strings.Index(block, "```sh\n")
	end := strings.LastIndex(block, "```")
	if start < 0 || end <= start {
		t.Fatalf("README.md's %s block has no sh code", name)
	}
	return block[start+len("```sh\n") : end]
}

// TestReadmeDoors runs the README's commands for pointing agents at ctxd,
// as written, against a real daemon with the TCP listener on: only the
// address and the token the reader would paste are this daemon's.
func TestReadmeDoors(t *testing.T) {
	needOllama(t)
	needNode(t)
	if _, err := os.Stat(filepath.Join("..", "bin", "ollama")); err != nil {
		t.Skipf("the README runs bin/ollama, which `make ollama` builds: %v", err)
	}
	_, base, tok := doorsDaemon(t)
	block := readmeBlock(t, "doors")
	if !strings.Contains(block, "http://127.0.0.1:11435") || !strings.Contains(block, "CTXD_TOKEN=ctxd_...") {
		t.Fatalf("the block no longer sets the address and token this test replaces:\n%s", block)
	}
	block = strings.Replace(block, "http://127.0.0.1:11435", base, 1)
	block = strings.Replace(block, "CTXD_TOKEN=ctxd_...", "CTXD_TOKEN="+tok, 1)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", block)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	t.Logf("README block output:\n%s", out)
	if err != nil {
		t.Fatalf("the README's commands failed: %v", err)
	}
	got := string(out)
	for _, want := range []string{`"object":"chat.completion"`, `"cached_tokens"`, `"done":true`, `"ignored":["options.num_ctx"]`} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %s", want)
		}
	}
	// The agent's second question reuses the first exchange.
	m := regexp.MustCompile(`\[turn 2: (\d+) prompt tokens, (\d+) cached`).FindStringSubmatch(got)
	if m == nil {
		t.Fatal("the agent printed no second turn")
	}
	prompt, _ := strconv.Atoi(m[1])
	cached, _ := strconv.Atoi(m[2])
	if float64(cached) < 0.9*float64(prompt) {
		t.Errorf("the agent's second turn reused %d of %d tokens", cached, prompt)
	}
}
