package frontdoor

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// slowEngine accepts a request (or not), then waits for go before it
// answers with its pieces: a backend reading a long prompt.
type slowEngine struct {
	accept bool
	go_    chan struct{}
	pieces []string
	calls  []ctxd.ToolCall
	err    error // returned instead of an answer, after go
}

func (e *slowEngine) AskAs(ctx context.Context, _ runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	if e.accept && req.Accepted != nil {
		req.Accepted()
	}
	select {
	case <-e.go_:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		return nil, e.err
	}
	for _, p := range e.pieces {
		if err := onToken(p); err != nil {
			return nil, err
		}
	}
	return &ctxd.Summary{Session: req.Session, PromptTokens: 10, AnswerTokens: len(e.pieces), DoneReason: ctxd.DoneStop, ToolCalls: e.calls}, nil
}

func serveSlow(t *testing.T, e *slowEngine, grace, keepAlive time.Duration) *httptest.Server {
	t.Helper()
	d := New(Config{Engine: func() (Engine, Model, error) { return e, testModel, nil }, HeaderGrace: grace, KeepAlive: keepAlive})
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// open sends a request and returns the response as soon as its headers
// arrive, with a reader over its body.
func open(t *testing.T, srv *httptest.Server, path, body string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, bufio.NewReader(resp.Body)
}

// TestStreamHeadersBeforeTheAnswer: a streamed answer's headers leave as
// soon as the request is accepted, while the backend has produced nothing
// yet, on both doors; so does the answer's keep-alive on a long wait.
func TestStreamHeadersBeforeTheAnswer(t *testing.T) {
	t.Parallel()
	for _, door := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"ctxd","stream":true,"messages":[{"role":"user","content":"q"}]}`},
		{"/api/chat", `{"model":"ctxd","messages":[{"role":"user","content":"q"}]}`},
	} {
		e := &slowEngine{accept: true, go_: make(chan struct{}), pieces: []string{"Hi"}}
		// An hour's grace: only the acceptance can send the headers.
		srv := serveSlow(t, e, time.Hour, 20*time.Millisecond)
		resp, br := open(t, srv, door.path, door.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", door.path, resp.StatusCode)
		}
		// Keep-alive lines come while the engine still waits.
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: %v", door.path, err)
		}
		switch door.path {
		case "/v1/chat/completions":
			if !strings.HasPrefix(line, ":") {
				t.Errorf("%s: keep-alive %q is not an SSE comment", door.path, line)
			}
		default:
			var c ollamaChunk
			if err := json.Unmarshal([]byte(line), &c); err != nil || c.Done || c.Message == nil || c.Message.Content != "" {
				t.Errorf("%s: keep-alive %q is not an empty chunk (%v)", door.path, line, err)
			}
		}
		close(e.go_)
		rest := readAll(t, br)
		if !strings.Contains(rest, `"Hi"`) {
			t.Errorf("%s: the answer after the keep-alive: %q", door.path, rest)
		}
	}
}

// TestStreamHeadersAfterTheGrace: a request that is not accepted yet
// (waiting for its session, or condensing) still gets its headers after
// the grace, and a refusal made later ends the stream in the door's error
// shape; one made before keeps its status.
func TestStreamHeadersAfterTheGrace(t *testing.T) {
	t.Parallel()
	e := &slowEngine{go_: make(chan struct{}), err: ctxd.Errorf(ctxd.KindDoesNotFit, "prompt over the window")}
	srv := serveSlow(t, e, 10*time.Millisecond, time.Hour)
	resp, br := open(t, srv, "/v1/chat/completions", `{"model":"ctxd","stream":true,"messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	close(e.go_)
	if rest := readAll(t, br); !strings.Contains(rest, `data: {"error":`) || !strings.Contains(rest, "prompt over the window") {
		t.Errorf("the refusal after the headers: %q", rest)
	}

	// Refused at once: the status says so.
	now := &slowEngine{go_: make(chan struct{}), err: ctxd.Errorf(ctxd.KindDoesNotFit, "prompt over the window")}
	close(now.go_)
	srv = serveSlow(t, now, time.Hour, time.Hour)
	resp, b := post(t, srv, "/v1/chat/completions", `{"model":"ctxd","stream":true,"messages":[{"role":"user","content":"q"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "context_length_exceeded") {
		t.Errorf("an immediate refusal: %d %s", resp.StatusCode, b)
	}
}

// TestTextStreamsWhenToolsAreOffered: with tools offered, an answer that
// is text streams piece by piece; one that is a call is held and sent as
// tool_calls, never as text; one that looked like a call and was not is
// sent as text at its end.
func TestTextStreamsWhenToolsAreOffered(t *testing.T) {
	t.Parallel()
	tools := `"tools":[{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}]`
	ask := `{"model":"ctxd","stream":true,` + tools + `,"messages":[{"role":"user","content":"q"}]}`
	srv := serve(t, &engine{pieces: []string{" The", " answer", " is", " 4."}}, false)
	_, b := post(t, srv, "/v1/chat/completions", ask)
	data := sse(t, b)
	if len(data) != 6 || !strings.Contains(data[0], `"content":" The"`) || !strings.Contains(data[3], `"content":" 4."`) ||
		!strings.Contains(data[4], `"finish_reason":"stop"`) {
		t.Errorf("text with tools offered did not stream piece by piece: %q", data)
	}

	srv = serve(t, &engine{pieces: []string{"\n", "```", "json\n{\"name\":", "\"grep\"}\n```"}, calls: []ctxd.ToolCall{{Name: "grep", Arguments: json.RawMessage(`{}`)}}}, false)
	_, b = post(t, srv, "/v1/chat/completions", ask)
	if data = sse(t, b); len(data) != 3 || !strings.Contains(data[0], `"tool_calls"`) || strings.Contains(b2s(data), "```") {
		t.Errorf("a fenced call: %q", data)
	}

	srv = serve(t, &engine{pieces: []string{"{not", " a call}"}}, false)
	_, b = post(t, srv, "/v1/chat/completions", ask)
	if data = sse(t, b); len(data) != 3 || !strings.Contains(data[0], `"content":"{not a call}"`) {
		t.Errorf("text that began like a call: %q", data)
	}

	// Ollama: the same, in its chunks.
	srv = serve(t, &engine{pieces: []string{"Hel", "lo"}}, false)
	_, b = post(t, srv, "/api/chat", `{"model":"ctxd",`+tools+`,"messages":[{"role":"user","content":"q"}]}`)
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 3 || !strings.Contains(lines[0], `"content":"Hel"`) {
		t.Errorf("ollama text with tools offered: %q", lines)
	}
}

func TestToolSniffer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pieces []string
		sent   string // streamed as it came
		held   string
		open   string // the model's own opener
	}{
		{pieces: []string{"[TOOL", "_CALLS] [{}]"}, held: "[TOOL_CALLS] [{}]", open: "[TOOL_CALLS]"},
		{pieces: []string{"<|python", "_tag|>{}"}, held: "<|python_tag|>{}", open: "<|python_tag|>"},
		{pieces: []string{"<|py", "thon is fun"}, sent: "<|python is fun", open: "<|python_tag|>"},
		{[]string{"Hello", " world"}, "Hello world", "", ""},
		{[]string{"  ", "\n", "Hi"}, "  \nHi", "", ""},
		{[]string{"``", "`go\nx"}, "```go\nx", "", ""},
		{[]string{"``", "`js", "on\n{}"}, "", "```json\n{}", ""},
		{[]string{"<tool", "_call>{}"}, "", "<tool_call>{}", ""},
		{[]string{"<to", "day>"}, "<today>", "", ""},
		{[]string{" [", "1]"}, "", " [1]", ""},
	} {
		s := toolSniffer{open: c.open}
		var sent strings.Builder
		for _, p := range c.pieces {
			sent.WriteString(s.feed(p))
		}
		if sent.String() != c.sent || s.rest() != c.held {
			t.Errorf("%q: sent %q held %q; want %q and %q", c.pieces, sent.String(), s.rest(), c.sent, c.held)
		}
	}
}

func readAll(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	var sb strings.Builder
	for {
		line, err := br.ReadString('\n')
		sb.WriteString(line)
		if err != nil {
			return sb.String()
		}
	}
}

func b2s(data []string) string { return strings.Join(data, "\n") }
