package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/socktest"
	"github.com/ctxd/ctxd/sigils"
)

// tcpFixture is a daemon with the TCP listener on and a token for sigil
// "coder".
func tcpFixture(t *testing.T) (*fixture, string, string) {
	t.Helper()
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen = "127.0.0.1:0"
		c.Sigils["coder"] = config.Sigil{Scopes: []string{"ask", "search_codex"}, TokenSHA256: hash}
	}})
	return f, listening(t, f.srv.TCPAddr), tok
}

func tcpDo(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestTCPListenerNeedsTokens: on the TCP listener every request but the
// health probes carries a sigil's token, refused in the shape of the
// route's door when it is missing or wrong, and acts as that sigil.
func TestTCPListenerNeedsTokens(t *testing.T) {
	f, base, tok := tcpFixture(t)
	chat := `{"model":"fake","messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		method, path, body, token string
		status                    int
		shape                     string // a fragment of the error's shape
	}{
		{"GET", "/v1/health", "", "", 200, `"ready"`},
		{"GET", "/", "", "", 200, "Ollama is running"},
		{"POST", "/v1/ask", `{"session":"s","query":"q"}`, "", 401, `"kind": "unauthorized"`},
		{"GET", "/v1/status", "", "", 401, "needs a sigil's token"},
		{"POST", "/v1/chat/completions", chat, "", 401, `"code":"invalid_api_key"`},
		{"POST", "/v1/chat/completions", chat, "ctxd_wrong", 401, `"type":"authentication_error"`},
		{"POST", "/api/chat", chat, "", 401, `{"error":"this listener needs`},
		{"GET", "/api/tags", "", "sk-dummy", 401, `{"error":"Authorization: the token matches no sigil`},
		{"GET", "/t/ctxd_wrong/api/tags", "", "", 401, `{"error":"Authorization: the token matches no sigil`},
		{"GET", "/t/" + tok + "/api/tags", "", "", 200, `"models"`},
		{"GET", "/t/" + tok + "/api/tags", "", tok, 400, `in both the path and the Authorization header`},
		{"GET", "/t/" + tok + "/api/nothing", "", "", 404, `no route GET /api/nothing`},
		{"GET", "/t/" + tok + "/v1/sigil", "", "", 200, `"name": "coder"`},
	} {
		status, body := tcpDo(t, c.method, base+c.path, c.token, c.body)
		if status != c.status || !strings.Contains(body, c.shape) || strings.Contains(body, tok) {
			t.Errorf("%s %s (token %q): %d %s; want %d with %s", c.method, c.path, c.token, status, body, c.status, c.shape)
		}
	}

	c := client.NewTCP(base, client.WithToken(tok))
	who, err := c.Sigil(t.Context())
	if err != nil || who.Name != "coder" || !who.Authenticated {
		t.Fatalf("sigil over TCP: %+v %v", who, err)
	}
	sum, err := c.Ask(t.Context(), ctxd.AskRequest{Session: "tcp", Query: "hello"}, nil)
	if err != nil || sum.Turn != 1 {
		t.Fatalf("ask over TCP: %+v %v", sum, err)
	}
	// A token may not act as another sigil.
	_, err = c.Ask(t.Context(), ctxd.AskRequest{Session: "tcp", Query: "again", Sigil: "default"}, nil)
	if e, ok := err.(*client.APIError); !ok || e.Status != 403 || !strings.Contains(e.Message, `may not act as sigil "default"`) {
		t.Errorf("token of coder naming default: %v", err)
	}
	status, body := tcpDo(t, "POST", base+"/v1/chat/completions", tok, chat)
	var cc struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	if json.Unmarshal([]byte(body), &cc); status != 200 || cc.Usage.PromptTokens == 0 {
		t.Errorf("chat over TCP with the token: %d %s", status, body)
	}

	// On the socket a request needs no token, but a wrong one is refused.
	if who, err := f.client.Sigil(t.Context()); err != nil || who.Name != "default" || who.Authenticated {
		t.Errorf("socket without a token: %+v %v", who, err)
	}
	if _, err := client.New(f.cfg.Daemon.Socket, client.WithToken("ctxd_nope")).Sigil(t.Context()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("socket with a wrong token: %v", err)
	}
	if who, err := client.New(f.cfg.Daemon.Socket, client.WithToken(tok)).Sigil(t.Context()); err != nil || who.Name != "coder" {
		t.Errorf("socket with the token: %+v %v", who, err)
	}
}

// TestDoorsOnTheSocket: an OpenAI client resending its history keeps one
// session whose prompts extend each other, as the native API's do.
func TestDoorsOnTheSocket(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	f.backend.SetAnswer("fine")
	msgs := []map[string]string{{"role": "system", "content": "Be kind."}}
	var cached []int
	for i, q := range []string{"one", "two", "three"} {
		msgs = append(msgs, map[string]string{"role": "user", "content": q})
		b, _ := json.Marshal(map[string]any{"model": "fake", "messages": msgs})
		status, body := f.do(t, "POST", "/v1/chat/completions", "application/json", string(b))
		var c struct {
			Choices []struct {
				Message struct{ Content string }
			}
			Usage struct {
				Prompt  int `json:"prompt_tokens"`
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
			Ctxd ctxd.Summary
		}
		if err := json.Unmarshal([]byte(body), &c); err != nil || status != 200 {
			t.Fatalf("turn %d: %d %s", i+1, status, body)
		}
		if c.Ctxd.Turn != i+1 || c.Ctxd.PrefixBreak != nil {
			t.Errorf("turn %d: summary turn %d break %+v", i+1, c.Ctxd.Turn, c.Ctxd.PrefixBreak)
		}
		cached = append(cached, c.Usage.Details.Cached)
		msgs = append(msgs, map[string]string{"role": "assistant", "content": c.Choices[0].Message.Content})
	}
	if cached[1] == 0 || cached[2] <= cached[1] {
		t.Errorf("cached tokens per turn %v: each turn should reuse the one before", cached)
	}
	sessions, err := f.client.Sessions(t.Context())
	if err != nil || len(sessions) != 1 || sessions[0].Turns != 3 || !strings.HasPrefix(sessions[0].ID, "oai-") {
		t.Errorf("sessions %+v %v", sessions, err)
	}
}

// TestSigilRejections walks every way a request can be refused for its
// sigil, each with a status and a message that says why: a missing, wrong
// or revoked token (401), a revoked sigil, a socket peer whose uid the
// sigil does not allow, a scope the sigil lacks or a request tries to
// widen (403), and a tool call outside the sigil's scopes (refused in the
// summary: the answer stays text).
func TestSigilRejections(t *testing.T) {
	tok, hash, _ := sigils.NewToken()
	old, oldHash, _ := sigils.NewToken()
	retiredTok, retiredHash, _ := sigils.NewToken()
	uid := os.Getuid()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen = "127.0.0.1:0"
		c.Sigils["coder"] = config.Sigil{Scopes: []string{"ask", "search_codex", "tool:grep"}, TokenSHA256: hash, RevokedSHA256: []string{oldHash}}
		c.Sigils["retired"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: retiredHash, Revoked: true}
		c.Sigils["ops"] = config.Sigil{Scopes: []string{"ask"}, UIDs: []int{uid + 1}}
		c.Sigils["mine"] = config.Sigil{Scopes: []string{"ask"}, UIDs: []int{uid}, GIDs: []int{os.Getgid()}}
		c.Sigils["reader"] = config.Sigil{Scopes: []string{"search_codex"}}
	}})
	var base string
	for deadline := time.Now().Add(10 * time.Second); base == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if a := f.srv.TCPAddr(); a != "" {
			base = "http://" + a
		}
	}
	if base == "" {
		t.Fatal("the TCP listener never listened")
	}
	ask := `{"session":"s","query":"q"}`
	for _, c := range []struct {
		name, token, body string
		status            int
		want              string
	}{
		{"missing token", "", ask, 401, "needs a sigil's token"},
		{"wrong token", "ctxd_wrong", ask, 401, "matches no sigil"},
		{"revoked token", old, ask, 401, `one of sigil \"coder\"'s revoked tokens`},
		{"revoked sigil's token", retiredTok, ask, 401, `sigil \"retired\" is revoked`},
	} {
		status, body := tcpDo(t, "POST", base+"/v1/ask", c.token, c.body)
		if status != c.status || !strings.Contains(body, c.want) || (c.token != "" && strings.Contains(body, c.token)) {
			t.Errorf("%s: %d %s; want %d with %s", c.name, status, body, c.status, c.want)
		}
	}
	if status, body := tcpDo(t, "POST", base+"/v1/ask", tok, ask); status != 200 {
		t.Errorf("the current token: %d %s", status, body)
	}

	for _, c := range []struct {
		name   string
		header http.Header
		path   string
		body   string
		status int
		want   string
	}{
		{"revoked sigil named", nil, "/v1/ask", `{"session":"s","query":"q","sigil":"retired"}`, 403, `sigil \"retired\" is revoked`},
		{"unknown sigil", nil, "/v1/ask", `{"session":"s","query":"q","sigil":"nobody"}`, 403, `unknown sigil \"nobody\"`},
		{"wrong uid", nil, "/v1/ask", `{"session":"s","query":"q","sigil":"ops"}`, 403, fmt.Sprintf("runs as uid %d", uid)},
		{"right uid and gid", nil, "/v1/ask", `{"session":"s2","query":"q","sigil":"mine"}`, 200, `"summary"`},
		{"wrong uid at a door", http.Header{"X-Ctxd-Sigil": {"ops"}}, "/v1/chat/completions", `{"model":"fake","messages":[{"role":"user","content":"q"}]}`, 403, "runs as uid"},
		{"scope lacking", nil, "/v1/ask", `{"session":"s","query":"q","sigil":"reader"}`, 403, `lacks the \"ask\" scope`},
		{"scope widened", nil, "/v1/ask", `{"session":"s","query":"q","sigil":"coder","scopes":["ask","karma:write"]}`, 403, `asks for scope \"karma:write\", which sigil \"coder\" does not hold`},
		{"scope narrowed away", http.Header{"X-Ctxd-Scopes": {"ask"}}, "/v1/codex/search?q=x&sigil=coder", "", 403, `lacks the \"search_codex\" scope`},
		{"scope narrowed by a door", http.Header{"X-Ctxd-Sigil": {"coder"}, "X-Ctxd-Scopes": {"search_codex"}}, "/v1/chat/completions", `{"model":"fake","messages":[{"role":"user","content":"q"}]}`, 403, `lacks the \"ask\" scope`},
	} {
		h := c.header.Clone()
		if h == nil {
			h = http.Header{}
		}
		h.Set("Content-Type", "application/json")
		method := "POST"
		if c.body == "" {
			method = "GET"
		}
		status, body := socktest.DoHeader(t, f.cfg.Daemon.Socket, method, c.path, h, c.body)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s; want %d with %s", c.name, status, body, c.status, c.want)
		}
	}

	// Offering a tool the sigil may not offer is refused, naming it.
	hdr := http.Header{"X-Ctxd-Sigil": {"coder"}, "Content-Type": {"application/json"}}
	body := `{"model":"fake","messages":[{"role":"user","content":"clean up"}],"tools":[` +
		`{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}},` +
		`{"type":"function","function":{"name":"rm","parameters":{"type":"object"}}}]}`
	if status, out := socktest.DoHeader(t, f.cfg.Daemon.Socket, "POST", "/v1/chat/completions", hdr, body); status != 403 || !strings.Contains(out, "tools rm") {
		t.Errorf("a tool outside the sigil's scopes offered: %d %s", status, out)
	}

	// The model calls a tool it was not offered: refused, the answer
	// stays text, and the summary names it.
	f.backend.SetAnswer(`{"name": "rm", "arguments": {"path": "/"}}`)
	body = `{"model":"fake","messages":[{"role":"user","content":"clean up"}],"tools":[` +
		`{"type":"function","function":{"name":"grep","parameters":{"type":"object"}}}]}`
	status, out := socktest.DoHeader(t, f.cfg.Daemon.Socket, "POST", "/v1/chat/completions", hdr, body)
	var cc struct {
		Choices []struct {
			Message struct {
				Content   string
				ToolCalls []any `json:"tool_calls"`
			}
		}
		Ctxd ctxd.Summary
	}
	if err := json.Unmarshal([]byte(out), &cc); err != nil || status != 200 || len(cc.Choices) != 1 {
		t.Fatalf("tool outside scope: %d %s", status, out)
	}
	if len(cc.Choices[0].Message.ToolCalls) != 0 || !slices.Contains(cc.Ctxd.ToolsRefused, "rm") || !strings.Contains(cc.Ctxd.ToolNote, "rm") {
		t.Errorf("tool outside scope: message %+v refused %v note %q", cc.Choices[0].Message, cc.Ctxd.ToolsRefused, cc.Ctxd.ToolNote)
	}
}
