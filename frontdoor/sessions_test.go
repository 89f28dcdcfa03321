package frontdoor

import (
	"encoding/json"
	"testing"

	"github.com/ctxd/ctxd"
)

// TestToolLoopStaysInItsSession: an agent's tool loop — the model calls
// a tool, the client sends the call back with its result — goes on in
// the session that made the call, streamed or not, on both doors.
func TestToolLoopStaysInItsSession(t *testing.T) {
	t.Parallel()
	e := &engine{pieces: []string{`{"name":"grep",`, `"arguments":{"q":"x"}}`}, calls: []ctxd.ToolCall{{Name: "grep", Arguments: json.RawMessage(`{"q":"x"}`)}}}
	srv := serve(t, e, false)
	tools := `"tools":[{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}]`
	for _, c := range []struct{ path, stream, call, result string }{
		{"/v1/chat/completions", `true`, `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"grep","arguments":"{\"q\": \"x\"}"}}]}`,
			`{"role":"tool","tool_call_id":"call_1","content":"found"}`},
		{"/v1/chat/completions", `false`, `{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"grep","arguments":"{\"q\":\"x\"}"}}]}`,
			`{"role":"tool","tool_call_id":"call_1","content":"found"}`},
		{"/api/chat", `true`, `{"role":"assistant","content":"","tool_calls":[{"function":{"name":"grep","arguments":{"q":"x"}}}]}`,
			`{"role":"tool","content":"found"}`},
	} {
		e.asks = nil
		first := `{"model":"ctxd","stream":` + c.stream + `,` + tools + `,"messages":[{"role":"system","content":"agent"},{"role":"user","content":"find x"}]}`
		if resp, b := post(t, srv, c.path, first); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
		}
		next := `{"model":"ctxd","stream":` + c.stream + `,` + tools + `,"messages":[{"role":"system","content":"agent"},{"role":"user","content":"find x"},` + c.call + `,` + c.result + `]}`
		if resp, b := post(t, srv, c.path, next); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
		}
		if a, b := e.asks[0].Session, e.asks[1].Session; a != b {
			t.Errorf("%s stream=%s: the tool result went to session %q, not %q, which made the call", c.path, c.stream, b, a)
		}
	}
}
