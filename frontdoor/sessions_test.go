package frontdoor

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
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

// TestRewrittenConversationStaysInItsSession: an agent that resumes a
// conversation with its history rewritten (Qwen Code takes a reminder off
// its first message and sends the answers it got in pieces as one) stays
// in that conversation's session, as it holds that conversation's answers
// and opens as it did; another asker's, a conversation that opens
// otherwise, or one that opens the same and then holds an answer the
// conversation never got, does not join it.
func TestRewrittenConversationStaysInItsSession(t *testing.T) {
	t.Parallel()
	e := &engine{pieces: []string{"a"}}
	srv := serve(t, e, false)
	opening := strings.Repeat("The project is a CSV reader. ", 8) + "How does the Reader parse a quoted field?"
	msg := chatMsg
	chat := func(system string, msgs ...string) string {
		t.Helper()
		return chatAs(t, srv, e, system, msgs...)
	}
	first := chat("agent", msg("user", opening+"\n<reminder>today is Thursday</reminder>"))
	cont := chat("agent", msg("user", opening+"\n<reminder>today is Thursday</reminder>"), msg("assistant", "a"), msg("user", "go on"))
	if cont != first {
		t.Fatalf("the conversation went on in %q, not %q", cont, first)
	}
	// Resumed: the reminder is gone, the two answers are one.
	resumed := chat("agent", msg("user", opening), msg("assistant", "a\n\na"), msg("user", "and the writer?"))
	if resumed != first {
		t.Errorf("the resumed conversation, its opening rewritten, went to %q, not %q", resumed, first)
	}
	// Its next turn, as answered, goes on there too.
	if next := chat("agent", msg("user", opening), msg("assistant", "a\n\na"), msg("user", "and the writer?"), msg("assistant", "a"), msg("user", "thanks")); next != first {
		t.Errorf("the turn after the rewrite went to %q, not %q", next, first)
	}
	// Resumed again: the same opening, a later question's reminder gone,
	// that question's answers joined.
	if again := chat("agent", msg("user", opening), msg("assistant", "aa"), msg("user", "and the writer"), msg("assistant", "aa"), msg("user", "more")); again != first {
		t.Errorf("resumed again, the conversation went to %q, not %q", again, first)
	}
	for name, got := range map[string]string{
		"another system text":              chat("other agent", msg("user", opening), msg("assistant", "aa"), msg("user", "q")),
		"another opening":                  chat("agent", msg("user", "Where is the writer? "+opening), msg("assistant", "aa"), msg("user", "q")),
		"the same opening, then elsewhere": chat("agent", msg("user", opening), msg("assistant", "something never answered"), msg("user", "q")),
	} {
		if got == first {
			t.Errorf("%s: joined the conversation's session %q", name, first)
		}
	}
}

// TestRetriedAnswersStayInTheirSession: Qwen Code asks a question again
// with a larger answer limit when the answer is cut (the same messages:
// a session of its own), goes on there, and, resuming the conversation
// later, sends both tries' answers as one. That history holds all of the
// second conversation's answers, in order, among others: it joins it,
// turn after turn; a history that holds none of them whole does not.
func TestRetriedAnswersStayInTheirSession(t *testing.T) {
	t.Parallel()
	e := &engine{}
	srv := serve(t, e, false)
	opening := strings.Repeat("The project is a CSV reader. ", 8) + "How does the Reader parse a quoted field?"
	msg := chatMsg
	chat := func(answer string, msgs ...string) string {
		t.Helper()
		e.pieces = []string{answer}
		return chatAs(t, srv, e, "agent", msgs...)
	}
	a1, a2, a3 := "The first try, cut at its limit: alpha", "The second try, with more room: beta gamma delta", "and where it was cut it goes on: epsilon zeta"
	first := chat(a1, msg("user", opening))
	retried := chat(a2, msg("user", opening))
	if retried == first {
		t.Fatalf("the retried question joined the first try's session %q: its history is empty", first)
	}
	if s := chat(a3, msg("user", opening), msg("assistant", a2), msg("user", "Output limit hit. Resume.")); s != retried {
		t.Fatalf("the continuation went to %q, not %q", s, retried)
	}
	joined := a1 + a2 + a3
	b1, b2 := "Another answer, cut as well: eta theta", "Asked again, answered whole: iota kappa lambda"
	if s := chat(b1, msg("user", opening), msg("assistant", joined), msg("user", "And the writer?")); s != retried {
		t.Errorf("the resumed conversation went to %q, not %q, whose answers it holds among the first try's", s, retried)
	}
	if s := chat(b2, msg("user", opening), msg("assistant", joined), msg("user", "And the writer?")); s != retried {
		t.Errorf("its question asked again went to %q, not %q", s, retried)
	}
	if s := chat("ok", msg("user", opening), msg("assistant", joined), msg("user", "And the writer?"), msg("assistant", b1+" "+b2), msg("user", "thanks")); s != retried {
		t.Errorf("resumed again, with both tries of its second question, the conversation went to %q, not %q", s, retried)
	}
	for name, got := range map[string]string{
		"none of its answers whole": chat("x", msg("user", opening), msg("assistant", "The second try, with more room: beta, and then something else entirely"), msg("user", "q")),
		"another opening":           chat("x", msg("user", "Where is the writer? "+opening), msg("assistant", joined), msg("user", "q")),
	} {
		if got == retried || got == first {
			t.Errorf("%s: joined the conversation's session %q", name, got)
		}
	}
}

// chatMsg is one chat message, as JSON.
func chatMsg(role, content string) string {
	b, _ := json.Marshal(map[string]string{"role": role, "content": content})
	return string(b)
}

// chatAs sends the messages after the system text to srv's OpenAI door,
// not streamed, and returns the session e was asked in.
func chatAs(t *testing.T, srv *httptest.Server, e *engine, system string, msgs ...string) string {
	t.Helper()
	body := `{"model":"ctxd","stream":false,"messages":[` + chatMsg("system", system) + "," + strings.Join(msgs, ",") + `]}`
	if resp, b := post(t, srv, "/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return e.asks[len(e.asks)-1].Session
}
