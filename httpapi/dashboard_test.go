package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/sigils"
)

// sse is one server-sent event.
type sse struct {
	name string
	data string
}

// openEvents opens url's event stream with token ("": none) and sends its
// events on the returned channel until the test ends.
func openEvents(t *testing.T, url, token string) <-chan sse {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan sse, 64)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
		var ev sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				ev.data = line[len("data: "):]
			case line == "" && ev.name != "":
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
				ev = sse{}
			}
		}
	}()
	return out
}

// next is the stream's next event named one of names, skipping others.
func next(t *testing.T, events <-chan sse, names ...string) sse {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("the stream ended waiting for %v", names)
			}
			for _, n := range names {
				if ev.name == n {
					return ev
				}
			}
		case <-timeout:
			t.Fatalf("no %v event in 20s", names)
		}
	}
}

// dashFixture is a daemon with the TCP and dashboard listeners on, and
// tokens for alice and bob (who ask) and ops (an admin).
func dashFixture(t *testing.T) (f *fixture, tcp, dash string, tokens map[string]string) {
	t.Helper()
	tokens = map[string]string{}
	hashes := map[string]string{}
	for _, n := range []string{"alice", "bob", "ops"} {
		tok, hash, err := sigils.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[n], hashes[n] = tok, hash
	}
	f = newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen, c.Daemon.DashboardListen = "127.0.0.1:0", "127.0.0.1:0"
		c.Sigils["alice"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hashes["alice"]}
		c.Sigils["bob"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hashes["bob"]}
		c.Sigils["ops"] = config.Sigil{Scopes: []string{"ask", sigils.ScopeAdmin}, TokenSHA256: hashes["ops"]}
	}})
	return f, listening(t, f.srv.TCPAddr), listening(t, f.srv.DashboardAddr), tokens
}

// listening is "http://" and the address addr reports once its listener
// listens.
func listening(t *testing.T, addr func() string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if a := addr(); a != "" {
			return "http://" + a
		}
	}
	t.Fatal("the listener never listened")
	return ""
}

func tcpAsk(t *testing.T, base, token, session, query string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"session": session, "query": query})
	if status, b := tcpDo(t, "POST", base+"/v1/ask", token, string(body)); status != 200 {
		t.Fatalf("ask in %s: %d %s", session, status, b)
	}
}

// TestDashboardStreamShowsOnlyTheViewersSessions: a page opens with a
// snapshot as its sigil, then hears each of its own turns as it happens
// and never another sigil's; an admin's page hears every sigil's; the
// status it gets names no other sigil's session.
func TestDashboardStreamShowsOnlyTheViewersSessions(t *testing.T) {
	_, tcp, _, tok := dashFixture(t)
	tcpAsk(t, tcp, tok["bob"], "b0", "before any page opened")
	alice := openEvents(t, tcp+"/v1/dashboard/events", tok["alice"])
	ops := openEvents(t, tcp+"/v1/dashboard/events", tok["ops"])

	var snap DashboardSnapshot
	if err := json.Unmarshal([]byte(next(t, alice, "snapshot").data), &snap); err != nil {
		t.Fatal(err)
	}
	if snap.Viewer.Sigil != "alice" || snap.Viewer.Admin || len(snap.Turns) != 0 || len(snap.Series) != dashboard.SeriesBuckets || snap.BucketS != dashboard.BucketSeconds {
		t.Fatalf("alice's snapshot: viewer %+v, %d turns, %d buckets", snap.Viewer, len(snap.Turns), len(snap.Series))
	}
	var opsSnap DashboardSnapshot
	if err := json.Unmarshal([]byte(next(t, ops, "snapshot").data), &opsSnap); err != nil {
		t.Fatal(err)
	}
	if !opsSnap.Viewer.Admin || len(opsSnap.Turns) != 1 || opsSnap.Turns[0].Sigil != "bob" || opsSnap.Turns[0].Session != "b0" {
		t.Fatalf("the admin's snapshot: viewer %+v, turns %+v", opsSnap.Viewer, opsSnap.Turns)
	}

	tcpAsk(t, tcp, tok["alice"], "a1", "first")
	tcpAsk(t, tcp, tok["bob"], "b1", "bob's")
	tcpAsk(t, tcp, tok["alice"], "a1", "second")
	var seen []string
	for len(seen) < 2 {
		var turn dashboard.Turn
		if err := json.Unmarshal([]byte(next(t, alice, "turn").data), &turn); err != nil {
			t.Fatal(err)
		}
		if turn.Sigil != "alice" || turn.Session != "a1" {
			t.Fatalf("alice's page heard %s's turn in %s", turn.Sigil, turn.Session)
		}
		if turn.Summary.PromptTokens == 0 || turn.Summary.Turn != len(seen)+1 {
			t.Fatalf("turn %d: %+v", len(seen)+1, turn.Summary)
		}
		seen = append(seen, turn.Session)
	}
	var sigilsSeen []string
	for len(sigilsSeen) < 3 {
		var turn dashboard.Turn
		if err := json.Unmarshal([]byte(next(t, ops, "turn").data), &turn); err != nil {
			t.Fatal(err)
		}
		sigilsSeen = append(sigilsSeen, turn.Sigil)
	}
	if strings.Join(sigilsSeen, " ") != "alice bob alice" {
		t.Fatalf("the admin heard %v, want alice bob alice", sigilsSeen)
	}
	// The slot last served alice: her status names her session; bob's
	// page sees the slot, but not whose it is.
	var st Status
	if err := json.Unmarshal([]byte(next(t, alice, "status").data), &st); err != nil {
		t.Fatal(err)
	}
	if st.Scheduler == nil || len(st.Scheduler.Slots) != 1 || st.Scheduler.Slots[0].Session != "a1" {
		t.Fatalf("alice's status slots: %+v", st.Scheduler)
	}
	bob := openEvents(t, tcp+"/v1/dashboard/events", tok["bob"])
	var bobSnap DashboardSnapshot
	if err := json.Unmarshal([]byte(next(t, bob, "snapshot").data), &bobSnap); err != nil {
		t.Fatal(err)
	}
	if s := bobSnap.Status.Scheduler; s == nil || s.Slots[0].Session != "" || s.Slots[0].Prefix != "" {
		t.Fatalf("bob's page sees another sigil's slot: %+v", s)
	}
	for _, turn := range bobSnap.Turns {
		if turn.Sigil != "bob" {
			t.Fatalf("bob's snapshot holds %s's turn", turn.Sigil)
		}
	}
	if len(bobSnap.Turns) != 2 {
		t.Fatalf("bob's snapshot: %d turns, want his 2", len(bobSnap.Turns))
	}
	requests := 0
	for _, b := range bobSnap.Series {
		requests += b.Requests
	}
	if requests != 2 {
		t.Fatalf("bob's series counts %d requests, want his 2", requests)
	}
}

// TestDashboardTokens: `ctxd dashboard`'s token opens the page and its
// stream, on the dashboard listener and the TCP listener, and nothing
// else; the dashboard listener serves nothing but the dashboard, and
// nothing without a token.
func TestDashboardTokens(t *testing.T) {
	f, tcp, dash, tok := dashFixture(t)
	status, body := f.do(t, "POST", "/v1/dashboard/token?sigil=coder", "", "")
	var dt ctxd.DashboardToken
	if status != 200 || json.Unmarshal([]byte(body), &dt) != nil {
		t.Fatalf("token: %d %s", status, body)
	}
	if dt.Sigil != "coder" || !strings.HasPrefix(dt.Token, dashboard.TokenPrefix) || dt.Path != "/t/"+dt.Token+"/dashboard/" ||
		dt.Dashboard == "" || dt.TCP == "" || !dt.Expires.After(time.Now()) {
		t.Fatalf("token answer: %+v", dt)
	}
	for _, base := range []string{dash, tcp} {
		resp, err := http.Get(base + dt.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Fatalf("GET %s%s: %d %v", base, "/t/TOKEN/dashboard/", resp.StatusCode, resp.Header)
		}
		// The page's relative links reach the vendored chart library and
		// the stream with the token still in the path.
		if status, _ := tcpDo(t, "GET", base+"/t/"+dt.Token+"/dashboard/vendor/uPlot.esm.js", "", ""); status != 200 {
			t.Fatalf("the vendored uPlot: %d", status)
		}
		var snap DashboardSnapshot
		if err := json.Unmarshal([]byte(next(t, openEvents(t, base+"/t/"+dt.Token+"/v1/dashboard/events", ""), "snapshot").data), &snap); err != nil {
			t.Fatal(err)
		}
		if snap.Viewer.Sigil != "coder" {
			t.Fatalf("the token's page views as %q", snap.Viewer.Sigil)
		}
	}
	for _, c := range []struct {
		name, url, token string
		status           int
		want             string
	}{
		{"dashboard token elsewhere", tcp + "/v1/status", dt.Token, 403, "opens the dashboard only"},
		{"dashboard token asks", tcp + "/t/" + dt.Token + "/v1/sessions", "", 403, "opens the dashboard only"},
		{"dashboard token makes another", tcp + "/v1/dashboard/token", dt.Token, 403, "opens the dashboard only"},
		{"unknown dashboard token", tcp + "/dashboard/", dashboard.TokenPrefix + "nope", 401, "unknown or has expired"},
		{"dashboard listener, no token", dash + "/dashboard/", "", 401, "needs a sigil's token"},
		{"dashboard listener, other route", dash + "/v1/status", tok["alice"], 404, "serves the dashboard only"},
		{"dashboard listener, sigil token", dash + "/dashboard/", tok["alice"], 200, "<"},
		{"missing file", tcp + "/dashboard/nope.js", tok["alice"], 404, `no file \"nope.js\"`},
		{"wrong method", tcp + "/v1/dashboard/events", tok["alice"], 405, "method not allowed"},
	} {
		method := "GET"
		if c.name == "wrong method" || c.name == "dashboard token makes another" {
			method = "POST"
		}
		status, body := tcpDo(t, method, c.url, c.token, "")
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %.200s; want %d with %s", c.name, status, body, c.status, c.want)
		}
	}
	// On the socket the page needs no token, and /dashboard sends the
	// browser on to dashboard/ (relative: a /t/TOKEN prefix stays).
	if status, body := f.do(t, "GET", "/dashboard/", "", ""); status != 200 || !strings.Contains(body, "<") {
		t.Fatalf("the page on the socket: %d %.100s", status, body)
	}
	req, _ := http.NewRequest("GET", tcp+"/t/"+dt.Token+"/dashboard", nil)
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "dashboard/" {
		t.Fatalf("/dashboard: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestDashboardPagesPerSigil: a sigil holds at most
// daemon.max_dashboards_per_sigil pages open; the next is refused with
// the key named, and one closed makes room.
func TestDashboardPagesPerSigil(t *testing.T) {
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen, c.Daemon.MaxDashboardsPerSigil = "127.0.0.1:0", 1
		c.Sigils["alice"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hash}
	}})
	base := listening(t, f.srv.TCPAddr)
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/dashboard/events", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the first page: %v %v", resp, err)
	}
	if status, body := tcpDo(t, "GET", base+"/v1/dashboard/events", tok, ""); status != 429 || !strings.Contains(body, "daemon.max_dashboards_per_sigil") {
		t.Fatalf("the second page: %d %s", status, body)
	}
	cancel()
	resp.Body.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if f.srv.dashboards.counts()["alice"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed page still holds its place")
		}
	}
	_ = openEvents(t, base+"/v1/dashboard/events", tok)
}

// TestDashboardStreamEndsWhenItsTokenIsRevoked: a reload that revokes the
// token a page opened with ends its stream with a refused event that says
// why (the page then stops instead of retrying).
func TestDashboardStreamEndsWhenItsTokenIsRevoked(t *testing.T) {
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	var revoked atomic.Bool
	var f *fixture
	f = newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen = "127.0.0.1:0"
		c.Sigils["alice"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hash}
	}, reread: func() (config.Config, error) {
		c := f.cfg
		if revoked.Load() {
			c.Sigils = map[string]config.Sigil{"default": c.Sigils["default"], "alice": {Scopes: []string{"ask"}, RevokedSHA256: []string{hash}}}
		}
		return c, nil
	}})
	base := listening(t, f.srv.TCPAddr)
	events := openEvents(t, base+"/v1/dashboard/events", tok)
	next(t, events, "snapshot")
	revoked.Store(true)
	if st := f.srv.core.Reload(t.Context()); !st.OK {
		t.Fatalf("reload: %+v", st)
	}
	ev := next(t, events, "refused")
	if !strings.Contains(ev.data, "revoked") || !strings.Contains(ev.data, `"status":401`) {
		t.Fatalf("refused event: %s", ev.data)
	}
	ended(t, events)
}

// ended fails the test unless the stream ends within 10 s (whatever it
// sends before).
func ended(t *testing.T, events <-chan sse) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, open := <-events:
			if !open {
				return
			}
		case <-timeout:
			t.Fatal("the stream stayed open")
		}
	}
}

// TestDashboardNamesNoOtherSigilsSession: a turn whose slot last served
// another sigil's session says so without naming it (its slot note), as
// status names no other sigil's session.
func TestDashboardNamesNoOtherSigilsSession(t *testing.T) {
	_, tcp, _, tok := dashFixture(t) // one slot: every ask takes the slot the last one held
	alice := openEvents(t, tcp+"/v1/dashboard/events", tok["alice"])
	next(t, alice, "snapshot")
	tcpAsk(t, tcp, tok["alice"], "a1", "first")
	tcpAsk(t, tcp, tok["bob"], "bobs-secret-session", "bob's")
	tcpAsk(t, tcp, tok["alice"], "a1", "second")
	next(t, alice, "turn")
	ev := next(t, alice, "turn")
	var turn dashboard.Turn
	if err := json.Unmarshal([]byte(ev.data), &turn); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(turn.Summary.SlotNote, "another sigil's session") {
		t.Fatalf("slot note: %q", turn.Summary.SlotNote)
	}
	if strings.Contains(ev.data, "bobs-secret-session") || strings.Contains(ev.data, "@bob") {
		t.Fatalf("alice's turn names bob's session: %s", ev.data)
	}
}

// TestDashboardFollowsReloads: a page is re-resolved as every request is.
// An admin's page whose sigil loses admin starts again as a non-admin's
// and hears no other sigil's turn; a dashboard token stops holding when
// the sigil token that made it is revoked.
func TestDashboardFollowsReloads(t *testing.T) {
	tokens, hashes := map[string]string{}, map[string]string{}
	for _, n := range []string{"alice", "bob", "ops"} {
		tok, hash, err := sigils.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		tokens[n], hashes[n] = tok, hash
	}
	var reloaded atomic.Bool
	var f *fixture
	f = newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Daemon.TCPListen = "127.0.0.1:0"
		c.Sigils["alice"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hashes["alice"]}
		c.Sigils["bob"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hashes["bob"]}
		c.Sigils["ops"] = config.Sigil{Scopes: []string{"ask", sigils.ScopeAdmin}, TokenSHA256: hashes["ops"]}
	}, reread: func() (config.Config, error) {
		c := f.cfg
		if reloaded.Load() {
			c.Sigils = maps.Clone(c.Sigils)
			c.Sigils["alice"] = config.Sigil{Scopes: []string{"ask"}, RevokedSHA256: []string{hashes["alice"]}}
			c.Sigils["ops"] = config.Sigil{Scopes: []string{"ask"}, TokenSHA256: hashes["ops"]}
		}
		return c, nil
	}})
	tcp := listening(t, f.srv.TCPAddr)
	status, body := tcpDo(t, "POST", tcp+"/v1/dashboard/token", tokens["alice"], "")
	var dt ctxd.DashboardToken
	if status != 200 || json.Unmarshal([]byte(body), &dt) != nil {
		t.Fatalf("alice's dashboard token: %d %s", status, body)
	}
	byToken := openEvents(t, tcp+"/t/"+dt.Token+"/v1/dashboard/events", "")
	next(t, byToken, "snapshot")
	ops := openEvents(t, tcp+"/v1/dashboard/events", tokens["ops"])
	var snap DashboardSnapshot
	if err := json.Unmarshal([]byte(next(t, ops, "snapshot").data), &snap); err != nil || !snap.Viewer.Admin {
		t.Fatalf("ops's first snapshot: %+v %v", snap.Viewer, err)
	}

	reloaded.Store(true)
	if st := f.srv.core.Reload(t.Context()); !st.OK {
		t.Fatalf("reload: %+v", st)
	}
	ev := next(t, byToken, "refused")
	if !strings.Contains(ev.data, "made with no longer holds") || !strings.Contains(ev.data, "revoked") {
		t.Fatalf("the dashboard token's stream ended with %s", ev.data)
	}
	ended(t, byToken)
	if status, body := tcpDo(t, "GET", tcp+"/t/"+dt.Token+"/dashboard/", "", ""); status != 401 || !strings.Contains(body, "made with no longer holds") {
		t.Fatalf("the page with a token made by a revoked one: %d %s", status, body)
	}
	if err := json.Unmarshal([]byte(next(t, ops, "snapshot").data), &snap); err != nil || snap.Viewer.Admin {
		t.Fatalf("ops's snapshot after it lost admin: %+v %v", snap.Viewer, err)
	}
	tcpAsk(t, tcp, tokens["bob"], "b1", "bob's")
	tcpAsk(t, tcp, tokens["ops"], "o1", "ops's own")
	var turn dashboard.Turn
	if err := json.Unmarshal([]byte(next(t, ops, "turn").data), &turn); err != nil {
		t.Fatal(err)
	}
	if turn.Sigil != "ops" {
		t.Fatalf("ops, no longer an admin, heard %s's turn", turn.Sigil)
	}
}
