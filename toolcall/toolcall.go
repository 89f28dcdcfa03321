// Package toolcall reads tool calls out of a model's answer and writes
// them back in one canonical text.
//
// ctxd renders the client's tools in the sigil block with one protocol for
// every model (formatters/toolmanifest.Protocol): an answer that is only a JSON
// object {"name": ..., "arguments": {...}} per call, one per line, is a
// tool call. Parse also reads the shapes models are trained on: a JSON
// array of calls, "parameters" for "arguments", a ```json fence, and
// Hermes-style <tool_call>...</tool_call> tags. A model whose chat
// template defines its own way of writing a call (package chattemplate
// reads it into a Syntax: the text that opens a call, the one that closes
// it, the keys of its name and arguments) is read in that way as well.
// An answer with anything else in it is text.
package toolcall

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/ctxd/ctxd"
)

// Parse reads answer as tool calls. ok is false when the answer is text.
// Calls to a tool not in offered are returned in refused, not in calls:
// ctxd never hands the client a call to a tool its sigil did not offer.
func Parse(answer string, offered []string) (calls []ctxd.ToolCall, refused []string, ok bool) {
	return Syntax{}.Parse(answer, offered)
}

// Calls reads answer as tool calls, whatever their names: a recorded
// answer (Render's text) back into its calls.
func Calls(answer string) ([]ctxd.ToolCall, bool) { return Syntax{}.parseAll(answer) }

// Syntax is how a model's chat template writes a tool call (what its
// template renders for an assistant message's calls): Open is the text
// before each call ("<tool_call>", or "" for a bare JSON object), Close
// the text after it, Name and Arguments the keys of the call's object
// ("" for "name" and "arguments"). The zero Syntax reads only ctxd's own
// protocol and the shapes Parse lists.
type Syntax struct {
	Open      string `json:"open,omitempty"`
	Close     string `json:"close,omitempty"`
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// Parse reads answer as tool calls, in the syntax as well as in every
// shape the package-level Parse reads.
func (syn Syntax) Parse(answer string, offered []string) (calls []ctxd.ToolCall, refused []string, ok bool) {
	raw, ok := syn.parseAll(answer)
	if !ok {
		return nil, nil, false
	}
	for _, c := range raw {
		if contains(offered, c.Name) {
			calls = append(calls, c)
		} else {
			refused = append(refused, c.Name)
		}
	}
	return calls, refused, true
}

// Render is calls as one canonical text: one compact JSON object per
// line. A session records a tool-calling answer in this form, and a door
// renders the assistant's tool calls a client sends back the same way, so
// the two compare equal.
func Render(calls []ctxd.ToolCall) string {
	lines := make([]string, len(calls))
	for i, c := range calls {
		args := compact(c.Arguments)
		if args == "" {
			args = "{}"
		}
		name, _ := json.Marshal(c.Name)
		lines[i] = `{"name":` + string(name) + `,"arguments":` + args + `}`
	}
	return strings.Join(lines, "\n")
}

func (syn Syntax) parseAll(answer string) ([]ctxd.ToolCall, bool) {
	s := strings.TrimSpace(answer)
	if f, ok := strings.CutPrefix(s, "```json"); ok {
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f), "```"))
	}
	for _, tag := range []Syntax{syn, {Open: "<tool_call>", Close: "</tool_call>"}} {
		open := strings.TrimSpace(tag.Open)
		if open == "" || !strings.HasPrefix(s, open) {
			continue
		}
		var ok bool
		if s, ok = tag.unwrap(s, open); !ok {
			return nil, false
		}
		break
	}
	if s == "" || (s[0] != '{' && s[0] != '[') {
		return nil, false
	}
	var ws []map[string]json.RawMessage
	if s[0] == '[' {
		if json.Unmarshal([]byte(s), &ws) != nil {
			return nil, false
		}
	} else {
		dec := json.NewDecoder(strings.NewReader(s))
		for dec.More() {
			var w map[string]json.RawMessage
			if dec.Decode(&w) != nil {
				return nil, false
			}
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil, false
	}
	calls := make([]ctxd.ToolCall, len(ws))
	for i, w := range ws {
		name, args, ok := syn.fields(w)
		if !ok {
			return nil, false
		}
		calls[i] = ctxd.ToolCall{Name: name, Arguments: json.RawMessage(compact(args))}
	}
	return calls, true
}

// unwrap is s (which starts with open) without the text around each call:
// the calls' bodies, one per line. Anything after a call's Close but
// another call makes it not tool calls.
func (syn Syntax) unwrap(s, open string) (string, bool) {
	end := strings.TrimSpace(syn.Close)
	var parts []string
	for _, p := range strings.Split(s, open)[1:] {
		body := p
		if end != "" {
			var rest string
			var found bool
			body, rest, found = strings.Cut(p, end)
			if found && strings.TrimSpace(rest) != "" {
				return "", false
			}
		}
		parts = append(parts, strings.TrimSpace(body))
	}
	return strings.Join(parts, "\n"), true
}

// fields are a call object's name and arguments, under the syntax's keys
// or the usual ones ("name"; "arguments", else "parameters").
func (syn Syntax) fields(w map[string]json.RawMessage) (string, json.RawMessage, bool) {
	var name string
	for _, k := range []string{syn.Name, "name"} {
		if raw, ok := w[k]; ok && k != "" {
			if json.Unmarshal(raw, &name) != nil {
				return "", nil, false
			}
			break
		}
	}
	var args json.RawMessage
	for _, k := range []string{syn.Arguments, "arguments", "parameters"} {
		if raw, ok := w[k]; ok && k != "" {
			args = raw
			break
		}
	}
	return name, args, name != "" && isObject(args)
}

// isObject: arguments are a JSON object, or absent.
func isObject(b json.RawMessage) bool {
	t := bytes.TrimSpace(b)
	if len(t) == 0 || string(t) == "null" {
		return true
	}
	var m map[string]json.RawMessage
	return json.Unmarshal(t, &m) == nil
}

func compact(b json.RawMessage) string {
	t := bytes.TrimSpace(b)
	if len(t) == 0 || string(t) == "null" {
		return "{}"
	}
	if c, ok := Canonical(t); ok {
		return c
	}
	return string(t)
}

// Canonical is a JSON value in one form whatever the client did to it on
// the way back: compact, object keys sorted, <, > and & unescaped, an
// integer as its digits (-0 is 0, however large it is, never rounded) and
// any other number as a float64 prints (1.0 is 1, 1e3 is 1000). Clients
// decode a tool call's arguments into their own maps and objects and send
// them back re-encoded (Ollama's Go client sorts the keys; JavaScript
// prints 1.0 as 1), and the session must still see the answer it
// recorded. false if b is not JSON.
func Canonical(b []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		return "", false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(canonicalNumbers(v)); err != nil {
		return "", false
	}
	return strings.TrimSuffix(buf.String(), "\n"), true
}

// canonicalNumbers rewrites the numbers of a decoded value in place.
func canonicalNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = canonicalNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = canonicalNumbers(e)
		}
	case json.Number:
		return canonicalNumber(x)
	}
	return v
}

// canonicalNumber: an integer literal keeps its digits (without a sign on
// zero or leading zeros, which JSON forbids anyway); any other number is
// printed as a float64, as JavaScript and Go clients print it.
func canonicalNumber(n json.Number) json.Number {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		digits := strings.TrimPrefix(s, "-")
		if strings.Trim(digits, "0") == "" {
			return "0"
		}
		return n
	}
	f, err := n.Float64()
	if err != nil {
		return n // out of float64's range: as written
	}
	b, err := json.Marshal(f)
	if err != nil {
		return n
	}
	return json.Number(b)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
