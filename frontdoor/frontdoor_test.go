package frontdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// engine is a fake request path: it records the asks and answers with
// fixed pieces, or fails with err.
type engine struct {
	asks   []ctxd.AskRequest
	pieces []string
	err    error
	after  int // fail with err after this many pieces (0: before any)
	calls  []ctxd.ToolCall
}

func (e *engine) AskAs(ctx context.Context, _ runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	e.asks = append(e.asks, req)
	for i, p := range e.pieces {
		if e.err != nil && i == e.after {
			return nil, e.err
		}
		if err := onToken(p); err != nil {
			return nil, err
		}
	}
	if e.err != nil {
		return nil, e.err
	}
	return &ctxd.Summary{Session: req.Session, Turn: len(req.History) + 1, PromptTokens: 100, CachedTokens: 96, EvaluatedTokens: 4, ClientTokens: 30, AnswerTokens: len(e.pieces), DoneReason: ctxd.DoneStop, ToolCalls: e.calls}, nil
}

var testModel = Model{Name: "ctxd-demo", Architecture: "llama", NumCtx: 4096, BackendKind: "ollama", BackendVersion: "0.6.5", Loaded: time.Unix(1700000000, 0)}

func serve(t *testing.T, e *engine, unavailable bool) *httptest.Server {
	t.Helper()
	d := New(Config{Engine: func() (Engine, Model, error) {
		if unavailable {
			return nil, Model{}, ctxd.Errorf(ctxd.KindUnavailable, "backend is starting")
		}
		return e, testModel, nil
	}, MaxBodyBytes: 4096})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, srv *httptest.Server, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestConversation(t *testing.T) {
	msgs := []message{
		{Role: "system", Content: json.RawMessage(`"Be terse."`)},
		{Role: "developer", Content: json.RawMessage(`[{"type":"text","text":"Use Go."}]`)},
		{Role: "user", Content: json.RawMessage(`"q1"`)},
		{Role: "assistant", Content: json.RawMessage(`"a1"`)},
		{Role: "user", Content: json.RawMessage(`"q2a"`)},
		{Role: "user", Content: json.RawMessage(`"q2b"`)},
		{Role: "assistant", Content: json.RawMessage(`null`), ToolCalls: json.RawMessage(`[{"id":"c1","type":"function","function":{"name":"grep","arguments":"{\"pattern\": \"x\"}"}}]`)},
		{Role: "tool", Name: "grep", Content: json.RawMessage(`"found"`)},
		{Role: "assistant", Content: json.RawMessage(`"a3"`)},
		{Role: "assistant", Content: json.RawMessage(`"a3b"`)},
		{Role: "system", Content: json.RawMessage(`"late note"`)},
		{Role: "user", Content: json.RawMessage(`"q4"`)},
	}
	c, err := toConversation(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if c.System != "Be terse.\n\nUse Go." {
		t.Errorf("system %q", c.System)
	}
	want := []ctxd.Turn{
		{Query: "q1", Answer: "a1"},
		{Query: "q2a\n\nq2b", Answer: `{"name":"grep","arguments":{"pattern":"x"}}`},
		{Query: "[tool result grep]\nfound", Answer: "a3\n\na3b"},
	}
	if !reflect.DeepEqual(c.History, want) {
		t.Errorf("history\n got %+v\nwant %+v", c.History, want)
	}
	if c.Query != "[system]\nlate note\n\nq4" {
		t.Errorf("query %q", c.Query)
	}

	c, err = toConversation([]message{{Role: "assistant", Content: json.RawMessage(`"hello"`)}, {Role: "user", Content: json.RawMessage(`"hi"`)}})
	if err != nil || len(c.History) != 1 || c.History[0].Query != continueQuery || c.History[0].Answer != "hello" {
		t.Errorf("assistant first: %+v %v", c, err)
	}
	if c.History == nil {
		t.Error("history must be non-nil: the session follows it")
	}
	if c, _ := toConversation([]message{{Role: "user", Content: json.RawMessage(`"only"`)}}); c.History == nil || len(c.History) != 0 {
		t.Errorf("first turn: history %v, want empty and non-nil", c.History)
	}

	bad := map[string][]message{
		"messages: required":            nil,
		"last message must be the user": {{Role: "user", Content: json.RawMessage(`"q"`)}, {Role: "assistant", Content: json.RawMessage(`"a"`)}},
		"role":                          {{Role: "wizard", Content: json.RawMessage(`"q"`)}},
		"text parts only":               {{Role: "user", Content: json.RawMessage(`[{"type":"image_url","image_url":{"url":"x"}}]`)}},
		"take text only":                {{Role: "user", Content: json.RawMessage(`"q"`), Images: []string{"aGk="}}},
		"empty":                         {{Role: "user", Content: json.RawMessage(`"  "`)}},
		"a string or a list":            {{Role: "user", Content: json.RawMessage(`42`)}},
	}
	for want, msgs := range bad {
		if _, err := toConversation(msgs); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: got %v, want an error containing %q", msgs, err, want)
		}
	}
}

func TestOpenAIChat(t *testing.T) {
	e := &engine{pieces: []string{"Hel", "lo"}}
	srv := serve(t, e, false)
	body := `{"model":"ctxd-demo","temperature":0.2,"max_tokens":9,"messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`
	resp, b := post(t, srv, "/v1/chat/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var c struct {
		Object  string
		Choices []struct {
			Message      chatMessage
			FinishReason string `json:"finish_reason"`
		}
		Usage Usage
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Object != "chat.completion" || deref(c.Choices[0].Message.Content) != "Hello" || c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "stop" {
		t.Errorf("completion %s", b)
	}
	if c.Usage.PromptTokens != 30 || c.Usage.PromptTokensDetails.CachedTokens != 26 || c.Usage.CompletionTokens != 2 || c.Usage.TotalTokens != 32 {
		t.Errorf("usage %+v", c.Usage)
	}
	if got := resp.Header.Get("X-Ctxd-Ignored"); got != "max_tokens, temperature" {
		t.Errorf("X-Ctxd-Ignored %q", got)
	}
	ask := e.asks[0]
	if ask.System != "S" || ask.Query != "q2" || len(ask.History) != 1 || !strings.HasPrefix(ask.Session, "oai-") {
		t.Errorf("ask %+v", ask)
	}
	// The conversation one turn on (with the answer it got) lands in the
	// same session; one that diverged, or under another system text, in
	// another; the header names one.
	post(t, srv, "/v1/chat/completions", `{"model":"ctxd-demo","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"},{"role":"assistant","content":"Hello "},{"role":"user","content":"q3"}]}`)
	post(t, srv, "/v1/chat/completions", `{"model":"ctxd-demo","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"},{"role":"assistant","content":"Bye"},{"role":"user","content":"q3"}]}`)
	post(t, srv, "/v1/chat/completions", `{"model":"ctxd-demo","messages":[{"role":"system","content":"T"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"},{"role":"assistant","content":"Hello"},{"role":"user","content":"q3"}]}`)
	post(t, srv, "/v1/chat/completions", `{"model":"ctxd-demo:latest","messages":[{"role":"user","content":"q1"}]}`, "X-Ctxd-Session", "mine")
	if e.asks[1].Session != ask.Session || e.asks[2].Session == ask.Session || e.asks[3].Session == ask.Session || e.asks[4].Session != "mine" {
		t.Errorf("sessions %q %q %q %q %q", ask.Session, e.asks[1].Session, e.asks[2].Session, e.asks[3].Session, e.asks[4].Session)
	}
}

// sse reads an SSE body's data payloads.
func sse(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		} else if sc.Text() != "" {
			t.Fatalf("not an SSE line: %q", sc.Text())
		}
	}
	return out
}

func TestOpenAIChatStream(t *testing.T) {
	srv := serve(t, &engine{pieces: []string{"Hel", "lo"}}, false)
	resp, b := post(t, srv, "/v1/chat/completions", `{"model":"ctxd","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	data := sse(t, b)
	if len(data) != 5 || data[4] != "[DONE]" {
		t.Fatalf("chunks %q", data)
	}
	var text strings.Builder
	for i, d := range data[:3] {
		var c completion
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 {
			t.Fatalf("chunk %s", d)
		}
		text.WriteString(deref(c.Choices[0].Delta.Content))
		if i == 0 && c.Choices[0].Delta.Role != "assistant" {
			t.Errorf("first chunk has no role: %s", d)
		}
		if (i == 2) != (c.Choices[0].FinishReason != nil) {
			t.Errorf("finish_reason on chunk %d: %s", i, d)
		}
	}
	var u completion
	json.Unmarshal([]byte(data[3]), &u)
	if text.String() != "Hello" || u.Usage == nil || u.Usage.PromptTokensDetails.CachedTokens != 26 || len(u.Choices) != 0 {
		t.Errorf("text %q usage chunk %s", text.String(), data[3])
	}
}

func TestOpenAICompletionsAndModels(t *testing.T) {
	e := &engine{pieces: []string{"x"}}
	srv := serve(t, e, false)
	resp, b := post(t, srv, "/v1/completions", `{"model":"ctxd-demo","prompt":["say x"]}`)
	var c completion
	json.Unmarshal(b, &c)
	if resp.StatusCode != 200 || c.Object != "text_completion" || *c.Choices[0].Text != "x" || e.asks[0].Query != "say x" || !e.asks[0].Ephemeral {
		t.Errorf("%d %s %+v", resp.StatusCode, b, e.asks)
	}
	r, err := http.Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var list struct {
		Data []openaiModel
	}
	json.NewDecoder(r.Body).Decode(&list)
	if len(list.Data) != 1 || list.Data[0].ID != "ctxd-demo" || list.Data[0].ContextLength != 4096 {
		t.Errorf("models %+v", list)
	}
}

func TestOpenAIErrors(t *testing.T) {
	cases := []struct {
		name, path, body string
		e                *engine
		unavailable      bool
		status           int
		code, msg        string
	}{
		{"malformed", "/v1/chat/completions", `{"model":`, &engine{}, false, 400, "invalid", "malformed JSON"},
		{"empty", "/v1/chat/completions", ``, &engine{}, false, 400, "invalid", "empty body"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"q"}]}`, &engine{}, false, 404, "model_not_found", `"gpt-4o" not found`},
		{"no messages", "/v1/chat/completions", `{"model":"ctxd"}`, &engine{}, false, 400, "invalid", "messages: required"},
		{"n", "/v1/chat/completions", `{"model":"ctxd","n":2,"messages":[{"role":"user","content":"q"}]}`, &engine{}, false, 400, "invalid", "n: 2"},
		{"oversize", "/v1/chat/completions", `{"model":"ctxd","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`, &engine{}, false, 413, "too_large", "over the cap"},
		{"does not fit", "/v1/chat/completions", `{"model":"ctxd","messages":[{"role":"user","content":"q"}]}`, &engine{err: ctxd.Errorf(ctxd.KindDoesNotFit, "prompt is 9000 tokens")}, false, 400, "context_length_exceeded", "9000 tokens"},
		{"starting", "/v1/chat/completions", `{"model":"ctxd","messages":[{"role":"user","content":"q"}]}`, &engine{}, true, 503, "unavailable", "starting"},
		{"bad session", "/v1/completions", `{"model":"ctxd","prompt":"q"}`, &engine{}, false, 400, "invalid", "X-Ctxd-Session"},
		{"prompt list", "/v1/completions", `{"model":"ctxd","prompt":["a","b"]}`, &engine{}, false, 400, "invalid", "2 prompts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := serve(t, c.e, c.unavailable)
			var hdr []string
			if c.name == "bad session" {
				hdr = []string{"X-Ctxd-Session", "../etc"}
			}
			resp, b := post(t, srv, c.path, c.body, hdr...)
			var oe openaiError
			if err := json.Unmarshal(b, &oe); err != nil {
				t.Fatalf("not an OpenAI error object: %s", b)
			}
			if resp.StatusCode != c.status || oe.Error.Code == nil || *oe.Error.Code != c.code || !strings.Contains(oe.Error.Message, c.msg) {
				t.Errorf("got %d %s; want %d code %s containing %q", resp.StatusCode, b, c.status, c.code, c.msg)
			}
		})
	}
	// An error after the stream started ends it with an error chunk.
	srv := serve(t, &engine{pieces: []string{"a", "b"}, err: ctxd.Errorf(ctxd.KindBackend, "runner died"), after: 1}, false)
	_, b := post(t, srv, "/v1/chat/completions", `{"model":"ctxd","stream":true,"messages":[{"role":"user","content":"q"}]}`)
	data := sse(t, b)
	if len(data) != 2 || !strings.Contains(data[1], `"error"`) || !strings.Contains(data[1], "runner died") {
		t.Errorf("stream error: %q", data)
	}
}

func TestOllamaDoor(t *testing.T) {
	e := &engine{pieces: []string{"Hel", "lo"}}
	srv := serve(t, e, false)
	resp, b := post(t, srv, "/api/chat", `{"model":"ctxd-demo:latest","options":{"num_ctx":2048,"temperature":0},"keep_alive":"5m","messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("lines %q", lines)
	}
	var last ollamaChunk
	json.Unmarshal([]byte(lines[2]), &last)
	if !last.Done || last.DoneReason != "stop" || last.PromptEvalCount != 30 || last.EvalCount != 2 || last.Ctxd == nil {
		t.Fatalf("final %s", lines[2])
	}
	if want := []string{"keep_alive", "options.num_ctx", "options.temperature"}; !slices.Equal(last.Ctxd.Ignored, want) {
		t.Errorf("ignored %q, want %q", last.Ctxd.Ignored, want)
	}
	// Not streamed; generate; a load request.
	_, b = post(t, srv, "/api/generate", `{"model":"ctxd-demo","prompt":"p","system":"S","stream":false}`)
	var g ollamaChunk
	json.Unmarshal(b, &g)
	if g.Response == nil || *g.Response != "Hello" || !g.Done || e.asks[1].System != "S" || !e.asks[1].Ephemeral {
		t.Errorf("generate %s %+v", b, e.asks[1])
	}
	_, b = post(t, srv, "/api/generate", `{"model":"ctxd-demo","options":{"num_ctx":8192}}`)
	json.Unmarshal(b, &g)
	if g.DoneReason != "load" || len(e.asks) != 2 {
		t.Errorf("load %s", b)
	}
	// Errors are {"error": ...} with the kind's status.
	for body, want := range map[string]string{
		`{"model":"llama3","messages":[{"role":"user","content":"q"}]}`:                 "404 model \"llama3\" not found",
		`{"model":"ctxd","format":"json","messages":[{"role":"user","content":"q"}]}`:   "400 format",
		`{"model":"ctxd","messages":[{"role":"user","content":"q","images":["aGk="]}]}`: "415 messages[0].images",
		`{"model":`: "400 malformed",
	} {
		resp, b := post(t, srv, "/api/chat", body)
		var oe map[string]string
		if json.Unmarshal(b, &oe) != nil || len(oe) != 1 || !strings.Contains(strconvItoa(resp.StatusCode)+" "+oe["error"], want) {
			t.Errorf("%s: %d %s, want %q", body, resp.StatusCode, b, want)
		}
	}
	for _, path := range []string{"/api/raw", "/api/generate?x"} {
		r, _ := http.Get(srv.URL + path)
		r.Body.Close()
		if r.StatusCode != 404 && r.StatusCode != 405 {
			t.Errorf("GET %s: %d", path, r.StatusCode)
		}
	}
}

func strconvItoa(n int) string { return itoa(n) }

func TestOllamaInfoRoutes(t *testing.T) {
	srv := serve(t, &engine{}, false)
	get := func(path string, v any) {
		t.Helper()
		r, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		if err := json.NewDecoder(r.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
	}
	var tags struct{ Models []struct{ Name string } }
	get("/api/tags", &tags)
	var ver struct{ Version string }
	get("/api/version", &ver)
	var ps struct {
		Models []struct {
			Name          string
			ContextLength int `json:"context_length"`
		}
	}
	get("/api/ps", &ps)
	if len(tags.Models) != 1 || tags.Models[0].Name != "ctxd-demo:latest" || ver.Version != "0.6.5" || ps.Models[0].ContextLength != 4096 {
		t.Errorf("tags %+v version %+v ps %+v", tags, ver, ps)
	}
	_, b := post(t, srv, "/api/show", `{"model":"ctxd-demo"}`)
	var show struct {
		ModelInfo    map[string]any `json:"model_info"`
		Capabilities []string       `json:"capabilities"`
	}
	json.Unmarshal(b, &show)
	if show.ModelInfo["llama.context_length"] != float64(4096) || !slices.Contains(show.Capabilities, "tools") {
		t.Errorf("show %s", b)
	}
	if resp, _ := post(t, srv, "/api/show", `{"model":"nope"}`); resp.StatusCode != 404 {
		t.Errorf("show unknown model: %d", resp.StatusCode)
	}
}

func TestSigilRefusal(t *testing.T) {
	d := New(Config{
		Engine: func() (Engine, Model, error) { return &engine{}, testModel, nil },
		Sigil: func(*http.Request) (runcontext.Sigil, error) {
			return runcontext.Sigil{}, ctxd.Errorf(ctxd.KindForbidden, "no")
		},
	})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, b := post(t, srv, "/api/chat", `{"model":"ctxd","messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 403 || !strings.Contains(string(b), "no") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestToolCalls(t *testing.T) {
	e := &engine{pieces: []string{`{"name":"grep",`, `"arguments":{"q":"x"}}`}, calls: []ctxd.ToolCall{{Name: "grep", Arguments: json.RawMessage(`{"q":"x"}`)}}}
	srv := serve(t, e, false)
	tools := `"tools":[{"type":"function","function":{"name":"grep","description":"Search.","parameters":{"type":"object"}}}]`
	resp, b := post(t, srv, "/v1/chat/completions", `{"model":"ctxd",`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	var c struct {
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []openaiToolCall `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	json.Unmarshal(b, &c)
	if resp.StatusCode != 200 || c.Choices[0].FinishReason != "tool_calls" || c.Choices[0].Message.Content != nil ||
		len(c.Choices[0].Message.ToolCalls) != 1 || c.Choices[0].Message.ToolCalls[0].Function.Arguments != `{"q":"x"}` ||
		!strings.HasPrefix(c.Choices[0].Message.ToolCalls[0].ID, "call_") {
		t.Errorf("%d %s", resp.StatusCode, b)
	}
	if len(e.asks[0].Tools) != 1 || e.asks[0].Tools[0].Name != "grep" || string(e.asks[0].Tools[0].Parameters) != `{"type":"object"}` {
		t.Errorf("tools asked: %+v", e.asks[0].Tools)
	}

	// Streamed: the whole answer's tool calls in one chunk, no text first.
	_, b = post(t, srv, "/v1/chat/completions", `{"model":"ctxd","stream":true,`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	data := sse(t, b)
	if len(data) != 3 || !strings.Contains(data[0], `"tool_calls":[{"index":0,"id":"call_`) || strings.Contains(data[0], `"content":"{`) ||
		!strings.Contains(data[1], `"finish_reason":"tool_calls"`) || data[2] != "[DONE]" {
		t.Errorf("stream: %q", data)
	}

	// tool_choice none offers no tools; a forced choice is reported ignored.
	post(t, srv, "/v1/chat/completions", `{"model":"ctxd","tool_choice":"none",`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	if e.asks[2].Tools != nil {
		t.Errorf("tool_choice none: tools %+v", e.asks[2].Tools)
	}
	resp, _ = post(t, srv, "/v1/chat/completions", `{"model":"ctxd","tool_choice":"required",`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	if resp.Header.Get("X-Ctxd-Ignored") != "tool_choice" {
		t.Errorf("tool_choice required: ignored %q", resp.Header.Get("X-Ctxd-Ignored"))
	}
	resp, b = post(t, srv, "/v1/chat/completions", `{"model":"ctxd","tools":[{"type":"retrieval"}],"messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "tools[0].type") {
		t.Errorf("a non-function tool: %d %s", resp.StatusCode, b)
	}

	// Ollama: the arguments are an object.
	_, b = post(t, srv, "/api/chat", `{"model":"ctxd","stream":false,`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	var o ollamaChunk
	json.Unmarshal(b, &o)
	if o.Message == nil || len(o.Message.ToolCalls) != 1 || string(o.Message.ToolCalls[0].Function.Arguments) != `{"q":"x"}` || o.Message.Content != "" {
		t.Errorf("ollama: %s", b)
	}
}

// TestSessionsFollowConversations: each conversation that begins is a
// session of its own, even when it begins as another did, and each
// sigil's are its own; a conversation that goes on (its history what it
// was answered) stays in its session; a refused request leaves nothing
// for another to join: the conversation that goes on from it holds an
// answer ctxd never gave, so it is its own.
func TestSessionsFollowConversations(t *testing.T) {
	e := &engine{pieces: []string{"a"}}
	d := New(Config{
		Engine: func() (Engine, Model, error) { return e, testModel, nil },
		Sigil: func(r *http.Request) (runcontext.Sigil, error) {
			return runcontext.Sigil{Name: r.Header.Get("X-Test-Sigil")}, nil
		},
	})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	body := `{"model":"ctxd","stream":false,"messages":[{"role":"user","content":"q1"}]}`
	for _, path := range []string{"/v1/chat/completions", "/api/chat"} {
		e.asks = nil
		for _, sigil := range []string{"alice", "bob", "alice"} {
			if resp, b := post(t, srv, path, body, "X-Test-Sigil", sigil); resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
			}
		}
		a1, b, a2 := e.asks[0], e.asks[1], e.asks[2]
		if a1.Sigil != "alice" || b.Sigil != "bob" || a1.Session == b.Session || a1.Session == a2.Session || a2.Session == b.Session {
			t.Errorf("%s: alice %q (%s), bob %q (%s), alice again %q", path, a1.Session, a1.Sigil, b.Session, b.Sigil, a2.Session)
		}
		next := `{"model":"ctxd","stream":false,"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]}`
		e.pieces = []string{"b"} // another question, another answer
		post(t, srv, path, next, "X-Test-Sigil", "bob")
		e.pieces = []string{"a"}
		if got := e.asks[3].Session; got != b.Session {
			t.Errorf("%s: bob's conversation went on in %q, not %q", path, got, b.Session)
		}
		// Refused: nothing remembered.
		e.err = ctxd.Errorf(ctxd.KindDoesNotFit, "too long")
		post(t, srv, path, strings.Replace(next, "q2", "q2b", 1), "X-Test-Sigil", "bob")
		e.err = nil
		post(t, srv, path, `{"model":"ctxd","stream":false,"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a"},{"role":"user","content":"q2b"},{"role":"assistant","content":"a"},{"role":"user","content":"q3"}]}`, "X-Test-Sigil", "bob")
		if got := e.asks[5].Session; got == b.Session || got == e.asks[4].Session {
			t.Errorf("%s: a conversation that went on from a refused request joined %q", path, got)
		}
	}
}

// usage is the client's own part of the prompt: its prompt_tokens the
// summary's client_tokens, its cached_tokens that part less what the
// backend evaluated (measured where it says), never below 0.
func TestUsageIsTheClientsPrompt(t *testing.T) {
	for _, c := range []struct {
		sum            ctxd.Summary
		prompt, cached int
	}{
		{ctxd.Summary{PromptTokens: 10000, ClientTokens: 3000, EvaluatedTokens: 40}, 3000, 2960},
		{ctxd.Summary{PromptTokens: 10000, ClientTokens: 3000, EvaluatedTokens: 9000}, 3000, 0}, // the codex evaluated again too
	} {
		u := usageOf(&c.sum)
		if u.PromptTokens != c.prompt || u.PromptTokensDetails.CachedTokens != c.cached || u.TotalTokens != c.prompt {
			t.Errorf("%+v: usage %+v; want prompt %d, cached %d", c.sum, u, c.prompt, c.cached)
		}
	}
}

// A cap on the answer under the answer reserve is honoured (max_tokens,
// OpenAI's newer max_completion_tokens, Ollama's options.num_predict); a
// larger one has no effect and is listed as ignored; a cap under 1 is
// OpenAI's 400.
func TestAnswerCap(t *testing.T) {
	e := &engine{pieces: []string{"a"}}
	m := testModel
	m.AnswerReserve = 64
	d := New(Config{Engine: func() (Engine, Model, error) { return e, m, nil }})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	msgs := `"messages":[{"role":"user","content":"q"}]`
	for _, c := range []struct {
		path, body string
		status     int
		cap        int
		ignored    string
	}{
		{"/v1/chat/completions", `{"model":"ctxd","max_tokens":9,` + msgs + `}`, 200, 9, ""},
		{"/v1/chat/completions", `{"model":"ctxd","max_tokens":9,"max_completion_tokens":20,` + msgs + `}`, 200, 20, "max_tokens"},
		{"/v1/chat/completions", `{"model":"ctxd","max_tokens":4096,` + msgs + `}`, 200, 0, "max_tokens"},
		{"/v1/chat/completions", `{"model":"ctxd","max_tokens":64,` + msgs + `}`, 200, 64, ""}, // the reserve itself is honoured
		{"/v1/chat/completions", `{"model":"ctxd","max_tokens":0,` + msgs + `}`, 400, 0, ""},
		{"/v1/completions", `{"model":"ctxd","prompt":"q","max_tokens":5}`, 200, 5, ""},
		{"/api/chat", `{"model":"ctxd","stream":false,"options":{"num_predict":7,"num_ctx":8192},` + msgs + `}`, 200, 7, "options.num_ctx"},
		{"/api/generate", `{"model":"ctxd","stream":false,"prompt":"q","options":{"num_predict":-1}}`, 200, 0, "options.num_predict"},
	} {
		e.asks = nil
		resp, b := post(t, srv, c.path, c.body)
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: %d %s", c.path, c.body, resp.StatusCode, b)
			continue
		}
		if c.status != 200 {
			if !strings.Contains(string(b), "max_tokens") {
				t.Errorf("%s %s: the error does not name the field: %s", c.path, c.body, b)
			}
			continue
		}
		if got := e.asks[0].MaxTokens; got != c.cap {
			t.Errorf("%s %s: cap %d; want %d", c.path, c.body, got, c.cap)
		}
		if got := resp.Header.Get("X-Ctxd-Ignored"); got != c.ignored {
			t.Errorf("%s %s: X-Ctxd-Ignored %q; want %q", c.path, c.body, got, c.ignored)
		}
	}
}

// OpenAI routes the door does not serve are answered in OpenAI's shape,
// naming those it does; /api/show's template names .Tools, which clients
// read to learn that the model takes tools.
func TestUnservedRoutesAndTemplate(t *testing.T) {
	srv := serve(t, &engine{}, false)
	for _, path := range []string{"/v1/responses", "/v1/embeddings", "/v1/audio/speech"} {
		resp, b := post(t, srv, path, `{"model":"ctxd","input":"hi"}`)
		var oe openaiError
		if err := json.Unmarshal(b, &oe); err != nil || resp.StatusCode != 404 || !strings.Contains(oe.Error.Message, "/v1/chat/completions") {
			t.Errorf("%s: %d %s", path, resp.StatusCode, b)
		}
		if !IsOpenAIPath(path) {
			t.Errorf("%s: not an OpenAI path, so the daemon's own errors there have its shape", path)
		}
	}
	_, b := post(t, srv, "/api/show", `{"model":"ctxd"}`)
	var show struct{ Template string }
	json.Unmarshal(b, &show)
	if !strings.Contains(show.Template, ".Tools") {
		t.Errorf("template %q", show.Template)
	}
}

// TestToolsNotAllowedAreListed: where the daemon leaves out the tools a
// sigil may not offer, the door lists them in X-Ctxd-Ignored.
func TestToolsNotAllowedAreListed(t *testing.T) {
	e := &engine{pieces: []string{"a"}}
	d := New(Config{Engine: func() (Engine, Model, error) { return e, testModel, nil },
		Sigil: func(*http.Request) (runcontext.Sigil, error) {
			return runcontext.Sigil{Name: "a", Scopes: []string{"ask", "tool:grep"}}, nil
		}})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tools := `"tools":[{"type":"function","function":{"name":"grep"}},{"type":"function","function":{"name":"Shell"}}]`
	for _, path := range []string{"/v1/chat/completions", "/api/chat"} {
		resp, b := post(t, srv, path, `{"model":"ctxd","stream":false,`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
		if got := resp.Header.Get("X-Ctxd-Ignored"); got != "tools.Shell" {
			t.Errorf("%s: X-Ctxd-Ignored %q; want tools.Shell (%s)", path, got, b)
		}
	}
}
