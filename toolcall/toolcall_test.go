package toolcall

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/ctxd/ctxd"
)

func TestParse(t *testing.T) {
	offered := []string{"grep", "read_file"}
	cases := []struct {
		answer  string
		ok      bool
		calls   string // Render of the calls
		refused []string
	}{
		{`{"name": "grep", "arguments": {"pattern": "x",  "path": "."}}`, true, `{"name":"grep","arguments":{"path":".","pattern":"x"}}`, nil},
		{"  {\"name\":\"grep\",\"arguments\":{}}\n{\"name\":\"read_file\",\"parameters\":{\"path\":\"a\"}}\n", true,
			"{\"name\":\"grep\",\"arguments\":{}}\n{\"name\":\"read_file\",\"arguments\":{\"path\":\"a\"}}", nil},
		{`[{"name":"grep"}]`, true, `{"name":"grep","arguments":{}}`, nil},
		{"```json\n{\"name\":\"grep\",\"arguments\":{\"q\":1}}\n```", true, `{"name":"grep","arguments":{"q":1}}`, nil},
		{"<tool_call>\n{\"name\":\"grep\",\"arguments\":{}}\n</tool_call>\n<tool_call>{\"name\":\"read_file\",\"arguments\":{}}</tool_call>", true,
			"{\"name\":\"grep\",\"arguments\":{}}\n{\"name\":\"read_file\",\"arguments\":{}}", nil},
		{`{"name":"rm_rf","arguments":{}}`, true, "", []string{"rm_rf"}},
		{`{"name":"grep","arguments":{}} {"name":"shell","arguments":{"cmd":"x"}}`, true, `{"name":"grep","arguments":{}}`, []string{"shell"}},
		{`The answer is {"name":"grep"}`, false, "", nil},
		{`{"name":"grep","arguments":{}} and some text`, false, "", nil},
		{`{"name":"grep","arguments":"not an object"}`, false, "", nil},
		{`{"arguments":{}}`, false, "", nil},
		{`{"name":"grep"`, false, "", nil},
		{"", false, "", nil},
		{"plain words", false, "", nil},
	}
	for _, c := range cases {
		calls, refused, ok := Parse(c.answer, offered)
		if ok != c.ok || Render(calls) != c.calls || !slices.Equal(refused, c.refused) {
			t.Errorf("Parse(%q) = %q %v %v; want %q %v %v", c.answer, Render(calls), refused, ok, c.calls, c.refused, c.ok)
		}
		if ok && len(calls) > 0 { // the canonical text reads back as itself
			again, _, ok2 := Parse(Render(calls), offered)
			if !ok2 || Render(again) != Render(calls) {
				t.Errorf("Render(%q) does not parse back: %q", c.answer, Render(again))
			}
		}
	}
}

// A client decodes a call's arguments into its own map and sends them back
// re-encoded (Ollama's Go client sorts keys and prints 1.0 as 1): the
// canonical text is the same both ways, so the session's prefix holds.
func TestRenderSurvivesAClientsRoundTrip(t *testing.T) {
	answer := `{"name":"grep","arguments":{"pattern":"<a & b>","path":".","limit":10.0,"opts":{"z":true,"a":[1.5,"x"]}}}`
	calls, _, ok := Parse(answer, []string{"grep"})
	if !ok {
		t.Fatal("not a tool call")
	}
	recorded := Render(calls)
	var args map[string]any // what the client holds
	if err := json.Unmarshal(calls[0].Arguments, &args); err != nil {
		t.Fatal(err)
	}
	back, err := json.Marshal(args) // what it sends back
	if err != nil {
		t.Fatal(err)
	}
	if got := Render([]ctxd.ToolCall{{Name: "grep", Arguments: back}}); got != recorded {
		t.Errorf("sent back: %s\nrecorded:  %s", got, recorded)
	}
	if want := `{"name":"grep","arguments":{"limit":10,"opts":{"a":[1.5,"x"],"z":true},"path":".","pattern":"<a & b>"}}`; recorded != want {
		t.Errorf("recorded %s; want %s", recorded, want)
	}
}

func TestCanonical(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"b": 1, "a": [true, null, "x"]}`, `{"a":[true,null,"x"],"b":1}`},
		{`{"id": 9007199254740993}`, `{"id":9007199254740993}`}, // past 2^53: never rounded
		{`{"n": -0, "m": 1.0, "e": 1e3, "f": 0.1, "g": -2.50}`, `{"e":1000,"f":0.1,"g":-2.5,"m":1,"n":0}`},
		{`{"s": "<a & b>", "u": "\u00e9"}`, `{"s":"<a & b>","u":"é"}`},
		{`{"big": 1e400}`, `{"big":1e400}`}, // out of float64's range: as written
		{`[1, 2]`, `[1,2]`},
	} {
		got, ok := Canonical([]byte(c.in))
		if !ok || got != c.want {
			t.Errorf("Canonical(%s) = %s %v; want %s", c.in, got, ok, c.want)
		}
		again, _ := Canonical([]byte(got))
		if again != got {
			t.Errorf("Canonical is not idempotent on %s: %s", got, again)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} {"b":2}`, `nul`} {
		if got, ok := Canonical([]byte(bad)); ok {
			t.Errorf("Canonical(%q) = %q, true; want false", bad, got)
		}
	}
}

// A model's own syntax, as its chat template writes a call, is read as
// well as the usual shapes; text around the calls is still text.
func TestParseInAModelsSyntax(t *testing.T) {
	offered := []string{"grep", "read_file"}
	cases := []struct {
		syn    Syntax
		answer string
		ok     bool
		calls  string
	}{
		{Syntax{Open: "[TOOL_CALLS]"}, `[TOOL_CALLS] [{"name":"grep","arguments":{"q":1}},{"name":"read_file","arguments":{}}]`, true,
			"{\"name\":\"grep\",\"arguments\":{\"q\":1}}\n{\"name\":\"read_file\",\"arguments\":{}}"},
		{Syntax{Open: "<|python_tag|>", Close: "<|eom_id|>", Name: "tool", Arguments: "args"}, `<|python_tag|>{"tool": "grep", "args": {"q": "x"}}<|eom_id|>`, true,
			`{"name":"grep","arguments":{"q":"x"}}`},
		{Syntax{Open: "<function_call>", Close: "</function_call>"}, "<function_call>\n{\"name\":\"grep\",\"arguments\":{}}\n</function_call>\n<function_call>{\"name\":\"grep\",\"arguments\":{}}</function_call>", true,
			"{\"name\":\"grep\",\"arguments\":{}}\n{\"name\":\"grep\",\"arguments\":{}}"},
		{Syntax{Open: "<function_call>", Close: "</function_call>"}, "<function_call>{\"name\":\"grep\",\"arguments\":{}}</function_call> and then I looked", false, ""},
		{Syntax{Open: "<function_call>", Close: "</function_call>"}, "<tool_call>{\"name\":\"grep\",\"arguments\":{}}</tool_call>", true, `{"name":"grep","arguments":{}}`},
		{Syntax{Name: "tool"}, `{"tool":"grep","arguments":{}}`, true, `{"name":"grep","arguments":{}}`},
		{Syntax{Open: "[TOOL_CALLS]"}, `[TOOL_CALLS] the grep tool would help`, false, ""},
	}
	for _, c := range cases {
		calls, _, ok := c.syn.Parse(c.answer, offered)
		if ok != c.ok || Render(calls) != c.calls {
			t.Errorf("%+v.Parse(%q) = %q %v; want %q %v", c.syn, c.answer, Render(calls), ok, c.calls, c.ok)
		}
	}
}
