package frontdoor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// askRecorder is the fuzz targets' request path: it keeps the one ask a
// request makes and answers it with two pieces.
type askRecorder struct {
	asks []ctxd.AskRequest
}

func (e *askRecorder) AskAs(_ context.Context, _ runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error) {
	e.asks = append(e.asks, req)
	for _, p := range []string{"an ", "answer"} {
		if err := onToken(p); err != nil {
			return nil, err
		}
	}
	return &ctxd.Summary{Session: req.Session, Turn: len(req.History) + 1, PromptTokens: 10, AnswerTokens: 2, DoneReason: ctxd.DoneStop}, nil
}

// fuzzModel has an answer reserve, so that a client's cap on the answer
// can be honoured.
var fuzzModel = Model{Name: "ctxd-demo", Architecture: "llama", NumCtx: 4096, AnswerReserve: 256, BackendKind: "ollama", BackendVersion: "0.6.5"}

// doorRoutes are the routes whose bodies become asks.
var doorRoutes = []string{"/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"}

// FuzzDoorRequest sends any body (and any X-Ctxd-Session header) to the
// routes of both doors whose requests become asks. Whatever it is, the
// door answers in its own shape: a client error that names the problem
// without asking anything, or one ask that is well formed (a valid
// session id, a query that is not blank, turns with queries, a cap on the
// answer under the reserve), answered as valid JSON or a valid stream.
// Nothing a client sends is an internal error.
func FuzzDoorRequest(f *testing.F) {
	seeds := []struct {
		route   uint8
		body    string
		session string
	}{
		{0, `{"model":"ctxd-demo","messages":[{"role":"user","content":"What does Serve do?"}]}`, ""},
		{0, `{"model":"ctxd","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":[{"type":"text","text":"q2"}]}],"max_completion_tokens":32}`, "mine.1"},
		{0, `{"model":"ctxd-demo","messages":[{"role":"user","content":"grep it"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"grep","arguments":"{\"pattern\":\"x\"}"}}]},{"role":"tool","name":"grep","tool_call_id":"c1","content":"found"}],"tools":[{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}],"tool_choice":"auto"}`, ""},
		{0, `{"model":"ctxd-demo","messages":[{"role":"assistant","content":"hello"}]}`, ""},
		{0, `{"model":"ctxd-demo","messages":[{"role":"user","content":"  "}],"n":2,"max_tokens":0}`, ""},
		{0, `{"model":"gpt-4","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "../etc"},
		{0, `{"model":"ctxd-demo","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"retrieval"}],"max_tokens":1e300}`, ""},
		{1, `{"model":"ctxd-demo","prompt":["one prompt"],"max_tokens":16,"temperature":0.2}`, ""},
		{1, `{"model":"ctxd-demo","prompt":[1,2,3],"stream":true}`, ""},
		{1, `{"model":"ctxd-demo","prompt":"\u0000\ud800"}`, "a"},
		{2, `{"model":"ctxd-demo:latest","messages":[{"role":"user","content":"hi","images":["aGk="]}]}`, ""},
		{2, `{"model":"ctxd-demo","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":12,"num_ctx":99999},"stream":false}`, ""},
		{2, `{"model":"ctxd-demo","messages":[{"role":"user","content":"run"},{"role":"assistant","tool_calls":[{"function":{"name":"run","arguments":{"cmd":"ls"}}}]},{"role":"tool","content":"a.go"}],"format":"json"}`, ""},
		{2, `{"model":"ctxd-demo"}`, ""},
		{3, `{"model":"ctxd-demo","prompt":"Why is the sky blue?","system":"Be brief.","stream":false}`, ""},
		{3, `{"model":"ctxd-demo","prompt":"x","raw":true,"template":"{{.Prompt}}","suffix":"y"}`, ""},
		{3, `{"model":"ctxd-demo","prompt":""}`, ""},
		{3, `not json`, ""},
		{3, `{"model":"ctxd-demo","prompt":"a"} {"again":1}`, ""},
		{0, ``, ""},
		{0, `null`, ""},
		{0, `[]`, ""},
	}
	for _, s := range seeds {
		f.Add(s.route, []byte(s.body), s.session)
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte, session string) {
		e := &askRecorder{}
		d := New(Config{Engine: func() (Engine, Model, error) { return e, fuzzModel, nil }, MaxBodyBytes: 1 << 16})
		mux := http.NewServeMux()
		d.Register(mux)
		path := doorRoutes[int(route)%len(doorRoutes)]
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		if session != "" && validHeader(session) {
			req.Header.Set("X-Ctxd-Session", session)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		res := rec.Result()
		out := rec.Body.Bytes()

		if res.StatusCode >= 500 {
			t.Fatalf("%s %q: status %d (a client's body is never a server error): %s", path, body, res.StatusCode, out)
		}
		if res.StatusCode != http.StatusOK {
			if len(e.asks) != 0 {
				t.Fatalf("%s %q: refused with %d after asking %+v", path, body, res.StatusCode, e.asks)
			}
			if msg := doorErrorMessage(t, path, out); strings.TrimSpace(msg) == "" {
				t.Fatalf("%s %q: status %d with no message: %s", path, body, res.StatusCode, out)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("%s %q: a body that is not JSON was answered 200", path, body)
		}
		checkAnswer(t, path, res.Header.Get("Content-Type"), out)
		if len(e.asks) == 0 {
			// Only Ollama's way to load a model answers without asking.
			if !strings.HasPrefix(path, "/api/") || !bytes.Contains(out, []byte(`"done_reason":"load"`)) {
				t.Fatalf("%s %q: 200 without an ask: %s", path, body, out)
			}
			return
		}
		if len(e.asks) != 1 {
			t.Fatalf("%s %q: %d asks for one request", path, body, len(e.asks))
		}
		checkAsk(t, e.asks[0], req.Header.Get("X-Ctxd-Session"))
	})
}

// validHeader is whether net/http would send s as a header value: the
// fuzzer's strings that it would refuse are not requests a client can
// make.
func validHeader(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return false
		}
	}
	return strings.TrimSpace(s) == s
}

// doorErrorMessage is the message of an error answer in the door's shape.
func doorErrorMessage(t *testing.T, path string, out []byte) string {
	t.Helper()
	if IsOpenAIPath(path) {
		var e openaiError
		if err := json.Unmarshal(out, &e); err != nil || e.Error.Type == "" || e.Error.Code == nil {
			t.Fatalf("%s: error not in OpenAI's shape (%v): %s", path, err, out)
		}
		return e.Error.Message
	}
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &e); err != nil {
		t.Fatalf("%s: error not in Ollama's shape (%v): %s", path, err, out)
	}
	return e.Error
}

// checkAnswer fails unless out is one JSON value, or a stream of them (SSE
// or NDJSON, as the content type says).
func checkAnswer(t *testing.T, path, contentType string, out []byte) {
	t.Helper()
	switch contentType {
	case "application/json":
		if !json.Valid(out) {
			t.Fatalf("%s: answer is not JSON: %s", path, out)
		}
	case "text/event-stream":
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == "" || line == "data: [DONE]" {
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || !json.Valid([]byte(data)) {
				t.Fatalf("%s: bad SSE line %q", path, line)
			}
		}
	case "application/x-ndjson":
		for line := range bytes.Lines(out) {
			if !json.Valid(line) {
				t.Fatalf("%s: bad NDJSON line %q", path, line)
			}
		}
	default:
		t.Fatalf("%s: answer of content type %q", path, contentType)
	}
}

// checkAsk fails unless ask is one the request path can take: the checks
// the orchestrator relies on the doors for.
func checkAsk(t *testing.T, ask ctxd.AskRequest, header string) {
	t.Helper()
	if err := ctxd.CheckSessionID(ask.Session); err != nil {
		t.Fatalf("ask with a bad session: %v", err)
	}
	if header != "" && ask.Session != header {
		t.Fatalf("session %q, the header said %q", ask.Session, header)
	}
	if strings.TrimSpace(ask.Query) == "" {
		t.Fatalf("ask with a blank query: %+v", ask)
	}
	if ask.MaxTokens < 0 || ask.MaxTokens > fuzzModel.AnswerReserve {
		t.Fatalf("ask with max_tokens %d (reserve %d)", ask.MaxTokens, fuzzModel.AnswerReserve)
	}
	if ask.Ephemeral {
		if ask.History != nil {
			t.Fatalf("ephemeral ask with a history: %+v", ask.History)
		}
		return
	}
	if ask.History == nil {
		t.Fatalf("chat ask without a history (the session would not follow the client's): %+v", ask)
	}
	for i, turn := range ask.History {
		if strings.TrimSpace(turn.Query) == "" {
			t.Fatalf("history[%d] has a blank query: %+v", i, turn)
		}
	}
	for i, tool := range ask.Tools {
		if tool.Name == "" {
			t.Fatalf("tools[%d] has no name", i)
		}
	}
}
