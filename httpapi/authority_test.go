package httpapi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/config"
)

// TestEveryRouteChecksAuthority: the session routes need the sessions
// scopes and serve a sigil its own sessions only (another's is not found,
// and may not be continued); loading a codex needs codex:load and a path
// under the operator's roots (a symlink out of a root does not count);
// the codex's stats need a codex scope; and a codex may not turn its own
// redaction off unless the operator allows it.
func TestEveryRouteChecksAuthority(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Codex.LoadRoots = []string{root}
		c.Sigils["other"] = config.Sigil{Scopes: []string{"ask", "sessions:read", "sessions:write", "codex:load"}}
		c.Sigils["asker"] = config.Sigil{Scopes: []string{"ask"}}
	}})
	f.ask(t, "mine", "a question of default's")
	as := func(sigil string) string { return "?sigil=" + sigil }
	for _, c := range []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		// Session ids are per sigil: another's id names the asker's own
		// session, which answers as any id never used does.
		{"another's session is not listed", "GET", "/v1/sessions" + as("other"), "", 200, `"sessions": []`},
		{"another's id is the sigil's own, unused", "GET", "/v1/sessions/mine" + as("other"), "", 200, `"turns": []`},
		{"an unused id answers alike", "GET", "/v1/sessions/never-used" + as("other"), "", 200, `"turns": []`},
		{"another's prompt is not found", "GET", "/v1/sessions/mine/prompt" + as("other"), "", 404, `no prompt as sigil \"other\"`},
		{"another's session is not deleted", "DELETE", "/v1/sessions/mine" + as("other"), "", 204, ""},
		{"another's id begins the sigil's own session", "POST", "/v1/ask", `{"session":"mine","query":"hi","sigil":"other"}`, 200, `"turn":1`},
		{"listing needs sessions:read", "GET", "/v1/sessions" + as("asker"), "", 403, `lacks the \"sessions:read\" scope`},
		{"reading needs sessions:read", "GET", "/v1/sessions/mine" + as("asker"), "", 403, `\"sessions:read\"`},
		{"deleting needs sessions:write", "DELETE", "/v1/sessions/mine" + as("asker"), "", 403, `\"sessions:write\"`},
		{"loading needs codex:load", "POST", "/v1/codex/load" + as("asker"), `{"path":"` + root + `"}`, 403, `\"codex:load\"`},
		{"stats need a codex scope", "GET", "/v1/codex" + as("asker"), "", 403, `\"search_codex\"`},
		{"a path outside the roots", "POST", "/v1/codex/load", `{"path":"/etc"}`, 403, "not under a directory the operator allows"},
		{"own session, untouched by the other sigil's", "GET", "/v1/sessions/mine", "", 200, `"query": "a question of default's"`},
		{"the other sigil's own session, under the same id", "GET", "/v1/sessions/mine" + as("other"), "", 200, `"query": "hi"`},
	} {
		ct := ""
		if c.body != "" {
			ct = "application/json"
		}
		status, body := f.do(t, c.method, c.path, ct, c.body)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s; want %d with %s", c.name, status, body, c.status, c.want)
		}
	}

	// A symlink in a root to a directory outside it is outside.
	if err := os.Symlink("/etc", filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	if status, body := f.do(t, "POST", "/v1/codex/load", "application/json", `{"path":"`+filepath.Join(root, "out")+`"}`); status != 403 {
		t.Errorf("a symlink out of the root: %d %s", status, body)
	}
	// A codex that turns its own redaction off is refused.
	hostile := filepath.Join(root, "hostile")
	if err := os.MkdirAll(hostile, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{".ctxd.toml": "[codex]\nredact = false\n", "config.go": "package c\n\nconst key = \"AKIA2OGYBAH6Q7EXAMPL\"\n"} {
		if err := os.WriteFile(filepath.Join(hostile, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if status, body := f.do(t, "POST", "/v1/codex/load", "application/json", `{"path":"`+hostile+`"}`); status != 403 || !strings.Contains(body, "allow_codex_redact_off") {
		t.Errorf("a codex turning redaction off: %d %s", status, body)
	}
	// Deleting one's own session works.
	if status, body := f.do(t, "DELETE", "/v1/sessions/mine", "", ""); status != 204 {
		t.Errorf("deleting one's own session: %d %s", status, body)
	}
}

// TestStatusShowsOnlyWhatTheSigilMaySee (issue 27, finding 8): a sigil
// with only ask and sessions:read read the codex's root, files,
// redactions and skipped files through /v1/status, though /v1/codex
// refuses it, and other sigils' session ids and last request. Now status
// shows it its own sessions only, and the codex's details only with a
// codex scope; an admin sees everything.
func TestStatusShowsOnlyWhatTheSigilMaySee(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nconst password = \"hunter2-hunter2\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".env"), []byte("TOKEN=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Codex.Path = dir
		c.Sigils["reader"] = config.Sigil{Scopes: []string{"ask", "sessions:read"}}
		c.Sigils["operator"] = config.Sigil{Scopes: []string{"admin"}}
	}})
	f.ask(t, "defaults-secret-session", "a question of default's")
	status, body := f.do(t, "GET", "/v1/status?sigil=reader", "", "")
	if status != 200 {
		t.Fatalf("status as reader: %d %s", status, body)
	}
	for _, leak := range []string{"defaults-secret-session", dir, "main.go", ".env", "ctxd-secret-assignment"} {
		if strings.Contains(body, leak) {
			t.Errorf("status as reader shows %q:\n%s", leak, body)
		}
	}
	if !strings.Contains(body, `"codex"`) || !strings.Contains(body, `"files": 1`) {
		t.Errorf("status as reader lost the codex's summary:\n%s", body)
	}
	// The reader's own session shows.
	if status, body := f.do(t, "POST", "/v1/ask", "application/json", `{"session":"readers-own","query":"hi","sigil":"reader"}`); status != 200 {
		t.Fatalf("ask as reader: %d %s", status, body)
	}
	if _, body := f.do(t, "GET", "/v1/status?sigil=reader", "", ""); !strings.Contains(body, "readers-own") {
		t.Errorf("status as reader does not show its own last request:\n%s", body)
	}
	// A sigil with the admin scope sees everything.
	_, body = f.do(t, "GET", "/v1/status?sigil=operator", "", "")
	for _, want := range []string{dir, "main.go", ".env", "readers-own"} {
		if !strings.Contains(body, want) {
			t.Errorf("status as admin lacks %q:\n%s", want, body)
		}
	}
}

// TestSessionIDsArePerSigil (issue 27, finding 9): another sigil's id
// answered 404 (403 on ask) while an unused one answered 200, and
// whoever used an id first locked every other sigil out of it. Ids are
// now per sigil: one claimed first by another sigil is still the asker's
// own, and reads of another's id answer as an unused id does.
func TestSessionIDsArePerSigil(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fixtureOptions{config: func(c *config.Config) {
		c.Sigils["squatter"] = config.Sigil{Scopes: []string{"ask", "sessions:read", "sessions:write"}}
	}})
	// The squatter takes the id the default sigil's agent will use.
	if status, body := f.do(t, "POST", "/v1/ask", "application/json", `{"session":"build-42","query":"squatted","sigil":"squatter"}`); status != 200 {
		t.Fatalf("the squatter's ask: %d %s", status, body)
	}
	sum := f.ask(t, "build-42", "the owner's question")
	if sum.Turn != 1 || sum.Session != "build-42" {
		t.Errorf("the default sigil's first ask under a squatted id: turn %d session %q; want its own first turn", sum.Turn, sum.Session)
	}
	_, mine := f.do(t, "GET", "/v1/sessions/build-42", "", "")
	_, theirs := f.do(t, "GET", "/v1/sessions/build-42?sigil=squatter", "", "")
	if !strings.Contains(mine, "the owner's question") || strings.Contains(mine, "squatted") {
		t.Errorf("the default sigil's session holds:\n%s", mine)
	}
	if !strings.Contains(theirs, "squatted") || strings.Contains(theirs, "the owner's question") {
		t.Errorf("the squatter's session holds:\n%s", theirs)
	}
	// No oracle: another's id and one never used read alike.
	s1, b1 := f.do(t, "GET", "/v1/sessions/mine-only?sigil=squatter", "", "")
	f.ask(t, "mine-only", "exists now")
	s2, b2 := f.do(t, "GET", "/v1/sessions/mine-only?sigil=squatter", "", "")
	if s1 != s2 || b1 != b2 {
		t.Errorf("another's id reads otherwise once it exists: %d %s, then %d %s", s1, b1, s2, b2)
	}
	// Listing and deleting stay within the sigil's own sessions.
	if _, list := f.do(t, "GET", "/v1/sessions?sigil=squatter", "", ""); !strings.Contains(list, `"id": "build-42"`) || strings.Contains(list, "mine-only") {
		t.Errorf("the squatter's list:\n%s", list)
	}
	if status, _ := f.do(t, "DELETE", "/v1/sessions/build-42?sigil=squatter", "", ""); status != 204 {
		t.Errorf("the squatter deletes its own: %d", status)
	}
	if _, mine := f.do(t, "GET", "/v1/sessions/build-42", "", ""); !strings.Contains(mine, "the owner's question") {
		t.Errorf("the squatter's delete reached the default sigil's session:\n%s", mine)
	}
}
