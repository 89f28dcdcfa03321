package openai

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// stream serves a recorded or documented /v1/completions stream.
func stream(t *testing.T, body string, check func(r *http.Request, req map[string]any)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r)
			return
		}
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		if check != nil {
			check(r, req)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func newClient(t *testing.T, base string, opts Options) *Client {
	t.Helper()
	c, err := New(base, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func recorded(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLlamaServerStream replays streams recorded from the real
// llama-server (../shared/bin, testdata/llama-server-*.txt): the answer,
// why it stopped, and the server's reuse from
// usage.prompt_tokens_details.cached_tokens.
func TestLlamaServerStream(t *testing.T) {
	for _, tc := range []struct {
		file   string
		cached int
		prompt int
	}{{"llama-server-stream.txt", 0, 5}, {"llama-server-stream-cached.txt", 5, 6}} {
		srv := stream(t, recorded(t, tc.file), nil)
		c := newClient(t, srv.URL+"/v1/", Options{Model: "m"})
		var pieces []string
		gen, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p", MaxTokens: 4}, func(s string) error {
			pieces = append(pieces, s)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if gen.DoneReason != ctxd.DoneLength || gen.PromptEvalCount != tc.prompt || gen.EvalCount != 4 || gen.BackendCached != tc.cached {
			t.Errorf("%s: %+v", tc.file, gen)
		}
		if len(pieces) != 4 || strings.Join(pieces, "") != gen.Text || gen.TTFT <= 0 || gen.PromptEvalDuration <= 0 {
			t.Errorf("%s: pieces %q, text %q, ttft %v", tc.file, pieces, gen.Text, gen.TTFT)
		}
	}
}

// vLLM's documented stream (vllm/entrypoints/openai completion protocol):
// chunks of text, a finish_reason, then with stream_options.include_usage
// a last chunk of no choices and the usage; prompt_tokens_details is
// there with --enable-prompt-tokens-details, and left out when no token
// was cached. A contract test on the documented shape, not a live vLLM.
const vllmStream = `data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" Paris","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}

data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":".","logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":null}

data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1200,"total_tokens":1202,"completion_tokens":2%s}}

data: [DONE]

`

// SGLang's documented stream (python/sglang/srt/entrypoints/openai):
// the same framing; cached_tokens with --enable-cache-report. A contract
// test on the documented shape, not a live SGLang.
const sglangStream = `data: {"id":"a1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"Paris","logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}

data: {"id":"a1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","matched_stop":null}],"usage":null}

data: {"id":"a1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":900,"total_tokens":901,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":896}}}

data: [DONE]

`

// Ollama's /v1 stream (openai/openai.go, v0.6.5 to v0.17.4): with
// include_usage each content chunk carries a usage of zeros, and a last
// chunk of no choices the real one, without cached tokens.
const ollamaStream = `data: {"id":"cmpl-9","object":"text_completion","created":1,"model":"m","system_fingerprint":"fp_ollama","choices":[{"text":"Hi","index":0,"finish_reason":null}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}

data: {"id":"cmpl-9","object":"text_completion","created":1,"model":"m","system_fingerprint":"fp_ollama","choices":[{"text":"","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}

data: {"id":"cmpl-9","object":"text_completion","created":1,"model":"m","system_fingerprint":"fp_ollama","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,"total_tokens":41}}

data: [DONE]

`

func TestDocumentedStreams(t *testing.T) {
	srv := stream(t, fmt.Sprintf(vllmStream, `,"prompt_tokens_details":{"cached_tokens":1184}`), nil)
	c := newClient(t, srv.URL, Options{Model: "m"})
	gen, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil)
	if err != nil || gen.Text != " Paris." || gen.DoneReason != ctxd.DoneStop || gen.BackendCached != 1184 || gen.PromptEvalCount != 1200 {
		t.Errorf("vLLM: %+v %v", gen, err)
	}
	// The same client, once vLLM reported cached tokens, reads their
	// absence as none.
	srv2 := stream(t, fmt.Sprintf(vllmStream, ""), nil)
	c.base = srv2.URL
	if gen, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil); err != nil || gen.BackendCached != 0 {
		t.Errorf("vLLM, none cached: %+v %v", gen, err)
	}
	// A fresh client that never heard of cached tokens does not know.
	if gen, err := newClient(t, srv2.URL, Options{}).Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil); err != nil || gen.BackendCached != -1 {
		t.Errorf("vLLM without prompt details: %+v %v", gen, err)
	}
	srv3 := stream(t, sglangStream, nil)
	if gen, err := newClient(t, srv3.URL, Options{}).Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil); err != nil ||
		gen.Text != "Paris" || gen.DoneReason != ctxd.DoneLength || gen.BackendCached != 896 || gen.PromptEvalCount != 900 {
		t.Errorf("SGLang: %+v %v", gen, err)
	}
	srv4 := stream(t, ollamaStream, nil)
	if gen, err := newClient(t, srv4.URL, Options{}).Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil); err != nil ||
		gen.Text != "Hi" || gen.BackendCached != -1 || gen.PromptEvalCount != 40 || gen.EvalCount != 1 {
		t.Errorf("Ollama: %+v %v", gen, err)
	}
}

// TestRequestCarriesRouting: the prompt (text or ids), the session's
// routing key in the default headers, the parent's where there is one,
// configured body fields, and the API key.
func TestRequestCarriesRouting(t *testing.T) {
	var got []http.Header
	var bodies []map[string]any
	srv := stream(t, fmt.Sprintf(vllmStream, ""), func(r *http.Request, req map[string]any) {
		got, bodies = append(got, r.Header.Clone()), append(bodies, req)
	})
	routing := DefaultRouting()
	routing.Fields["session_params"] = "{session}"
	c := newClient(t, srv.URL, Options{Model: "qwen", APIKey: "sk-1", Tokens: true, Routing: routing})
	for _, req := range []ctxd.GenerateRequest{
		{Prompt: "p", Tokens: []int{1, 2, 3}, MaxTokens: 9, Stop: []string{"<|im_end|>"}, Session: "s1@alice"},
		{Prompt: "p", Tokens: []int{1, 2}, Session: "sub@alice", Parent: "s1@alice"},
		{Prompt: "p"},
	} {
		if _, err := c.Generate(t.Context(), req, nil); err != nil {
			t.Fatal(err)
		}
	}
	key := RoutingKey("s1@alice")
	if len(key) != 32 || strings.Contains(key, "alice") || RoutingKey("s1@alice") != key || RoutingKey("s1@bob") == key {
		t.Errorf("routing key %q: want 32 hex digits, stable, naming nobody", key)
	}
	h := got[0]
	if h.Get("X-Dynamo-Session-ID") != key || h.Get("X-SMG-Routing-Key") != key || h.Get("X-Dynamo-Parent-Session-ID") != "" {
		t.Errorf("first request's headers: %v", h)
	}
	if h.Get("Authorization") != "Bearer sk-1" {
		t.Errorf("Authorization = %q", h.Get("Authorization"))
	}
	if got[1].Get("X-Dynamo-Parent-Session-ID") != key || got[1].Get("X-Dynamo-Session-ID") != RoutingKey("sub@alice") {
		t.Errorf("side request's headers: %v", got[1])
	}
	if got[2].Get("X-Dynamo-Session-ID") != "" || bodies[2]["session_params"] != nil {
		t.Errorf("a request without a session sent routing: %v %v", got[2], bodies[2])
	}
	b := bodies[0]
	if fmt.Sprint(b["prompt"]) != "[1 2 3]" || b["model"] != "qwen" || b["max_tokens"] != 9.0 || b["stream"] != true ||
		fmt.Sprint(b["stop"]) != "[<|im_end|>]" || b["session_params"] != key {
		t.Errorf("body %v", b)
	}
	if so, _ := b["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Errorf("stream_options %v: want include_usage", b["stream_options"])
	}
	// Text when the client does not send ids.
	c.opts.Tokens = false
	if _, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "the text", Tokens: []int{1}}, nil); err != nil || bodies[3]["prompt"] != "the text" {
		t.Errorf("text prompt: %v %v", bodies[3]["prompt"], err)
	}
}

// refuseDials fails the first n dials as a refused connection would.
type refuseDials struct {
	n, dials atomic.Int32
	next     http.RoundTripper
}

func (r *refuseDials) RoundTrip(req *http.Request) (*http.Response, error) {
	if r.dials.Add(1) <= r.n.Load() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	return r.next.RoundTrip(req)
}

// TestNothingAcceptedIsSentTwice: a refused connection and a 503 before
// any answer are tried again; a stream the server began and then broke
// is not (it may have generated), nor is a 500.
func TestNothingAcceptedIsSentTwice(t *testing.T) {
	var hits atomic.Int32
	mode := atomic.Value{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		switch mode.Load() {
		case "busy-once":
			if n == 1 {
				w.Header().Set("Retry-After", "0")
				http.Error(w, `{"error":{"message":"server overloaded"}}`, http.StatusServiceUnavailable)
				return
			}
		case "break":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"text":"Par","finish_reason":null}]}`+"\n\n")
			w.(http.Flusher).Flush()
			hj, _, _ := w.(http.Hijacker).Hijack()
			hj.Close()
			return
		case "drop": // read the request, then the connection ends before any answer
			hj, _, _ := w.(http.Hijacker).Hijack()
			hj.Close()
			return
		case "error-event":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `error: {"code":500,"message":"failed to decode the batch","type":"server_error"}`+"\n\n")
			return
		case "parser":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, `data: {"choices":[{"text":"Par","finish_reason":null}]}`+"\n\n")
			io.WriteString(w, `data: {"error":{"code":500,"message":"The output does not match the expected format"}}`+"\n\n")
			return
		case "500":
			http.Error(w, `{"error":{"message":"engine died"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, fmt.Sprintf(vllmStream, ""))
	}))
	defer srv.Close()
	tr := &refuseDials{next: http.DefaultTransport}
	c := newClient(t, srv.URL, Options{Retries: 2, Transport: tr})
	run := func(m string, refuse int32) (ctxd.Generation, error) {
		hits.Store(0)
		tr.dials.Store(0)
		tr.n.Store(refuse)
		mode.Store(m)
		return c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil)
	}
	if _, err := run("ok", 2); err != nil || hits.Load() != 1 || tr.dials.Load() != 3 {
		t.Errorf("two refused dials: %v, %d requests, %d tries", err, hits.Load(), tr.dials.Load())
	}
	if _, err := run("ok", 3); !errors.Is(err, ErrUnavailable) || hits.Load() != 0 {
		t.Errorf("three refused dials with two retries: %v (want ErrUnavailable), %d requests", err, hits.Load())
	}
	if _, err := run("busy-once", 0); err != nil || hits.Load() != 2 {
		t.Errorf("a 503 once: %v, %d requests (want 2)", err, hits.Load())
	}
	gen, err := run("break", 0)
	if err == nil || hits.Load() != 1 || gen.Text != "Par" || !strings.Contains(err.Error(), "broke off the answer after 3 bytes") || !strings.Contains(err.Error(), "not recorded") {
		t.Errorf("a broken stream: %v, %d requests (want 1: never resent), text %q", err, hits.Load(), gen.Text)
	}
	if _, err := run("drop", 0); err == nil || hits.Load() != 1 {
		t.Errorf("a connection ended after the request was read: %v, %d requests (want 1: never resent)", err, hits.Load())
	}
	if _, err := run("error-event", 0); err == nil || hits.Load() != 1 || !strings.Contains(err.Error(), "failed to decode the batch") {
		t.Errorf("an error event: %v, want the server's message", err)
	}
	if gen, err := run("parser", 0); err != nil || gen.DoneReason != ctxd.DoneIncomplete || gen.Text != "Par" {
		t.Errorf("the output parser's refusal: %+v %v, want the text so far, incomplete", gen, err)
	}
	if _, err := run("500", 0); err == nil || hits.Load() != 1 || !strings.Contains(err.Error(), "engine died") {
		t.Errorf("a 500: %v, %d requests (want 1)", err, hits.Load())
	}
}

func TestErrorsNameTheCause(t *testing.T) {
	var status atomic.Int32
	var body atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
		io.WriteString(w, body.Load().(string))
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, Options{})
	for _, tc := range []struct {
		status int
		body   string
		kind   ctxd.Kind
		want   string
	}{
		{400, `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError","code":400}`, ctxd.KindDoesNotFit, "maximum context length"},
		{401, `{"error":{"message":"Invalid API Key","type":"authentication_error"}}`, ctxd.KindBackend, "backend.api_key"},
		{404, `{"detail":"The model 'x' does not exist."}`, ctxd.KindBackend, "backend.model"},
		{429, `{"error":{"message":"rate limited"}}`, ctxd.KindUnavailable, "busy"},
		{502, ``, ctxd.KindUnavailable, "502 Bad Gateway (a router or proxy in front of the engine found no engine answering"},
		{504, `upstream timed out`, ctxd.KindUnavailable, "no engine answering"},
	} {
		status.Store(int32(tc.status))
		body.Store(tc.body)
		_, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil)
		var ce *ctxd.Error
		if !errors.As(err, &ce) || ce.Kind != tc.kind || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), srv.URL) {
			t.Errorf("%d: %v, want kind %s naming %q and the server", tc.status, err, tc.kind, tc.want)
		}
	}
}

// TestIdleTimeout: a server that accepts a request and then sends
// nothing is given up on, and the error names the setting.
func TestIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := newClient(t, srv.URL, Options{IdleTimeout: 200 * time.Millisecond})
	_, err := c.Generate(t.Context(), ctxd.GenerateRequest{Prompt: "p"}, nil)
	if err == nil || !strings.Contains(err.Error(), "backend.idle_timeout") {
		t.Errorf("err = %v, want the idle timeout named", err)
	}
}

// TestTLSWithAGivenCA: an https server whose certificate chains to
// backend.ca_file is reached; without it, the error says what to set.
func TestTLSWithAGivenCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model","owned_by":"vllm","max_model_len":8192}]}`)
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	models, err := newClient(t, srv.URL, Options{CAFile: ca}).Models(t.Context())
	if err != nil || len(models) != 1 || models[0].Window() != 8192 {
		t.Fatalf("models over TLS: %+v %v", models, err)
	}
	if _, err := newClient(t, srv.URL, Options{}).Models(t.Context()); err == nil || !strings.Contains(err.Error(), "backend.ca_file") {
		t.Errorf("untrusted certificate: %v, want backend.ca_file named", err)
	}
	if _, err := New(srv.URL, Options{CAFile: filepath.Join(t.TempDir(), "none.pem")}); err == nil || !strings.Contains(err.Error(), "backend.ca_file") {
		t.Errorf("missing CA file: %v", err)
	}
}

func TestModels(t *testing.T) {
	var llama struct {
		Data []Model `json:"data"`
	}
	if err := json.Unmarshal([]byte(recorded(t, "llama-server-models.json")), &llama); err != nil {
		t.Fatal(err)
	}
	m, err := FindModel(llama.Data, "")
	if err != nil || m.Window() != 1024 || m.TrainedWindow() != 8192 {
		t.Errorf("llama-server's models: %+v %v (want each slot's n_ctx 1024, trained 8192)", m, err)
	}
	two := []Model{{ID: "b", MaxModelLen: 4096}, {ID: "a"}}
	if _, err := FindModel(two, ""); err == nil || !strings.Contains(err.Error(), "a, b") || !strings.Contains(err.Error(), "backend.model") {
		t.Errorf("several models, none named: %v", err)
	}
	if _, err := FindModel(two, "c"); err == nil || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("an unknown model: %v", err)
	}
	if m, err := FindModel(two, "b"); err != nil || m.Window() != 4096 {
		t.Errorf("vLLM's max_model_len: %+v %v", m, err)
	}
}

// TestTokenizeShapes: llama-server's /tokenize takes {"content"}, vLLM's
// and SGLang's {"model","prompt"} (and refuse the other shape with 422);
// the client finds which and keeps it. A server without the route says so.
func TestTokenizeShapes(t *testing.T) {
	var hits atomic.Int32
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		var req map[string]any
		json.NewDecoder(r.Body).Decode(&req)
		if _, ok := req["prompt"]; !ok || r.URL.Path != "/tokenize" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			io.WriteString(w, `{"detail":[{"loc":["body","prompt"],"msg":"Field required"}]}`)
			return
		}
		io.WriteString(w, `{"count":2,"max_model_len":8192,"tokens":[9906,1917]}`)
	}))
	defer vllm.Close()
	c := newClient(t, vllm.URL, Options{Model: "m"})
	for range 2 {
		if ids, err := c.Tokenize(t.Context(), "Hello world", false, true); err != nil || fmt.Sprint(ids) != "[9906 1917]" {
			t.Fatalf("vLLM tokenize: %v %v", ids, err)
		}
	}
	if hits.Load() != 3 {
		t.Errorf("%d requests for two counts: want 3 (the shape is found once)", hits.Load())
	}
	none := httptest.NewServer(http.NotFoundHandler())
	defer none.Close()
	if _, err := newClient(t, none.URL, Options{}).Tokenize(context.Background(), "x", false, true); !errors.Is(err, ErrNoTokenize) {
		t.Errorf("no /tokenize: %v", err)
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://x", "http://", "https://user:pw@host/v1"} {
		if _, err := New(u, Options{}); err == nil {
			t.Errorf("New(%q) = nil error", u)
		}
	}
	c := newClient(t, "https://engine.example:8000/v1/", Options{})
	if c.Addr() != "https://engine.example:8000" {
		t.Errorf("base = %q", c.Addr())
	}
}
