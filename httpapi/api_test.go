package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/daemontest"
	"github.com/ctxd/ctxd/internal/fake"
)

// TestEveryRoute exercises every route and error status with no backend.
func TestEveryRoute(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{numCtx: 20000, config: func(c *config.Config) {
		c.Daemon.MaxBodyBytes = 64 << 10
		c.Limits.MaxChars = 40000
	}})
	f.ask(t, "kept", "What does Serve do?")
	other := daemontest.SmallCodex(t)
	big := `{"session":"s","query":"` + strings.Repeat("x", 70<<10) + `"}`
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		mention                         string
	}{
		{"health", "GET", "/v1/health", "", "", 200, "ready"},
		{"status", "GET", "/v1/status", "", "", 200, `"scheduler"`},
		{"schema", "GET", "/v1/schema", "", "", 200, `"RunContext"`},
		{"ask", "POST", "/v1/ask", "application/json", `{"session":"a","query":"hi"}`, 200, `"type":"summary"`},
		{"malformed JSON", "POST", "/v1/ask", "application/json", `{"session": "s", "query": `, 400, "malformed JSON"},
		{"missing query", "POST", "/v1/ask", "application/json", `{"session": "s"}`, 400, "query"},
		{"blank query", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "  "}`, 400, "query"},
		{"missing session", "POST", "/v1/ask", "application/json", `{"query": "hi"}`, 400, "session"},
		{"bad session format", "POST", "/v1/ask", "application/json", `{"session": "../../etc", "query": "hi"}`, 400, "session"},
		{"unknown field", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi", "temperature": 2}`, 400, "temperature"},
		{"two values", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi"} {}`, 400, "follows the JSON value"},
		{"empty body", "POST", "/v1/ask", "application/json", ``, 400, "empty body"},
		{"wrong content type", "POST", "/v1/ask", "text/plain", `{"session": "s", "query": "hi"}`, 415, "application/json"},
		{"oversized body", "POST", "/v1/ask", "application/json", big, 413, "max_body_bytes"},
		{"over the window", "POST", "/v1/ask", "application/json", `{"session":"w","query":"` + strings.Repeat("word ", 5000) + `"}`, 422, "reserved for the answer"},
		{"over the char cap", "POST", "/v1/ask", "application/json", `{"session":"c","query":"` + strings.Repeat("y", 45000) + `"}`, 422, "over the cap of 40000"},
		{"unknown sigil", "POST", "/v1/ask", "application/json", `{"session": "s", "query": "hi", "sigil": "root"}`, 403, "root"},
		{"unknown route", "GET", "/v2/ask", "", ``, 404, "no route"},
		{"wrong method", "GET", "/v1/ask", "", ``, 405, "use POST"},
		{"wrong method on prompt", "POST", "/v1/sessions/kept/prompt", "", ``, 405, "use GET"},
		{"sessions", "GET", "/v1/sessions", "", "", 200, `"kept"`},
		{"session", "GET", "/v1/sessions/kept", "", "", 200, "What does Serve do?"},
		{"bad session id in path", "GET", "/v1/sessions/a%20b", "", ``, 400, "session"},
		{"prompt", "GET", "/v1/sessions/kept/prompt", "", "", 200, "### IDENTITY"},
		{"prompt of a bad session id", "GET", "/v1/sessions/a%20b/prompt", "", ``, 400, "session"},
		{"prompt of a session that sent none", "GET", "/v1/sessions/never/prompt", "", ``, 404, "sent no prompt"},
		{"codex stats", "GET", "/v1/codex", "", "", 200, `"mode": "cag"`},
		{"codex load", "POST", "/v1/codex/load", "application/json", `{"path":"` + other + `"}`, 200, `"type":"codex"`},
		{"codex load of a relative path", "POST", "/v1/codex/load", "application/json", `{"path":"relative/dir"}`, 400, "absolute"},
		{"codex load of a missing path", "POST", "/v1/codex/load", "application/json", `{"path":"/no/such/dir"}`, 400, "no such file"},
		{"codex load without a path", "POST", "/v1/codex/load", "application/json", `{}`, 400, "path: required"},
		{"codex load of a bad body", "POST", "/v1/codex/load", "application/json", `{"path": 5}`, 400, "malformed"},
		{"codex search without the scope", "GET", "/v1/codex/search?q=x", "", "", 403, "search_codex"},
		{"codex search without q", "GET", "/v1/codex/search?sigil=coder", "", "", 400, "q: required"},
		{"codex search with a bad k", "GET", "/v1/codex/search?sigil=coder&q=x&k=99", "", "", 400, "from 1 to 50"},
		{"codex search of a whole codex", "GET", "/v1/codex/search?sigil=coder&q=x", "", "", 409, "CAG"},
		{"wrong method on codex", "DELETE", "/v1/codex", "", "", 405, "use GET"},
		{"delete session", "DELETE", "/v1/sessions/a", "", "", 204, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := f.do(t, c.method, c.path, c.ctype, c.body)
			if status != c.status {
				t.Fatalf("status %d, want %d; body %.300s", status, c.status, body)
			}
			if !strings.Contains(body, c.mention) {
				t.Errorf("body %.300s does not mention %q", body, c.mention)
			}
			if status >= 400 {
				var e errorBody
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == "" || e.Kind == "" {
					t.Errorf("body %q is not a JSON error with a kind", body)
				}
			}
		})
	}
	// A backend that fails: 502 before the stream starts.
	f.backend.FailNext(ctxd.Errorf(ctxd.KindBackend, "fake: the model crashed"))
	if status, body := f.do(t, "POST", "/v1/ask", "application/json", `{"session":"b","query":"hi"}`); status != 502 || !strings.Contains(body, "crashed") {
		t.Errorf("backend failure: %d %s", status, body)
	}
	// Still up and answering after all that.
	if sum := f.ask(t, "after-errors", "still there?"); sum.Turn != 1 {
		t.Errorf("session after errors: %+v", sum)
	}
}

// TestEightSessionsOnTwoSlots: 8 agents at once on a backend with 2 slots:
// at most 2 generate at once, status and health answer while both slots
// are busy, all 8 finish, and no request waits behind more than the 7
// other sessions.
func TestEightSessionsOnTwoSlots(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{slots: 2})
	f.backend.Hold()
	const agents, turns = 8, 3
	var wg sync.WaitGroup
	sums := make(chan *ctxd.Summary, agents*turns)
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for turn := range turns {
				sum, err := f.client.Ask(context.Background(), ctxd.AskRequest{Session: fmt.Sprint("agent-", i), Query: fmt.Sprint("question ", turn)}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				sums <- sum
			}
		}()
	}
	// Both slots busy, six agents queued: status and health still answer.
	daemontest.WaitFor(t, func() bool {
		var st Status
		return f.client.GetJSON(context.Background(), "/v1/status", &st) == nil &&
			st.Scheduler != nil && st.Scheduler.Busy == 2 && len(st.Scheduler.Waiting) == agents-2
	})
	if status, _ := f.do(t, "GET", "/v1/health", "", ""); status != 200 {
		t.Errorf("health while both slots are busy: %d", status)
	}
	if status, _ := f.do(t, "GET", "/v1/sessions", "", ""); status != 200 {
		t.Errorf("sessions while both slots are busy: %d", status)
	}
	f.backend.Release()
	wg.Wait()
	close(sums)
	if m := f.backend.MaxRunning(); m != 2 {
		t.Errorf("%d generations at most at once on 2 slots, want 2: no more, and no fewer", m)
	}
	n := 0
	for sum := range sums {
		n++
		if sum.QueueAhead > agents-1 {
			t.Errorf("%s turn %d waited behind %d requests; only %d other sessions exist", sum.Session, sum.Turn, sum.QueueAhead, agents-1)
		}
	}
	if n != agents*turns {
		t.Errorf("%d answers, want %d", n, agents*turns)
	}
	list, _ := f.store.Sessions(context.Background())
	for _, s := range list {
		if s.Turns != turns {
			t.Errorf("session %s recorded %d turns, want %d", s.ID, s.Turns, turns)
		}
	}
}

// gatedTokenizer blocks codex file counts until released: a codex load
// that takes as long as the test wants.
type gatedTokenizer struct {
	fake.Tokenizer
	gate chan struct{}
}

func (g *gatedTokenizer) CountText(s string) (int, error) {
	<-g.gate
	return len(s), nil
}

// TestReadsNeverWaitForALoadOrAGeneration reproduces the old freeze: an
// answer in progress and a codex reload queued behind it made status and
// health wait. Now neither waits for either.
func TestReadsNeverWaitForALoadOrAGeneration(t *testing.T) {
	t.Parallel()
	tok := &gatedTokenizer{gate: make(chan struct{})}
	close(tok.gate) // the start-up load runs through
	f := newFixture(t, fixtureOptions{tok: tok})
	tok.gate = make(chan struct{})
	f.backend.Hold()
	asked := make(chan error, 1)
	go func() {
		_, err := f.client.Ask(context.Background(), ctxd.AskRequest{Session: "s", Query: "held"}, nil)
		asked <- err
	}()
	<-f.backend.Started()
	other := daemontest.SmallCodex(t)
	if err := os.WriteFile(filepath.Join(other, "new.go"), []byte("package main\n\n// New content: counted, so the load waits.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	loaded := make(chan error, 1)
	go func() {
		_, err := f.client.LoadCodex(context.Background(), other, nil)
		loaded <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the load reach the tokenizer
	for _, path := range []string{"/v1/health", "/v1/status", "/v1/schema", "/v1/sessions", "/v1/sessions/s", "/v1/codex"} {
		done := make(chan int, 1)
		go func() { status, _ := f.do(t, "GET", path, "", ""); done <- status }()
		select {
		case status := <-done:
			if status != 200 {
				t.Errorf("%s: %d", path, status)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s waited for the generation or the load", path)
		}
	}
	select {
	case err := <-loaded:
		t.Fatalf("the load did not wait for the tokenizer (%v): the test proves nothing", err)
	default:
	}
	close(tok.gate)
	f.backend.Release()
	if err := <-asked; err != nil {
		t.Error(err)
	}
	if err := <-loaded; err != nil {
		t.Error(err)
	}
}

// TestClientThatGoesAwayStopsItsGeneration: the backend stops, nothing is
// recorded, and the daemon serves the next request.
func TestClientThatGoesAwayStopsItsGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{})
	f.backend.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := f.client.Ask(ctx, ctxd.AskRequest{Session: "gone", Query: "long answer"}, func(string) { cancel() })
		got <- err
	}()
	if err := <-got; err == nil {
		t.Fatal("a cancelled ask succeeded")
	}
	daemontest.WaitFor(t, func() bool { return f.backend.Stopped() == 1 })
	f.backend.Release()
	if s, _ := f.store.Session(context.Background(), "gone"); s.Count != 0 {
		t.Errorf("the answer of a client that went away was recorded: %+v", s)
	}
	if sum := f.ask(t, "gone", "again"); sum.Turn != 1 {
		t.Errorf("next ask: %+v", sum)
	}
}

// TestClientThatStopsReadingFreesItsSlot: a client that sends a question
// and never reads the answer must not hold the only slot (and everyone
// behind it): after daemon.write_timeout its request ends as if it had
// gone away.
func TestClientThatStopsReadingFreesItsSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.WriteTimeout = config.Duration{Duration: 200 * time.Millisecond}
	}})
	f.backend.SetAnswer(strings.Repeat("word ", 400_000)) // megabytes of events: more than the socket buffers hold
	conn, err := net.Dial("unix", f.cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"session":"stalled","query":"a long answer"}`
	fmt.Fprintf(conn, "POST /v1/ask HTTP/1.1\r\nHost: ctxd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Never read. Another session still gets the slot.
	daemontest.WaitFor(t, func() bool { return f.backend.Stopped() == 1 })
	f.backend.SetAnswer("an answer")
	if sum := f.ask(t, "other", "still served?"); sum.Turn != 1 {
		t.Errorf("the next session: %+v", sum)
	}
	if s, _ := f.store.Session(context.Background(), "stalled"); s.Count != 0 {
		t.Errorf("the answer nobody read was recorded: %+v", s)
	}
}
