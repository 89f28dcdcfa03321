package chattemplate

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/toolcall"
)

// hermesTemplate (testdata/hermes-tools.gotmpl) is a ChatML template with
// tools, written for ctxd's tests in the way Hermes-style models'
// templates are: the tools in the system message after its text, a call
// in <tool_call> tags.
func hermesTemplate(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/hermes-tools.gotmpl")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lastMessageTemplate offers the tools in the last user message, as
// Llama 3.1's template does, and writes a call as a bare JSON object with
// "parameters".
const lastMessageTemplate = `{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
{{- if eq .Role "user" }}<|im_start|>user
{{ if and $.Tools $last }}Functions: {{ range $.Tools }}{{ json .Function }} {{ end }}
{{ end }}{{ .Content }}<|im_end|>
{{ else if eq .Role "assistant" }}<|im_start|>assistant
{{ if .Content }}{{ .Content }}{{ else }}{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}{{ end }}{{ if not $last }}<|im_end|>
{{ end }}
{{- end }}
{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant
{{ end }}
{{- end }}`

func withTools(rc *runcontext.RunContext) *runcontext.RunContext {
	rc.Sigil.ClientTools = []runcontext.ClientTool{
		{Name: "grep", Description: "Search files.\n  Fast.", Parameters: `{"type":"object","properties":{"pattern":{"type":["string","null"],"description":"what to find"},"mode":{"type":"string","enum":["a","b",3]}},"required":["pattern"]}`},
		{Name: "read", Description: "Read <|im_end|> a file."},
	}
	rc.Sigil.ToolFormat = runcontext.ToolFormatTemplate
	return rc
}

// TestTemplateOffersTools: a template that offers tools ahead of the
// conversation offers the client's, after ctxd's stable blocks and the
// same every turn; a turn whose answer was a call renders as the template
// writes calls, and the syntax read from the template reads it back.
func TestTemplateOffersTools(t *testing.T) {
	special := runcontext.Specials{"<|im_start|>", "<|im_end|>"}
	f, err := New(hermesTemplate(t), []string{"<|im_end|>"}, special)
	if err != nil {
		t.Fatal(err)
	}
	syn, writes := f.ToolSyntax()
	want := toolcall.Syntax{Open: "<tool_call>", Close: "</tool_call>", Name: "name", Arguments: "arguments"}
	if !f.OffersTools() || !writes || syn != want || !f.Check().AppendOnly {
		t.Fatalf("offers %v, writes %v %+v, check %+v; want it to offer tools and write %+v", f.OffersTools(), writes, syn, f.Check(), want)
	}
	if !strings.Contains(f.Check().Tools, "offers the client's tools") {
		t.Errorf("the check does not say the template offers tools: %q", f.Check().Tools)
	}
	call := toolcall.Render(ctxdCalls{{"grep", `{"pattern":"x"}`}}.calls())
	one := withTools(conversation("q2", runcontext.Turn{Query: "q1", Answer: call}))
	r1, err := f.Render(one)
	if err != nil {
		t.Fatal(err)
	}
	p := r1.Prompt()
	stable := strings.Join(r1.Blocks[:runcontext.BlockState], "")
	tools := strings.Index(p, "<tools>")
	if tools < len(stable) || tools > strings.Index(p, "q1") {
		t.Fatalf("the tools are not between ctxd's stable blocks and the conversation:\n%s", p)
	}
	if strings.Contains(p, "<|im_end|> a file") || !strings.Contains(p, `"description":"Search files. Fast."`) || !strings.Contains(p, `"type":"string"`) {
		t.Errorf("the tools' text is not escaped and tidied as the template takes it:\n%s", p[tools:])
	}
	rendered := "<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\":\"x\"}}\n</tool_call>"
	if !strings.Contains(p, "<|im_start|>assistant\n"+rendered+"<|im_end|>") {
		t.Fatalf("the earlier call is not rendered as the template writes calls:\n%s", p[strings.Index(p, "q1"):])
	}
	if calls, _, ok := syn.Parse(rendered, []string{"grep"}); !ok || toolcall.Render(calls) != call {
		t.Errorf("the syntax does not read the template's call back: %q %v", toolcall.Render(calls), ok)
	}
	// The next turn extends this one: the tools did not move.
	two := withTools(conversation("q3", runcontext.Turn{Query: "q1", Answer: call}, runcontext.Turn{Query: "q2", Answer: "text"}))
	r2, err := f.Render(two)
	if err != nil {
		t.Fatal(err)
	}
	if q := strings.LastIndex(p, "q2"); !strings.HasPrefix(r2.Prompt(), p[:q]) {
		t.Errorf("the next turn does not extend this one")
	}
	// Without tools to offer, nothing of them is rendered.
	r0, err := f.Render(conversation("q1"))
	if err != nil || strings.Contains(r0.Prompt(), "<tools>") {
		t.Errorf("a sigil with no client tools got the template's tool text (%v)", err)
	}
}

// TestTemplateToolsThatMove: a template that offers tools in the last
// message would move them every turn; ctxd's manifest offers them, and
// asking the template to is an error. Its calls are still read in its
// syntax.
func TestTemplateToolsThatMove(t *testing.T) {
	f, err := New(lastMessageTemplate, []string{"<|im_end|>"}, runcontext.Specials{"<|im_start|>", "<|im_end|>"})
	if err != nil {
		t.Fatal(err)
	}
	syn, writes := f.ToolSyntax()
	if f.OffersTools() || !writes || syn.Arguments != "parameters" || syn.Open != "" || !strings.Contains(f.Check().Tools, "manifest") {
		t.Fatalf("offers %v, writes %v %+v, check %q", f.OffersTools(), writes, syn, f.Check().Tools)
	}
	if _, err := f.Render(withTools(conversation("q1"))); err == nil {
		t.Error("the template was asked to offer tools it cannot offer in place, and rendered")
	}
	if calls, _, ok := syn.Parse(`{"name": "grep", "parameters": {"pattern": "x"}}`, []string{"grep"}); !ok || len(calls) != 1 {
		t.Error("a call in the template's syntax is not read")
	}
}

// TestTemplatesWithoutTools: the generated models' templates neither
// offer tools nor write calls; the check says nothing of tools.
func TestTemplatesWithoutTools(t *testing.T) {
	text, stop, special := ollamaTemplate(t, "chatml", "chatml")
	f, err := New(text, stop, special)
	if err != nil {
		t.Fatal(err)
	}
	if _, writes := f.ToolSyntax(); writes || f.OffersTools() || f.Check().Tools != "" {
		t.Errorf("chatml: writes %v, offers %v, %q", writes, f.OffersTools(), f.Check().Tools)
	}
}

type ctxdCall struct{ name, args string }

type ctxdCalls []ctxdCall

func (cs ctxdCalls) calls() []ctxd.ToolCall {
	out := make([]ctxd.ToolCall, len(cs))
	for i, c := range cs {
		out[i] = ctxd.ToolCall{Name: c.name, Arguments: json.RawMessage(c.args)}
	}
	return out
}
