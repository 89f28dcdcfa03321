// Package toolcall reads tool calls out of a model's answer and writes
// them back in one canonical text.
//
// ctxd renders the client's tools in the sigil block with one protocol for
// every model (formatters/toolmanifest.Protocol): an answer that is only a JSON
// object {"name": ..., "arguments": {...}} per call, one per line, is a
// tool call. Parse also reads the shapes models are trained on: a JSON
// array of calls, "parameters" for "arguments", a ```json fence, and
// Hermes-style <tool_call>...</tool_call> tags. An answer with anything
// else in it is text.
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
	raw, ok := parseAll(answer)
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

type wire struct {
	Name       string          `json:"name"`
	Arguments  json.RawMessage `json:"arguments"`
	Parameters json.RawMessage `json:"parameters"`
}

func parseAll(answer string) ([]ctxd.ToolCall, bool) {
	s := strings.TrimSpace(answer)
	if f, ok := strings.CutPrefix(s, "```json"); ok {
		s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f), "```"))
	}
	if strings.HasPrefix(s, "<tool_call>") {
		var parts []string
		for _, p := range strings.Split(s, "<tool_call>")[1:] {
			body, rest, found := strings.Cut(p, "</tool_call>")
			if strings.TrimSpace(rest) != "" && found {
				return nil, false
			}
			parts = append(parts, strings.TrimSpace(body))
		}
		s = strings.Join(parts, "\n")
	}
	if s == "" || (s[0] != '{' && s[0] != '[') {
		return nil, false
	}
	var ws []wire
	if s[0] == '[' {
		if json.Unmarshal([]byte(s), &ws) != nil {
			return nil, false
		}
	} else {
		dec := json.NewDecoder(strings.NewReader(s))
		for dec.More() {
			var w wire
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
		args := w.Arguments
		if len(args) == 0 {
			args = w.Parameters
		}
		if w.Name == "" || !isObject(args) {
			return nil, false
		}
		calls[i] = ctxd.ToolCall{Name: w.Name, Arguments: json.RawMessage(compact(args))}
	}
	return calls, true
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
