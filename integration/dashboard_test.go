package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/internal/realmodel"
	"github.com/ctxd/ctxd/sigils"
)

// chromium is Debian's Chromium, which make test installs
// (scripts/ensure-chromium.sh); $CHROMIUM names another.
func chromium(t *testing.T) string {
	t.Helper()
	p := os.Getenv("CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		msg := "the dashboard's browser test needs Chromium (make test installs Debian's chromium package: scripts/ensure-chromium.sh): " + err.Error()
		if os.Getenv("CTXD_REQUIRE_CHROMIUM") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// page is a real browser (integration/node/browser.mjs: headless Chromium
// driven by playwright-core) that a test sends commands to.
type page struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

// newBrowser starts the driver; it closes when the test ends.
func newBrowser(t *testing.T) *page {
	t.Helper()
	node := needNode(t)
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "playwright-core", "package.json")); err != nil {
		msg := "playwright-core is needed (make test installs it with npm ci in integration/node): " + err.Error()
		if os.Getenv("CTXD_REQUIRE_NODE") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	cmd := exec.Command(node, "browser.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), "CHROMIUM="+chromium(t))
	cmd.Stderr = testWriter{t}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &page{t: t, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 0, 1<<16), 1<<22)
	t.Cleanup(func() {
		_, _ = io.WriteString(in, `{"op":"close"}`+"\n")
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// do sends one command and returns its answer; a failed command fails
// the test.
func (p *page) do(cmd map[string]any) map[string]any {
	p.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("browser: %v", err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("browser: no answer to %s: %v", b, p.out.Err())
	}
	var ans map[string]any
	if err := json.Unmarshal(p.out.Bytes(), &ans); err != nil {
		p.t.Fatalf("browser: %q: %v", p.out.Text(), err)
	}
	if ans["ok"] != true {
		p.t.Fatalf("browser: %s: %v", b, ans["error"])
	}
	return ans
}

// wait waits (up to timeout) for selector to match, with text in it when
// text is not "", and returns how long it waited.
func (p *page) wait(selector, text string, timeout time.Duration) time.Duration {
	p.t.Helper()
	ans := p.do(map[string]any{"op": "wait", "selector": selector, "text": text, "timeout": timeout.Milliseconds()})
	return time.Duration(ans["ms"].(float64)) * time.Millisecond
}

func (p *page) count(selector string) int {
	p.t.Helper()
	return int(p.do(map[string]any{"op": "count", "selector": selector})["value"].(float64))
}

func (p *page) eval(js string) any {
	p.t.Helper()
	return p.do(map[string]any{"op": "eval", "js": js})["value"]
}

// noErrors fails the test on any console or page error so far.
func (p *page) noErrors() {
	p.t.Helper()
	if errs := p.do(map[string]any{"op": "errors"})["value"].([]any); len(errs) > 0 {
		p.t.Errorf("the page logged errors: %v", errs)
	}
}

// fitsWidth fails the test when the page scrolls sideways.
func (p *page) fitsWidth(what string) {
	p.t.Helper()
	if over := p.eval(`document.documentElement.scrollWidth - window.innerWidth`).(float64); over > 0 {
		p.t.Errorf("%s: the page is %v px wider than the viewport", what, over)
	}
}

// TestDashboardInBrowser opens the dashboard in a real browser (headless
// Chromium) beside a real model (SmolLM2 on Ollama) and agents asking
// from other clients, as an agent's sigil would: the page loads with no
// console error; each ask shows up as its session's bars; a prefix break
// shows its block and cause; another sigil's sessions never appear; the
// keyboard reaches the sessions; the page fits a phone's width and 200%
// zoom. It writes its screenshots into $CTXD_SCREENSHOTS (make
// screenshots: docs/), else a scratch directory.
func TestDashboardInBrowser(t *testing.T) {
	needOllama(t)
	model := realmodel.Path(t, realmodel.SmolLM2)
	br := newBrowser(t)
	shots := os.Getenv("CTXD_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	codex := codexDir(t, 6000)
	cfg := baseConfig(t, t.TempDir(), codex)
	cfg.Backend.GGUF, cfg.Backend.Model = model, "smollm2-dash"
	cfg.Limits.AnswerReserve = 24
	cfg.Daemon.DashboardListen = "127.0.0.1:0"
	cfg.Sigils["alice"] = config.Sigil{Description: "a coding agent", Scopes: []string{"ask", "codex:load"}}
	cfg.Sigils["bob"] = config.Sigil{Description: "another agent", Scopes: []string{"ask"}}
	cfg.Sigils["ops"] = config.Sigil{Description: "the operator", Scopes: []string{"ask", sigils.ScopeAdmin}}
	r := start(t, cfg, true)
	ctx := t.Context()
	alice := client.New(cfg.Daemon.Socket, client.WithSigil("alice"))
	bob := client.New(cfg.Daemon.Socket, client.WithSigil("bob"))
	ask := func(c *client.Client, sigil, session, q string) *ctxd.Summary {
		t.Helper()
		sum, err := c.Ask(ctx, ctxd.AskRequest{Session: session, Sigil: sigil, Query: q}, nil)
		if err != nil {
			t.Fatalf("%s asks in %s: %v", sigil, session, err)
		}
		return sum
	}
	ask(alice, "alice", "alice-1", "Which function handles request kind 3?")
	ask(bob, "bob", "bob-1", "What does the README say about handlers?")

	dashAddr := r.daemon.DashboardAddr()
	if dashAddr == "" {
		t.Fatal("the dashboard listener is not listening")
	}
	url := func(sigil string) string {
		dt, err := r.client.DashboardToken(ctx, sigil)
		if err != nil {
			t.Fatal(err)
		}
		return "http://" + dashAddr + dt.Path
	}
	aliceSession := `.session[data-sigil="alice"][data-session="alice-1"]`

	// Alice's page: her session, never bob's.
	br.do(map[string]any{"op": "open", "url": url("alice"), "width": 1280, "height": 900})
	br.wait(`body[data-state="live"]`, "", 15*time.Second)
	br.wait(aliceSession+` .turn[data-turn="1"]`, "", 10*time.Second)
	if v := br.eval(`document.getElementById('viewer').innerText`).(string); !strings.Contains(v, "alice") {
		t.Errorf("the page does not say whose it is: %q", v)
	}
	// Another client asks: the page shows the new turn's bars. The wait
	// starts when the answer has been read, so it is the page's delay.
	var delays []time.Duration
	for turn := 2; turn <= 3; turn++ {
		ask(bob, "bob", "bob-1", fmt.Sprintf("And handler %d?", turn))
		sum := ask(alice, "alice", "alice-1", fmt.Sprintf("What does Handler%d return?", turn))
		sel := fmt.Sprintf(`%s .turn[data-turn="%d"]`, aliceSession, turn)
		delays = append(delays, br.wait(sel, "", 10*time.Second))
		cached := br.eval(fmt.Sprintf(`document.querySelector('%s').dataset.cached`, strings.ReplaceAll(sel, `'`, `\'`)))
		if want := dashboard.Reused(*sum); cached != fmt.Sprint(want) {
			t.Errorf("turn %d's bar says %v cached; the summary %d", turn, cached, want)
		}
	}
	t.Logf("the page showed each ask %v after its answer ended", delays)
	if n := br.count(`.session[data-sigil="bob"]`); n != 0 {
		t.Errorf("alice's page shows %d of bob's sessions", n)
	}
	if txt := br.eval(`document.body.innerText`).(string); strings.Contains(txt, "bob-1") {
		t.Error("alice's page names bob's session")
	}

	// A changed codex file breaks the prefix at the codex block: the page
	// shows the block and the cause.
	if err := os.WriteFile(filepath.Join(codex, "handlers.go"), []byte("// Handlers changed.\nfunc Handler0() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.LoadCodex(ctx, codex, nil); err != nil {
		t.Fatal(err)
	}
	sum := ask(alice, "alice", "alice-1", "What changed in the handlers?")
	if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "codex" {
		t.Fatalf("the codex edit should break the prefix at the codex block: %+v", sum.PrefixBreak)
	}
	brk := fmt.Sprintf(`%s .break[data-turn="%d"]`, aliceSession, sum.Turn)
	br.wait(brk, sum.PrefixBreak.Reason, 10*time.Second)
	br.wait(brk, "codex", time.Second)

	// The keyboard reaches the sessions.
	focused := ""
	for range 60 {
		if focused = br.do(map[string]any{"op": "press", "key": "Tab"})["value"].(string); strings.Contains(focused, "session=alice-1") {
			break
		}
	}
	if !strings.Contains(focused, "session=alice-1") {
		t.Errorf("Tab never reached alice's session (last focus: %q)", focused)
	}
	br.noErrors()
	br.do(map[string]any{"op": "screenshot", "path": filepath.Join(shots, "dashboard-agent.png")})

	// At a phone's width, and at 200% zoom (a 1280-pixel screen shows 640
	// CSS pixels), nothing scrolls sideways.
	for _, v := range []struct {
		name          string
		width, height int
		scale         float64
		shot          string
	}{{"phone", 390, 844, 2, "dashboard-phone.png"}, {"200% zoom", 640, 450, 2, ""}} {
		br.do(map[string]any{"op": "open", "url": url("alice"), "width": v.width, "height": v.height, "scale": v.scale})
		br.wait(`body[data-state="live"]`, "", 15*time.Second)
		br.wait(aliceSession+` .turn[data-turn="1"]`, "", 10*time.Second)
		br.fitsWidth(v.name)
		if v.shot != "" {
			br.do(map[string]any{"op": "screenshot", "path": filepath.Join(shots, v.shot)})
		}
		br.noErrors()
	}

	// The operator's view: every agent's sessions, during a real session.
	br.do(map[string]any{"op": "open", "url": url("ops"), "width": 1280, "height": 1100})
	br.wait(`body[data-state="live"]`, "", 15*time.Second)
	ask(bob, "bob", "bob-2", "Summarize the README.")
	br.wait(`.session[data-sigil="bob"][data-session="bob-2"] .turn[data-turn="1"]`, "", 10*time.Second)
	if br.count(`.session[data-sigil="alice"]`) == 0 {
		t.Error("the admin's page does not show alice's sessions")
	}
	time.Sleep(1500 * time.Millisecond) // a status tick: the slots and the chart as they are now
	br.noErrors()
	br.do(map[string]any{"op": "screenshot", "path": filepath.Join(shots, "dashboard.png")})
	br.do(map[string]any{"op": "screenshot", "path": filepath.Join(shots, "dashboard-full.png"), "fullPage": true})
	t.Logf("screenshots in %s", shots)
}
