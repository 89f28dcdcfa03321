package chattemplate

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	ttemplate "text/template"
	"text/template/parse"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/template"

	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/toolcall"
)

// Tools: a chat template that ranges over .Tools offers the model its
// tools in its own words, and one that ranges over a message's .ToolCalls
// writes calls in its own syntax (as Ollama reads them: the text before
// and after the call's JSON object, and the keys that hold its name and
// arguments). ctxd uses both where they keep the cache protocol:
//
//   - the syntax is read in every answer (ToolSyntax), and a turn whose
//     answer was a call renders as the template renders the assistant's
//     calls, so the model sees its earlier calls as it wrote them;
//   - the template offers the client's tools (OffersTools, and
//     runcontext.Sigil.ToolFormat) only when it places them ahead of the
//     conversation and turn n+1 still extends turn n: then they sit after
//     ctxd's stable blocks, at the start of the state, the same for every
//     turn. A template that puts them in the last user message (as
//     Llama 3.1's does) would move them every turn and re-read them with
//     the turn; for it ctxd's manifest offers them in the sigil block.
//
// The tools are given to the template as Ollama gives them (its api.Tool:
// a name, a description, and the parameters' type, required list and
// properties with their type, description and enum), their text escaped
// against the vocabulary's special tokens.

// toolSupport is what loading found about a template and tools.
type toolSupport struct {
	syntax toolcall.Syntax
	writes bool // the template writes calls: syntax is its
	offers bool // the template offers the client's tools, append-only
	// calls is the template's range over a message's .ToolCalls, alone:
	// what an assistant message of calls renders.
	calls *ttemplate.Template
}

// ToolSyntax is how the model's template writes a tool call; false when
// it writes none (ctxd's own protocol and the common shapes are read).
func (f *Format) ToolSyntax() (toolcall.Syntax, bool) { return f.tools.syntax, f.tools.writes }

// OffersTools reports whether the template offers the client's tools
// itself, ahead of the conversation (see Sigil.ToolFormat).
func (f *Format) OffersTools() bool { return f.tools.offers }

// probeCall is the call rendered to read a template's syntax.
const probeName, probeArg = "@@name@@", "@@argument@@"

// readSyntax renders the template's range over .ToolCalls with one call
// and reads the syntax off it; false when the template has none or its
// rendering is not a JSON object with the call's name and arguments.
func readSyntax(t *template.Template) (*ttemplate.Template, toolcall.Syntax, bool) {
	sub := t.Subtree(func(n parse.Node) bool {
		r, ok := n.(*parse.RangeNode)
		return ok && slices.Contains(template.Identifiers(r.Pipe), "ToolCalls")
	})
	if sub == nil {
		return nil, toolcall.Syntax{}, false
	}
	call := api.ToolCall{Function: api.ToolCallFunction{Name: probeName, Arguments: api.ToolCallFunctionArguments{probeArg: 1}}}
	out, err := renderCalls(sub, []api.ToolCall{call})
	if err != nil {
		return nil, toolcall.Syntax{}, false
	}
	syn, ok := syntaxOf(out)
	return sub, syn, ok
}

// renderCalls is calls as the template's range over .ToolCalls writes
// them.
func renderCalls(sub *ttemplate.Template, calls []api.ToolCall) (string, error) {
	var sb strings.Builder
	err := sub.Execute(&sb, map[string][]api.ToolCall{"ToolCalls": calls})
	return sb.String(), err
}

// syntaxOf reads the syntax off the probe call as a template wrote it.
func syntaxOf(out string) (toolcall.Syntax, bool) {
	i := strings.IndexAny(out, "{[")
	if i < 0 {
		return toolcall.Syntax{}, false
	}
	dec := json.NewDecoder(strings.NewReader(out[i:]))
	var v any
	if dec.Decode(&v) != nil {
		return toolcall.Syntax{}, false
	}
	if a, ok := v.([]any); ok && len(a) > 0 {
		v = a[0]
	}
	obj, _ := v.(map[string]any)
	syn := toolcall.Syntax{Open: strings.TrimSpace(out[:i]), Close: strings.TrimSpace(out[i+int(dec.InputOffset()):])}
	for k, x := range obj {
		switch x := x.(type) {
		case string:
			if x == probeName {
				syn.Name = k
			}
		case map[string]any:
			if _, ok := x[probeArg]; ok {
				syn.Arguments = k
			}
		}
	}
	if syn.Name == "" || syn.Arguments == "" {
		return toolcall.Syntax{}, false
	}
	return syn, true
}

// apiTools are the sigil's client tools as the template takes them, when
// the template offers them.
func (f *Format) apiTools(rc *runcontext.RunContext) (api.Tools, error) {
	if rc.Sigil.ToolFormat != runcontext.ToolFormatTemplate || len(rc.Sigil.ClientTools) == 0 {
		return nil, nil
	}
	if !f.tools.offers {
		return nil, fmt.Errorf("chattemplate: the RunContext asks the model's chat template to offer the client's tools, and this template does not")
	}
	out := make(api.Tools, len(rc.Sigil.ClientTools))
	for i, t := range rc.Sigil.ClientTools {
		var at api.Tool
		at.Type = "function"
		at.Function.Name = f.special.Escape(t.Name)
		at.Function.Description = f.special.Escape(strings.Join(strings.Fields(t.Description), " "))
		f.parameters(&at.Function, t.Parameters)
		out[i] = at
	}
	return out, nil
}

// parameters fills fn's parameters from a JSON Schema, as far as Ollama's
// api.ToolFunction holds it (a property's type as its first name when it
// lists several, an enum's strings).
func (f *Format) parameters(fn *api.ToolFunction, schema string) {
	var s struct {
		Type       any                        `json:"type"`
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if schema == "" || json.Unmarshal([]byte(schema), &s) != nil {
		return
	}
	p := &fn.Parameters
	p.Type = typeName(s.Type)
	for _, r := range s.Required {
		p.Required = append(p.Required, f.special.Escape(r))
	}
	for name, raw := range s.Properties {
		var prop struct {
			Type        any    `json:"type"`
			Description string `json:"description"`
			Enum        []any  `json:"enum"`
		}
		_ = json.Unmarshal(raw, &prop)
		if p.Properties == nil {
			p.Properties = map[string]struct {
				Type        string   `json:"type"`
				Description string   `json:"description"`
				Enum        []string `json:"enum,omitempty"`
			}{}
		}
		e := p.Properties[f.special.Escape(name)]
		e.Type, e.Description = typeName(prop.Type), f.special.Escape(strings.Join(strings.Fields(prop.Description), " "))
		for _, v := range prop.Enum {
			if s, ok := v.(string); ok {
				e.Enum = append(e.Enum, f.special.Escape(s))
			}
		}
		p.Properties[f.special.Escape(name)] = e
	}
}

// typeName is a JSON Schema type as one name: the first of a list.
func typeName(t any) string {
	switch t := t.(type) {
	case string:
		return t
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok {
				return s
			}
		}
	}
	return ""
}

// assistant is a turn's answer as the template's assistant message: the
// calls, when the answer is tool calls (as the session records them) and
// the template writes calls; else the text.
func (f *Format) assistant(answer string) api.Message {
	if calls, ok := f.apiCalls(answer); ok {
		return api.Message{Role: "assistant", ToolCalls: calls}
	}
	return api.Message{Role: "assistant", Content: f.answerText(answer)}
}

// apiCalls are the calls of an answer the session recorded as tool calls,
// as the template takes them; false when the answer is text or the
// template writes no calls.
func (f *Format) apiCalls(answer string) ([]api.ToolCall, bool) {
	if !f.tools.writes {
		return nil, false
	}
	calls, ok := toolcall.Calls(answer)
	if !ok {
		return nil, false
	}
	out := make([]api.ToolCall, len(calls))
	for i, c := range calls {
		var args api.ToolCallFunctionArguments
		if json.Unmarshal(c.Arguments, &args) != nil {
			return nil, false
		}
		out[i] = api.ToolCall{Function: api.ToolCallFunction{Name: f.special.Escape(c.Name), Arguments: args}}
	}
	return out, true
}

// callsText is what the prompt holds for an answer of calls: the
// template's rendering of them.
func (f *Format) callsText(answer string) (string, bool) {
	calls, ok := f.apiCalls(answer)
	if !ok {
		return "", false
	}
	out, err := renderCalls(f.tools.calls, calls)
	return out, err == nil
}

// loadTools reads what the template does with tools: the syntax of its
// calls, and whether it offers the client's tools where they keep the
// cache protocol (ahead of the first turn, every turn extending the one
// before, content verbatim), checked on the probe conversation with a
// tool. Check.Tools says what was found.
func (f *Format) loadTools() {
	sub, syn, writes := readSyntax(f.tmpl)
	f.tools = toolSupport{syntax: syn, writes: writes, calls: sub}
	var notes []string
	if slices.Contains(f.tmpl.Vars(), "tools") {
		rc := probe()
		rc.Sigil.ClientTools = []runcontext.ClientTool{{Name: "probe_tool", Description: "A probe.", Parameters: `{"type":"object","properties":{"path":{"type":"string","description":"a path"}},"required":["path"]}`}}
		rc.Sigil.ToolFormat = runcontext.ToolFormatTemplate
		f.tools.offers = true // for the check
		c, err := f.checkTurns(rc)
		r, rerr := f.Render(rc)
		p := r.Prompt()
		first := strings.Index(p, rc.State.Turns[0].Query)
		at := strings.Index(p, "probe_tool")
		f.tools.offers = err == nil && rerr == nil && c.AppendOnly && at >= 0 && at < first
		if f.tools.offers {
			notes = append(notes, "the template offers the client's tools, ahead of the conversation")
		} else {
			notes = append(notes, "the template offers tools where they would move every turn (or not verbatim): ctxd's manifest offers them in the sigil block")
		}
	}
	if writes {
		notes = append(notes, fmt.Sprintf("calls are read as the template writes them: %s{%q: NAME, %q: {...}}%s", syn.Open, syn.Name, syn.Arguments, syn.Close))
	}
	f.check.Tools = strings.Join(notes, "; ")
}
