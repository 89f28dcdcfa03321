package httpapi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
)

// TestKarmaAPI: an answer's trace is judged over the API (verify, pin,
// supersede, reject), listed and reconstructed as it stood at a past time;
// only its own sigil sees or judges it, and only with the karma scopes.
func TestKarmaAPI(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{sqlite: true, config: func(c *config.Config) {
		c.Sigils = map[string]config.Sigil{
			"default": {Scopes: []string{"ask", "karma:read", "karma:write", "sessions:read"}},
			"peer":    {Scopes: []string{"ask", "karma:read", "karma:write", "sessions:read"}},
			"asker":   {Scopes: []string{"ask"}},
		}
	}})
	ctx := t.Context()
	f.backend.SetAnswer("run make test")
	first := f.ask(t, "k", "how do I test?")
	if first.Trace == 0 || first.Karma == nil || first.Karma.Epoch != 1 {
		t.Fatalf("first answer: trace %d karma %+v", first.Trace, first.Karma)
	}
	before := time.Now()
	tr, err := f.client.Judge(ctx, first.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: "checked"})
	if err != nil || tr.Status != ctxd.TraceVerified || tr.Note != "checked" {
		t.Fatalf("verify: %+v %v", tr, err)
	}
	if tr, err = f.client.Judge(ctx, first.Trace, ctxd.KarmaPin, ctxd.KarmaJudgement{}); err != nil || !tr.Pinned {
		t.Fatalf("pin: %+v %v", tr, err)
	}
	f.backend.SetAnswer("run make check")
	second := f.ask(t, "k", "how do I test, now?")
	if second.Karma.Epoch != 1 || len(second.Karma.Traces) != 0 {
		t.Errorf("a verification mid-epoch changed the karma block: %+v", second.Karma)
	}
	if _, err := f.client.Judge(ctx, second.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{}); err != nil {
		t.Fatal(err)
	}
	if tr, err = f.client.Judge(ctx, first.Trace, ctxd.KarmaSupersede, ctxd.KarmaJudgement{By: second.Trace, Note: "the target was renamed"}); err != nil || tr.SupersededBy != second.Trace {
		t.Fatalf("supersede: %+v %v", tr, err)
	}
	third, err := f.client.Ask(ctx, ctxd.AskRequest{Session: "k", Query: "and?", RefreshKarma: true}, nil)
	if err != nil || third.Karma.Epoch != 2 || len(third.Karma.Traces) != 1 || third.Karma.Traces[0] != second.Trace {
		t.Fatalf("after refresh: %+v %v", third.Karma, err)
	}

	list, err := f.client.Karma(ctx, client.KarmaFilter{Status: ctxd.TraceVerified})
	if err != nil || len(list) != 2 {
		t.Fatalf("verified list: %+v %v", list, err)
	}
	if list, err = f.client.Karma(ctx, client.KarmaFilter{Text: "now"}); err != nil || len(list) != 1 || list[0].ID != second.Trace {
		t.Errorf("text search: %+v %v", list, err)
	}
	// As it stood before any judgement: both recorded... the second did not exist.
	if list, err = f.client.Karma(ctx, client.KarmaFilter{At: before}); err != nil || len(list) != 1 || list[0].Status != ctxd.TraceRecorded {
		t.Errorf("at %v: %+v %v", before, list, err)
	}
	h, err := f.client.Trace(ctx, first.Trace)
	if err != nil || len(h.Events) != 3 || h.Trace.Answer != "run make test" {
		t.Errorf("history: %+v %v", h, err)
	}
	snaps, err := f.client.SessionKarma(ctx, "k")
	if err != nil || len(snaps) != 2 || snaps[1].Reason != "refresh asked by the request" {
		t.Errorf("epochs: %+v %v", snaps, err)
	}

	// Another sigil: its own record only; another's trace is not found.
	peer := func(path, method, body string) (int, string) {
		return sockDo(t, f, method, path+"?sigil=peer", body)
	}
	if status, body := peer("/v1/karma/"+itoa(first.Trace), "GET", ""); status != 404 || !strings.Contains(body, `no trace`) {
		t.Errorf("peer reading default's trace: %d %s", status, body)
	}
	if status, body := peer("/v1/karma/"+itoa(first.Trace)+"/reject", "POST", `{"note":"no"}`); status != 404 {
		t.Errorf("peer judging default's trace: %d %s", status, body)
	}
	// The session's last prompt holds default's karma block: peer may not read it.
	if status, body := peer("/v1/sessions/k/prompt", "GET", ""); status != 404 || strings.Contains(body, "run make") {
		t.Errorf("peer reading default's prompt: %d %s", status, body)
	}
	if status, body := sockDo(t, f, "GET", "/v1/sessions/k/prompt", ""); status != 200 || !strings.Contains(body, "run make check") {
		t.Errorf("default reading its own prompt: %d %.200s", status, body)
	}
	if status, body := peer("/v1/karma", "GET", ""); status != 200 || !strings.Contains(body, `"traces": []`) {
		t.Errorf("peer's list: %d %s", status, body)
	}
	if status, body := sockDo(t, f, "GET", "/v1/karma?sigil=asker", ""); status != 403 || !strings.Contains(body, `lacks the \"karma:read\" scope`) {
		t.Errorf("a sigil without karma:read: %d %s", status, body)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/karma/abc/verify", "", "positive number"},
		{"/v1/karma/999/verify", "", "no trace 999"},
		{"/v1/karma/1/bless", "", `no karma action \"bless\"`},
		{"/v1/karma/1/supersede", "{}", `\"by\"`},
		{"/v1/karma/1/verify", `{"by": 2}`, "supersede only"},
		{"/v1/karma/1/verify", `{"note": 3}`, "malformed JSON"},
	} {
		if status, body := sockDo(t, f, "POST", c.path, c.body); status < 400 || !strings.Contains(body, c.want) {
			t.Errorf("POST %s %s: %d %s; want %s", c.path, c.body, status, body, c.want)
		}
	}
	// Over the WebSocket: a feedback message judges a trace and is
	// answered with the trace after it; another sigil's is not found.
	p := newPeer(t, f.cfg.Daemon.Socket, nil)
	p.send(fmt.Sprintf(`{"type":"feedback","id":"f1","trace":%d,"action":"reject","note":"wrong target"}`, third.Trace))
	if m := p.next(); m.Type != ctxd.WSFeedback || m.ID != "f1" || m.Judged == nil || m.Judged.Status != ctxd.TraceRejected || m.Judged.Note != "wrong target" {
		t.Errorf("feedback answer %+v", m)
	}
	p.send(fmt.Sprintf(`{"type":"feedback","id":"f2","trace":%d,"action":"verify","sigil":"peer"}`, third.Trace))
	if m := p.next(); m.Type != ctxd.WSError || m.ID != "f2" || m.Kind != ctxd.KindNotFound {
		t.Errorf("feedback on another sigil's trace: %+v", m)
	}

	var apiErr *client.APIError
	if _, err := f.client.Judge(ctx, second.Trace, ctxd.KarmaSupersede, ctxd.KarmaJudgement{By: second.Trace}); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Errorf("a trace superseding itself: %v", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sockDo sends a request over the fixture's socket.
func sockDo(t *testing.T, f *fixture, method, path, body string) (int, string) {
	t.Helper()
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	return f.do(t, method, path, ct, body)
}
