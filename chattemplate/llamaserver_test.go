package chattemplate

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/runcontext"
)

// TestSameAsLlamaServersJinja renders a conversation with ctxd and asks
// llama.cpp's server to render the same messages with the model's own
// Jinja template (POST /apply-template): code nobody here wrote, reading
// the template from the GGUF. The prompts are the same.
func TestSameAsLlamaServersJinja(t *testing.T) {
	llamaservertest.Binary(t)
	for _, tc := range []struct{ name, ollama string }{
		{modelgen.TemplateChatML, "chatml"}, {modelgen.TemplateLlama3, "llama3-instruct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := modelgen.DefaultConfig()
			mc.Template = tc.name
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := modelgen.WriteFile(path, mc); err != nil {
				t.Fatal(err)
			}
			base := llamaservertest.Start(t, path, "-c", "2048", "-np", "1")
			text, stop, special := ollamaTemplate(t, tc.name, tc.ollama)
			f, err := New(text, stop, special)
			if err != nil {
				t.Fatal(err)
			}
			turns := []runcontext.Turn{{Query: "What is a.go?", Answer: " A file.\n"}, {Query: "And b.go?", Answer: "Another one."}}
			for n := 1; n <= len(turns); n++ { // a conversation, then one turn longer
				applyTemplate(t, base, f, conversation("What is next?", turns[:n]...))
			}
		})
	}
}

// applyTemplate renders rc with ctxd and with llama-server's Jinja, and
// compares them.
func applyTemplate(t *testing.T, base string, f *Format, rc *runcontext.RunContext) {
	t.Helper()
	r, err := f.Render(rc)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"messages": f.Messages(rc)})
	resp, err := http.Post(base+"/apply-template", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Prompt string `json:"prompt"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("apply-template: %d %v", resp.StatusCode, err)
	}
	// The Jinja writes the BOS token's text; Ollama's runner adds BOS
	// as a token instead, so ctxd's text starts after it.
	jinja := strings.TrimPrefix(out.Prompt, "<s>")
	if jinja != r.Prompt() {
		t.Errorf("llama-server's Jinja rendering differs from ctxd's:\nctxd:  %q\njinja: %q", r.Prompt(), jinja)
	}
}
