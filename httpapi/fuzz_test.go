package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
)

// askSeeds are bodies of POST /v1/ask, valid and not.
var askSeeds = []string{
	`{"session":"s1","query":"What does Serve do?"}`,
	`{"session":"s1","query":"and then?","pin":true,"system":"Be terse.","max_tokens":16,"refresh_karma":true}`,
	`{"session":"s2","query":"q","history":[{"query":"q0","answer":"a0","excerpts":[{"path":"a.go","lines":"1-2","text":"x"}]}]}`,
	`{"session":"s2","query":"q","history":[]}`,
	`{"session":"s3","query":"q","tools":[{"name":"grep","parameters":{"type":"object"}}],"scopes":["ask"]}`,
	`{"session":"../etc/passwd","query":"q"}`,
	`{"session":"s","query":"  "}`,
	`{"session":"s","query":"q","sigil":"root"}`,
	`{"session":"s","query":"q","temperature":2}`,
	`{"session":"s","query":"q"} {"session":"t"}`,
	`{"session":"s","query":"q"}}`,
	`{"session":"s","query":"q","max_tokens":-1}`,
	`{"SESSION":"s","Query":"q"}`,
	`{"session":"s","query":"\ud800\u0000"}`,
	`[]`,
	`null`,
	``,
	`{"session":"s",`,
}

// decodingServer is a server that only decodes: decodeJSON reads nothing
// but its configuration.
func decodingServer(maxBody int64) *Server {
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: os.TempDir()})
	cfg.Daemon.MaxBodyBytes = maxBody
	return &Server{cfg: Config{Daemon: cfg.Daemon}}
}

// FuzzDecodeAskRequest decodes any body, with any content type, as
// /v1/ask does. It is refused with an error of a client's kind that names
// the problem, or it is one JSON object with no unknown field whose
// request encodes to a body that decodes to the same request.
func FuzzDecodeAskRequest(f *testing.F) {
	for _, s := range askSeeds {
		f.Add("application/json", []byte(s))
	}
	f.Add("", []byte(askSeeds[0]))
	f.Add("application/json; charset=utf-8", []byte(askSeeds[1]))
	f.Add("text/plain", []byte(askSeeds[0]))
	f.Add("application/x-www-form-urlencoded", []byte("session=s&query=q"))
	d := decodingServer(4096)
	decode := func(ct string, body []byte) (ctxd.AskRequest, error) {
		r := httptest.NewRequest(http.MethodPost, "/v1/ask", bytes.NewReader(body))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		var req ctxd.AskRequest
		err := d.decodeJSON(httptest.NewRecorder(), r, &req, `{"session": ..., "query": ...}`)
		return req, err
	}
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		req, err := decode(contentType, body)
		if err != nil {
			switch k := ctxd.KindOf(err); {
			case k != ctxd.KindInvalid && k != ctxd.KindTooLarge && k != ctxd.KindUnsupported:
				t.Fatalf("%q: error of kind %s: %v", body, k, err)
			case k == ctxd.KindTooLarge && int64(len(body)) <= d.cfg.Daemon.MaxBodyBytes:
				t.Fatalf("%d bytes refused as too large: %v", len(body), err)
			case !strings.Contains(err.Error(), "body") && !strings.Contains(err.Error(), "content type"):
				t.Fatalf("%q: the error does not say what was wrong: %v", body, err)
			}
			return
		}
		if contentType != "" && !strings.HasPrefix(contentType, "application/json") {
			t.Fatalf("content type %q taken", contentType)
		}
		if !json.Valid(body) {
			t.Fatalf("%q is not one JSON value, and was taken as %+v", body, req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("%+v does not encode: %v", req, err)
		}
		back, err := decode("application/json", again)
		if err != nil && ctxd.KindOf(err) == ctxd.KindTooLarge {
			return // the encoding is longer (escapes) than the cap
		}
		if err != nil || !reflect.DeepEqual(meaningOf(t, back), meaningOf(t, req)) {
			t.Fatalf("%q decodes to %+v, which encodes to %s, which decodes to %+v (%v)", body, req, again, back, err)
		}
	})
}

// fuzzServer is the HTTP surface on fakes (a scripted backend, an
// in-memory store, two slots) serving on a Unix socket until the fuzz
// target ends, logging nowhere: the fuzzer sends it many requests. It
// returns the socket.
func fuzzServer(f *testing.F) string {
	f.Helper()
	fx := newFixture(f, fixtureOptions{slots: 2, quiet: true, config: func(c *config.Config) {
		c.Daemon.MaxBodyBytes = 1 << 16
		c.Codex.Path = ""
		c.Sigils = map[string]config.Sigil{"default": {Scopes: []string{"ask", "sessions:read", "sessions:write", "karma:read", "karma:write"}}, "coder": {Scopes: []string{"ask", "tool:grep"}}}
	}})
	return fx.cfg.Daemon.Socket
}

// unixClient is an HTTP client of the daemon's socket that keeps its
// connections.
func unixClient(socket string) *http.Client {
	return &http.Client{Timeout: wsGuard, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
}

// FuzzAskEndpoint sends any body to POST /v1/ask of a daemon on fakes.
// The answer is an error of a client's kind (4xx) that names the problem,
// or a stream of events whose last is the summary or an error; nothing a
// client sends is a server error.
func FuzzAskEndpoint(f *testing.F) {
	for _, s := range askSeeds {
		f.Add([]byte(s))
	}
	hc := unixClient(fuzzServer(f))
	f.Fuzz(func(t *testing.T, body []byte) {
		resp, err := hc.Post("http://ctxd/v1/ask", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%q: reading the answer: %v", body, err)
		}
		if resp.StatusCode != http.StatusOK {
			var e errorBody
			if err := json.Unmarshal(out, &e); err != nil || e.Error == "" || e.Kind.Status() != resp.StatusCode {
				t.Fatalf("%q: status %d with a body not in the API's error shape (%v): %s", body, resp.StatusCode, err, out)
			}
			if resp.StatusCode >= 500 {
				t.Fatalf("%q: status %d (a client's body is never a server error): %s", body, resp.StatusCode, out)
			}
			return
		}
		var last ctxd.Event
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
				t.Fatalf("%q: bad NDJSON line %q: %v", body, sc.Text(), err)
			}
		}
		switch {
		case last.Type == ctxd.EventSummary && last.Summary != nil:
			if ctxd.CheckSessionID(last.Summary.Session) != nil {
				t.Fatalf("%q: answered in session %q", body, last.Summary.Session)
			}
		case last.Type == ctxd.EventError && last.Error != "":
			if last.Status >= 500 {
				t.Fatalf("%q: the stream ended with a server error: %+v", body, last)
			}
		default:
			t.Fatalf("%q: the stream ends with %+v, not a summary or an error", body, last)
		}
	})
}

// probeID names the message each input is followed by: an unknown type,
// answered with an error that carries it.
const probeID = "fuzz-probe"

// FuzzWSMessage sends any text message on one WebSocket connection to a
// daemon on fakes, then a probe. The connection stays usable (the probe is
// answered); every answer to the message is tied to its id (or to none,
// for a message that has no usable id); errors say what was wrong with a
// client's kind; and an ask with an id ends with exactly one summary or
// error.
func FuzzWSMessage(f *testing.F) {
	seeds := []string{
		`{"type":"ask","id":"a1","session":"s","query":"What does Serve do?"}`,
		`{"type":"ask","id":"a2","session":"s","query":"q","pin":true,"system":"terse","max_tokens":8,"history":[{"query":"q0","answer":"a0"}]}`,
		`{"type":"ask","id":"a3","session":"s","query":"q","sigil":"coder"}`,
		`{"type":"ask","id":"a4","session":"../etc","query":"q"}`,
		`{"type":"ask","id":"a5","session":"s","query":"q","temperature":2}`,
		`{"type":"ask","session":"s","query":"hi"}`,
		`{"type":"cancel","id":"never"}`,
		`{"type":"cancel"}`,
		`{"type":"feedback","id":"f1","trace":1,"action":"verify"}`,
		`{"type":"feedback","id":"f2","turn":1}`,
		`{"type":"dance","id":"d1"}`,
		`{"id":"x1"}`,
		`{"type":"ask","id":"a6","session":"s"`,
		`[1,2]`,
		`"ask"`,
		``,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	socket := fuzzServer(f)
	dial := func(tb testing.TB) *websocket.Conn {
		ws, _, err := websocket.Dial(context.Background(), "ws://ctxd/v1/ws", &websocket.DialOptions{HTTPClient: unixClient(socket)})
		if err != nil {
			tb.Fatal(err)
		}
		ws.SetReadLimit(16 << 20)
		return ws
	}
	ws := dial(f)
	f.Cleanup(func() { _ = ws.CloseNow() })
	probe, _ := json.Marshal(ctxd.WSMessage{Type: "probe", ID: probeID})
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) > 1<<15 {
			return // over daemon.max_body_bytes the connection is closed, as it should be
		}
		defer func() {
			if t.Failed() { // a fresh connection for the next input: this one's answers are not all read
				_ = ws.CloseNow()
				ws = dial(t)
			}
		}()
		var head struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		}
		parsed := json.Unmarshal(msg, &head) == nil
		if head.ID == probeID {
			return
		}
		ctx, cancel := context.WithTimeout(t.Context(), wsGuard)
		defer cancel()
		for _, m := range [][]byte{msg, probe} {
			if err := ws.Write(ctx, websocket.MessageText, m); err != nil {
				t.Fatalf("%q: the connection no longer takes messages: %v", msg, err)
			}
		}
		// An ask with an id ends with its own last message; wait for it as
		// well as for the probe's answer.
		askID := ""
		if parsed && head.Type == ctxd.WSAsk {
			askID = head.ID
		}
		probed, ended := false, askID == ""
		for !probed || !ended {
			_, b, err := ws.Read(ctx)
			if err != nil {
				t.Fatalf("%q: the connection ended or went quiet (probed %v, ask ended %v): %v", msg, probed, ended, err)
			}
			var m ctxd.WSMessage
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("%q: the daemon sent %q: %v", msg, b, err)
			}
			switch {
			case m.Type == ctxd.WSNotice:
				continue
			case m.ID == probeID:
				if m.Type != ctxd.WSError || m.Kind != ctxd.KindInvalid {
					t.Fatalf("%q: the probe was answered %+v", msg, m)
				}
				probed = true
				continue
			case m.ID != "" && m.ID != head.ID:
				t.Fatalf("%q: an answer for id %q: %+v", msg, m.ID, m)
			}
			switch m.Type {
			case ctxd.WSError:
				// Unavailable: what the daemon cannot do now (karma off).
				if m.Error == "" || m.Status != m.Kind.Status() || m.Status >= 500 && m.Kind != ctxd.KindUnavailable {
					t.Fatalf("%q: error %+v: it must say what was wrong, with a client's kind", msg, m)
				}
			case ctxd.WSToken, ctxd.WSSummary:
				if askID == "" || m.ID != askID {
					t.Fatalf("%q: %s message %+v for no ask", msg, m.Type, m)
				}
			case ctxd.WSFeedback:
				if !parsed || head.Type != ctxd.WSFeedback {
					t.Fatalf("%q: a feedback answer %+v", msg, m)
				}
			default:
				t.Fatalf("%q: answered %+v", msg, m)
			}
			if askID != "" && m.ID == askID && (m.Type == ctxd.WSSummary || m.Type == ctxd.WSError) {
				if ended {
					t.Fatalf("%q: a second last message for ask %q: %+v", msg, askID, m)
				}
				ended = true
			}
		}
	})
}

// meaningOf is req with what its encoding may change without changing
// its meaning made alike: an empty list of tools, scopes or excerpts is
// none (a history is not: an empty one is followed), and a tool's
// parameters are compacted.
func meaningOf(t *testing.T, req ctxd.AskRequest) ctxd.AskRequest {
	t.Helper()
	if len(req.Tools) == 0 {
		req.Tools = nil
	}
	if len(req.Scopes) == 0 {
		req.Scopes = nil
	}
	req.History = slices.Clone(req.History)
	for i := range req.History {
		if len(req.History[i].Excerpts) == 0 {
			req.History[i].Excerpts = nil
		}
	}
	req.Tools = slices.Clone(req.Tools)
	for i, tool := range req.Tools {
		if tool.Parameters == nil {
			continue
		}
		var b bytes.Buffer
		if err := json.Compact(&b, tool.Parameters); err != nil {
			t.Fatalf("tools[%d].parameters %q taken but not JSON: %v", i, tool.Parameters, err)
		}
		req.Tools[i].Parameters = b.Bytes()
	}
	return req
}
