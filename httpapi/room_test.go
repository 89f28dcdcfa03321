package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/socktest"
)

// TestAClientsLongPromptShrinksTheCodex: an agent whose system prompt and
// tools do not fit beside a codex loaded whole is answered, not refused:
// the codex gives way (it switches to retrieval, under what the client
// leaves), and the client's text is sent whole.
func TestAClientsLongPromptShrinksTheCodex(t *testing.T) {
	dir := t.TempDir()
	for i := range 4 {
		var sb strings.Builder
		for j := 0; sb.Len() < 600; j++ {
			fmt.Fprintf(&sb, "// Handler%d_%d serves kind %d.\nfunc Handler%d_%d() error { return nil }\n\n", i, j, j, i, j)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("h%d.go", i)), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f := newFixture(t, fixtureOptions{numCtx: 5000, config: func(c *config.Config) {
		c.Codex.Path = dir
		c.Sigils["agent"] = config.Sigil{Scopes: []string{"ask", "tools"}}
	}})
	if mode := f.eng.Orch.Limits(); mode.NumCtx != 5000 {
		t.Fatalf("window %d", mode.NumCtx)
	}
	system := strings.Repeat("Follow the project's rules closely. ", 60) // 2,160 bytes: tokens with the byte tokenizer
	tools := `[{"type":"function","function":{"name":"read","description":"` + strings.Repeat("Read a file. ", 40) + `","parameters":{"type":"object"}}}]`
	body := `{"model":"fake","stream":false,"tools":` + tools + `,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"Where is Handler2_3?"}]}`
	status, out := socktest.DoHeader(t, f.cfg.Daemon.Socket, "POST", "/v1/chat/completions", http.Header{"X-Ctxd-Sigil": {"agent"}, "Content-Type": {"application/json"}}, body)
	var c struct {
		Ctxd ctxd.Summary
	}
	if err := json.Unmarshal([]byte(out), &c); err != nil || status != 200 {
		t.Fatalf("the agent's request: %d %s", status, out)
	}
	if c.Ctxd.Mode != "rag" || c.Ctxd.Codex.ClientRoom == 0 || !strings.Contains(c.Ctxd.Codex.Reason, "clients' own prompts") {
		t.Errorf("the codex did not give way: mode %s, plan %+v", c.Ctxd.Mode, c.Ctxd.Codex)
	}
	if p := f.backend.Prompts(); !strings.Contains(p[len(p)-1], strings.TrimSpace(system)) {
		t.Error("the client's system text is not whole in the prompt")
	}
	// A client whose own prompt cannot fit whatever ctxd gives up: refused,
	// saying what to change.
	huge := strings.Repeat("Follow the project's rules closely. ", 160)
	body = `{"model":"fake","stream":false,"messages":[{"role":"system","content":"` + huge + `"},{"role":"user","content":"Where is Handler2_3?"}]}`
	status, out = socktest.DoHeader(t, f.cfg.Daemon.Socket, "POST", "/v1/chat/completions", http.Header{"X-Ctxd-Sigil": {"agent"}, "Content-Type": {"application/json"}}, body)
	if status != 400 || !strings.Contains(out, "context_length_exceeded") || !strings.Contains(out, "shorter system prompt") || !strings.Contains(out, "bigger window") {
		t.Errorf("a client prompt over the window: %d %s", status, out)
	}
}
