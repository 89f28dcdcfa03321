package integration

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/realmodel"
	"github.com/ctxd/ctxd/ollama"
	"github.com/ctxd/ctxd/openai"
)

// router stands where a cluster's prefix-aware router would: it passes
// each request on to the engine and keeps the routing headers it saw.
type router struct {
	mu     sync.Mutex
	seen   []http.Header
	engine *url.URL // where requests go: another engine from setEngine on
	srv    *httptest.Server
}

func newRouter(t *testing.T, engine string) *router {
	t.Helper()
	u, err := url.Parse(engine)
	if err != nil {
		t.Fatal(err)
	}
	r := &router{engine: u}
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		r.mu.Lock()
		defer r.mu.Unlock()
		pr.SetURL(r.engine)
	}}
	proxy.FlushInterval = -1 // stream as the engine does
	proxy.ErrorLog = log.New(testWriter{t}, "router: ", 0)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/completions" {
			r.mu.Lock()
			r.seen = append(r.seen, req.Header.Clone())
			r.mu.Unlock()
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// setEngine sends the requests from now on to engine (a base URL), as a
// cluster's router sends them to another worker when one is lost.
func (r *router) setEngine(t *testing.T, engine string) {
	t.Helper()
	u, err := url.Parse(engine)
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.engine = u
	r.mu.Unlock()
}

func (r *router) completions() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.seen...)
}

// TestOpenAIBackend runs sessions through the OpenAI backend in front of
// a real llama-server's OpenAI routes (/v1/completions, /v1/models), on
// a trained model, with a recording router between them: from turn 2
// the server reuses at least 95% of each prompt, as it reports in
// usage.prompt_tokens_details.cached_tokens; each request names its
// session's routing key (the same on every turn, another for another
// session), and a sub-agent's request at the OpenAI door names its
// parent's.
func TestOpenAIBackend(t *testing.T) {
	needLlamaServer(t)
	cfg := openaiConfig(t, t.TempDir(), codexDir(t, 3000))
	cfg.Backend.GGUF, cfg.Backend.Model = realmodel.Path(t, realmodel.SmolLM2), "smollm2"
	cfg.Backend.Slots = 2
	cfg.Limits.AnswerReserve = 24
	engine := llamaservertest.Start(t, cfg.Backend.GGUF, "-c", "8192", "-np", "2", "--alias", "smollm2")
	rt := newRouter(t, engine)
	cfg.Backend.URL = rt.srv.URL + "/v1"
	d := start(t, cfg, true)
	var st httpapi.Status
	if err := d.client.GetJSON(context.Background(), "/v1/status", &st); err != nil {
		t.Fatal(err)
	}
	if st.Backend.Kind != "openai" || st.Backend.NumCtx != 4096 || st.Backend.Format.Name != "template" {
		t.Fatalf("backend %+v: want kind openai, the server's 4096-token slot window, the model's template", st.Backend)
	}
	questions := []string{"What does Handler3 return?", "Which handler serves kind 7?", "Summarize the README.", "What does Handler5 return?"}
	for i, q := range questions {
		for _, session := range []string{"alpha", "beta"} {
			sum, _ := ask(t, d.client, session, q)
			if sum.BackendCachedTokens == nil {
				t.Fatalf("%s turn %d: the server's cached_tokens did not reach the summary", session, i+1)
			}
			reuse := float64(*sum.BackendCachedTokens) / float64(sum.PromptTokens)
			t.Logf("%s turn %d: %d prompt tokens, ctxd expected %d cached, the server reused %d (%.1f%%), ttft %.0f ms",
				session, sum.Turn, sum.PromptTokens, sum.CachedTokens, *sum.BackendCachedTokens, 100*reuse, sum.TTFTMillis)
			if sum.BackendPromptN != sum.PromptTokens {
				t.Errorf("%s turn %d: ctxd counted %d prompt tokens, the server %d", session, i+1, sum.PromptTokens, sum.BackendPromptN)
			}
			if i > 0 && reuse < 0.95 {
				t.Errorf("%s turn %d: the server reused %.1f%% of the prompt, want at least 95%% from turn 2", session, i+1, 100*reuse)
			}
		}
	}
	seen := rt.completions()
	if len(seen) != 2*len(questions)+1 { // +1: bring-up's one-token probe of a prompt of ids
		t.Fatalf("the router saw %d completions, want %d", len(seen), 2*len(questions)+1)
	}
	alpha, beta := openai.RoutingKey("alpha"), openai.RoutingKey("beta")
	for i, h := range seen[1:] {
		want := alpha
		if i%2 == 1 {
			want = beta
		}
		if h.Get("X-Dynamo-Session-ID") != want || h.Get("X-SMG-Routing-Key") != want || h.Get("X-Dynamo-Parent-Session-ID") != "" {
			t.Errorf("request %d: routing headers %v, want the session's key %s", i+1, h, want)
		}
	}
	// A sub-agent's request at the OpenAI door names its parent.
	chat := func(parent string) int {
		body := `{"model":"smollm2","messages":[{"role":"user","content":"List the handlers."}],"max_tokens":8}`
		return socketDo(t, cfg.Daemon.Socket, "/v1/chat/completions", body, http.Header{
			"X-Ctxd-Session": {"alpha-sub"}, "X-Ctxd-Parent-Session": {parent}})
	}
	if code := chat("alpha"); code != http.StatusOK {
		t.Fatalf("chat completion with a parent: %d", code)
	}
	last := rt.completions()
	h := last[len(last)-1]
	if h.Get("X-Dynamo-Session-ID") != openai.RoutingKey("alpha-sub") || h.Get("X-Dynamo-Parent-Session-ID") != alpha {
		t.Errorf("the sub-agent's request: %v, want its own key and its parent's %s", h, alpha)
	}
	if code := chat("not a session!"); code != http.StatusBadRequest {
		t.Errorf("a malformed parent: %d, want 400", code)
	}
}

// socketDo posts a JSON body with headers to the daemon's socket and
// returns the status.
func socketDo(t *testing.T, socket, path, body string, h http.Header) int {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, err := http.NewRequest(http.MethodPost, "http://ctxd"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestOpenAIBackendOnOllama runs the OpenAI backend against Ollama's
// OpenAI routes (/v1): Ollama takes no prompt of ids (bring-up finds that
// and sends text) and reports no cached tokens, so the summary says
// nothing of the backend's reuse rather than a guess.
func TestOpenAIBackendOnOllama(t *testing.T) {
	needOllama(t)
	srv := ollamatest.Start(t)
	model := testModel()
	ollamatest.Client(t, srv, "ctxd-oai", model, ollama.Options{})
	cfg := baseConfig(t, t.TempDir(), codexDir(t, 1500))
	cfg.Backend.Kind, cfg.Backend.Mode, cfg.Backend.Binary = "openai", "external", ""
	cfg.Backend.URL, cfg.Backend.Model, cfg.Backend.GGUF = srv.URL().String()+"/v1", "ctxd-oai", modelPath(t, model)
	d := start(t, cfg, true)
	for i, q := range []string{"What does Handler3 return?", "Which handler serves kind 7?"} {
		sum, text := ask(t, d.client, "o", q)
		t.Logf("turn %d: %d prompt tokens, backend %d, answer %q", i+1, sum.PromptTokens, sum.BackendPromptN, text)
		if sum.BackendCachedTokens != nil {
			t.Errorf("turn %d: backend cached %d, but Ollama reports none", i+1, *sum.BackendCachedTokens)
		}
		if sum.BackendPromptN == 0 || sum.DoneReason == "" {
			t.Errorf("turn %d: %+v: want Ollama's usage and a done reason", i+1, sum)
		}
	}
}

// TestOpenAIBackendKilledMidAnswer: the engine behind the OpenAI backend
// is killed in the middle of an answer (ctxd does not run it, so nothing
// restarts it). The client's error says the answer broke off and was not
// recorded; while no engine answers, an ask is refused as unavailable,
// naming the backend, and the daemon stays up; once an engine answers
// again behind the same URL (a new llama-server behind the router, as a
// cluster's router sends to another worker), the session goes on from the
// turns it recorded, with no restart of the daemon.
func TestOpenAIBackendKilledMidAnswer(t *testing.T) {
	needLlamaServer(t)
	cfg := openaiConfig(t, t.TempDir(), codexDir(t, 800))
	cfg.Limits.AnswerReserve = 1500 // an answer long enough to be killed in
	args := openAIServerArgs(cfg)
	first := llamaservertest.StartServer(t, cfg.Backend.GGUF, args...)
	rt := newRouter(t, first.URL)
	cfg.Backend.URL = rt.srv.URL
	d := startLogged(t, cfg, true)
	d.mustAsk(t, "k", "Say anything.")
	var (
		killed   time.Time
		killOnce sync.Once
	)
	_, err := d.ask("k", "Tell me a long story about the handlers.", func(string) {
		killOnce.Do(func() {
			killed = time.Now()
			first.Kill()
		})
	})
	if killed.IsZero() {
		t.Fatalf("no token streamed before the answer ended (%v)", err)
	}
	t.Logf("killed mid-answer: %s", wantError(t, err, "broke off", "not recorded"))
	_, err = d.ask("k", "Are you there?", nil)
	var api *client.APIError
	if !errors.As(err, &api) || api.Kind != ctxd.KindUnavailable {
		t.Errorf("with no engine behind the URL the ask gave %v; want an unavailable error", err)
	}
	t.Logf("no engine: %s", wantError(t, err, "502 Bad Gateway", "no engine answering"))
	var st httpapi.Status
	if err := client.New(cfg.Daemon.Socket).GetJSON(context.Background(), "/v1/status", &st); err != nil {
		t.Fatalf("the daemon did not stay up: %v", err)
	}
	second := llamaservertest.StartServer(t, cfg.Backend.GGUF, args...)
	rt.setEngine(t, second.URL)
	t.Logf("recovered: %s", d.recovery(t, "k", killed))
	sum, err := d.ask("k", "And now?", nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Turn != 3 {
		t.Errorf("turn %d after the recovery; want 3: the first answer and the recovery's recorded, the broken one not", sum.Turn)
	}
}

// TestOpenAIBackendCancelStopsTheEngine: a client that goes away in the
// middle of an answer stops the engine's work behind the OpenAI backend
// too (ctxd closes the completion's connection, and llama-server stops
// the slot): the engine's own count of the tokens it predicted (its
// /metrics) grows by far fewer than the answer reserve, and the cancelled
// answer is not recorded.
func TestOpenAIBackendCancelStopsTheEngine(t *testing.T) {
	needLlamaServer(t)
	cfg := openaiConfig(t, t.TempDir(), codexDir(t, 2000))
	cfg.Limits.AnswerReserve = 600
	engine := llamaservertest.StartServer(t, cfg.Backend.GGUF, append(openAIServerArgs(cfg), "--metrics")...)
	cfg.Backend.URL = engine.URL
	d := start(t, cfg, true)
	// metric is one of llama-server's metrics, once no request is being
	// processed.
	metric := func(name string) float64 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get(engine.URL + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			values := map[string]float64{}
			for _, line := range strings.Split(string(body), "\n") {
				if k, v, ok := strings.Cut(line, " "); ok && strings.HasPrefix(k, "llamacpp:") {
					f, _ := strconv.ParseFloat(v, 64)
					values[strings.TrimPrefix(k, "llamacpp:")] = f
				}
			}
			got, ok := values[name]
			if _, idle := values["requests_processing"]; !ok || !idle {
				t.Fatalf("llama-server's /metrics has no %s or requests_processing:\n%s", name, body)
			}
			if values["requests_processing"] == 0 {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("llama-server still processing a request 30 s on:\n%s", body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	before := metric("tokens_predicted_total")
	tokens := askAndCancel(t, d.client, "cancelled", "Tell me a very long story about every handler.")
	predicted := metric("tokens_predicted_total") - before
	t.Logf("cancelled after %d pieces; the engine predicted %.0f tokens of the answer (%d allowed)", tokens, predicted, cfg.Limits.AnswerReserve)
	if predicted > float64(cfg.Limits.AnswerReserve)/3 {
		t.Errorf("the engine predicted %.0f tokens of the cancelled answer (allowed %d): it did not stop", predicted, cfg.Limits.AnswerReserve)
	}
	var s ctxd.SessionTurns
	if err := d.client.GetJSON(context.Background(), "/v1/sessions/cancelled", &s); err != nil || len(s.Turns) != 0 {
		t.Errorf("the cancelled answer was recorded: %+v %v", s, err)
	}
	// The control: an answer left to run predicts its tokens, counted so.
	ask(t, d.client, "control", "Tell me a very long story about every handler.")
	if control := metric("tokens_predicted_total") - before - predicted; control < float64(tokens) {
		t.Errorf("an answer left to run counted %.0f predicted tokens: the metric does not count what this test needs", control)
	} else {
		t.Logf("an answer left to run: %.0f tokens predicted", control)
	}
}
