package orchestrator

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/formatters/toolmanifest"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
)

// TestClientTools: by default a request that offers tools its sigil may
// not offer is refused, naming them, before anything is recorded; left
// out by configuration, the client's tools the sigil's scopes allow are
// offered in the sigil block, the others are not and the summary says so;
// an answer that calls an offered tool is a tool call, recorded in its
// canonical text so that the client's echo of it extends the session; a
// call to a tool that was not offered is refused and stays text.
func TestClientTools(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	tools := []ctxd.Tool{
		{Name: "grep", Description: "Search the files.", Parameters: json.RawMessage(`{"type": "object", "properties": {"pattern": {"type": "string"}}}`)},
		{Name: "shell", Description: "Run a command."},
	}
	_, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "where is Listen?", Sigil: "tooler", Tools: tools, History: []ctxd.Turn{}}, noop)
	if ctxd.KindOf(err) != ctxd.KindForbidden || !strings.Contains(err.Error(), "tools shell") || !strings.Contains(err.Error(), "disallowed_tools") {
		t.Fatalf("a tool the sigil may not offer: %v; want a refusal that names it and the setting", err)
	}
	if s, _ := h.store.Session(t.Context(), "t"); s.Count != 0 || len(h.backend.Requests()) != 0 {
		t.Fatalf("the refused request left a session of %d turns, %d backend requests", s.Count, len(h.backend.Requests()))
	}
	h.o.cfg.LeaveOutTools = true
	h.backend.SetAnswer(`  {"name": "grep", "arguments": {"pattern": "Listen"}} `)
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "where is Listen?", Sigil: "tooler", Tools: tools, History: []ctxd.Turn{}}, noop)
	if err != nil {
		t.Fatal(err)
	}
	p := h.lastPrompt()
	if !strings.Contains(p, "- grep: Search the files.\n  parameters: {\"properties\":{\"pattern\":{\"type\":\"string\"}},\"type\":\"object\"}\n") || strings.Contains(p, "shell") {
		t.Errorf("sigil block offers the wrong tools:\n%s", p)
	}
	if len(sum.ToolCalls) != 1 || sum.ToolCalls[0].Name != "grep" || string(sum.ToolCalls[0].Arguments) != `{"pattern":"Listen"}` {
		t.Errorf("tool calls %+v", sum.ToolCalls)
	}
	if len(sum.ToolsRefused) != 1 || sum.ToolsRefused[0] != "shell" || !strings.Contains(sum.ToolNote, "tool:NAME") {
		t.Errorf("refused %v note %q", sum.ToolsRefused, sum.ToolNote)
	}
	s, _ := h.store.Session(t.Context(), "t"+ctxd.SessionScope+"tooler") // ids are per sigil
	if got := s.Turns[0].Answer; got != `{"name":"grep","arguments":{"pattern":"Listen"}}` {
		t.Errorf("recorded answer %q", got)
	}

	// The client sends the call back with the tool's result: the session
	// extends, it does not start over.
	h.backend.SetAnswer(`{"name": "shell", "arguments": {"cmd": "rm -rf /"}}`)
	history := []ctxd.Turn{{Query: "where is Listen?", Answer: `{"name":"grep","arguments":{"pattern":"Listen"}}`}}
	sum, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "[tool result grep]\ndaemon.go:12", Sigil: "tooler", Tools: tools, History: history}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if sum.PrefixNote != "" || sum.PrefixBreak != nil || sum.Epoch != 0 {
		t.Errorf("the echo of the tool call did not extend the session: note %q break %+v", sum.PrefixNote, sum.PrefixBreak)
	}
	if len(sum.ToolCalls) != 0 || !strings.Contains(sum.ToolNote, "the answer called shell") {
		t.Errorf("a call to a tool not offered: calls %+v note %q", sum.ToolCalls, sum.ToolNote)
	}
	// A sigil without tool scopes offers none, and the model's JSON is text.
	h.backend.SetAnswer(`{"name": "grep", "arguments": {}}`)
	sum, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "u", Query: "q", Tools: tools}, noop)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.ToolCalls) != 0 || len(sum.ToolsRefused) != 2 || strings.Contains(h.lastPrompt(), "client tools") {
		t.Errorf("default sigil: calls %+v refused %v", sum.ToolCalls, sum.ToolsRefused)
	}
}

// The client's tools render the same whatever their order and the key
// order of their parameters: a client that lists them from a map keeps
// its prefix.
func TestClientToolsRenderInOneOrder(t *testing.T) {
	sigil := runcontext.Sigil{Name: "s", Scopes: []string{"ask", "tools"}}
	a := []ctxd.Tool{
		{Name: "read", Parameters: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"}}}`)},
		{Name: "grep", Parameters: json.RawMessage(`{"properties":{"q":{"type":"string"}}, "type":"object"}`)},
	}
	b := []ctxd.Tool{
		{Name: "grep", Parameters: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}}}`)},
		{Name: "read", Parameters: json.RawMessage(`{"properties":{"path":{"type":"string"}},"type":"object"}`)},
	}
	x, _ := clientTools(sigil, a)
	y, _ := clientTools(sigil, b)
	if !slices.Equal(x, y) || x[0].Name != "grep" {
		t.Errorf("%+v\n%+v", x, y)
	}
}

// TestTemplateOffersClientTools: with a chat template that offers tools
// ahead of the conversation and writes calls in <tool_call> tags, the
// client's tools are offered by the template (not ctxd's manifest), an
// answer in the template's syntax is a tool call, and the next turn, with
// the client's echo of it, renders the call as the template writes it and
// extends the prompt.
func TestTemplateOffersClientTools(t *testing.T) {
	h := newTest(t, governor.Limits{NumCtx: 100000, AnswerReserve: 64}, 1)
	text, err := os.ReadFile("../chattemplate/testdata/hermes-tools.gotmpl")
	if err != nil {
		t.Fatal(err)
	}
	f, err := chattemplate.New(string(text), []string{"<|im_end|>"}, runcontext.Specials{"<|im_start|>", "<|im_end|>"})
	if err != nil || !f.OffersTools() {
		t.Fatalf("the test template: %v, offers tools %v", err, f != nil && f.OffersTools())
	}
	h.o.cfg.Format = f
	if syn := h.o.ToolSyntax(); syn.Open != "<tool_call>" {
		t.Fatalf("the orchestrator reads calls in %+v", syn)
	}
	tools := []ctxd.Tool{{Name: "grep", Description: "Search the files.", Parameters: json.RawMessage(`{"type": "object", "properties": {"pattern": {"type": "string"}}}`)}}
	h.backend.SetAnswer("<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\": \"Listen\"}}\n</tool_call>")
	sum, err := h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "where is Listen?", Sigil: "tooler", Tools: tools, History: []ctxd.Turn{}}, noop)
	if err != nil {
		t.Fatal(err)
	}
	p := h.lastPrompt()
	if !strings.Contains(p, "<tools>\n{\"name\":\"grep\",\"description\":\"Search the files.\"") || strings.Contains(p, toolmanifest.Protocol) {
		t.Errorf("the template does not offer the tools, or ctxd's manifest does too:\n%s", p)
	}
	if len(sum.ToolCalls) != 1 || sum.ToolCalls[0].Name != "grep" || string(sum.ToolCalls[0].Arguments) != `{"pattern":"Listen"}` {
		t.Fatalf("the answer in the template's syntax is not a call: %+v (note %q)", sum.ToolCalls, sum.ToolNote)
	}
	h.backend.SetAnswer("It is in daemon.go.")
	history := []ctxd.Turn{{Query: "where is Listen?", Answer: `{"name":"grep","arguments":{"pattern":"Listen"}}`}}
	sum, err = h.o.Ask(t.Context(), ctxd.AskRequest{Session: "t", Query: "[tool result grep]\ndaemon.go:12", Sigil: "tooler", Tools: tools, History: history}, noop)
	if err != nil {
		t.Fatal(err)
	}
	next := h.lastPrompt()
	if sum.PrefixNote != "" || sum.PrefixBreak != nil || !strings.HasPrefix(next, p) {
		t.Errorf("the echo of the call did not extend the prompt: note %q break %+v", sum.PrefixNote, sum.PrefixBreak)
	}
	if !strings.Contains(next, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"pattern\":\"Listen\"}}\n</tool_call><|im_end|>") {
		t.Errorf("the earlier call is not rendered as the template writes calls:\n%s", next[len(p)-40:])
	}
}
