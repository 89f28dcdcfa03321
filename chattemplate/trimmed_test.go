package chattemplate

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd/internal/realmodel"
)

// TestGemma3TemplateTrimmed: Gemma 3's chat template, as Ollama's index
// maps it, renders a newline after the generation prompt that the
// answered turn does not have, so its turns do not extend one another;
// without the newline its file ends with, they do, and the prompt is the
// same but for that newline.
func TestGemma3TemplateTrimmed(t *testing.T) {
	jinja, err := realmodel.OllamaTemplate("gemma3-instruct")
	if err != nil {
		t.Fatal(err)
	}
	whole, err := FromJinja(jinja, nil)
	if err != nil {
		t.Fatal(err)
	}
	trimmed, err := FromJinjaTrimmed(jinja, nil)
	if err != nil {
		t.Fatal(err)
	}
	if whole.Check().AppendOnly {
		t.Errorf("Ollama's gemma3-instruct reported append-only: %+v (has Ollama's template changed?)", whole.Check())
	}
	if c := trimmed.Check(); !c.AppendOnly {
		t.Errorf("trimmed: %+v", c)
	}
	rc := probe()
	a, err := whole.Render(rc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := trimmed.Render(rc)
	if err != nil {
		t.Fatal(err)
	}
	if a.Prompt() != b.Prompt()+"\n" || !strings.HasSuffix(b.Prompt(), "<start_of_turn>model\n") {
		t.Errorf("whole %q\ntrimmed %q", a.Prompt()[max(0, len(a.Prompt())-60):], b.Prompt()[max(0, len(b.Prompt())-60):])
	}
}
