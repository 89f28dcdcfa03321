package mcpserver

import (
	"encoding/json"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/mcptest"
)

// FuzzToolCall calls any tool with any JSON arguments on a server whose
// sigil may ask and search. The answer is a JSON-RPC error with a message
// (a tool the server does not offer, arguments that are no object), a
// tool error that says what was wrong, or a success of a tool it offers
// whose arguments were an object and whose request to the daemon was well
// formed (a query that is not blank, a valid session id, k from 1 to 50).
func FuzzToolCall(f *testing.F) {
	seeds := []struct{ tool, args string }{
		{"ask", `{"query":"What does Handler1 return?"}`},
		{"ask", `{"query":"hi","session":"mine.1","pin":true}`},
		{"ask", `{"query":"hi","session":"../x"}`},
		{"ask", `{"query":"  "}`},
		{"ask", `{"query":5}`},
		{"ask", `{"query":"hi","question":"hi"}`},
		{"ask", `{"query":"overload"}`},
		{"ask", `{"query":"interrupt"}`},
		{"ask", `[]`},
		{"ask", `null`},
		{"search_codex", `{"query":"Handler1","k":2}`},
		{"search_codex", `{"query":"x","k":0}`},
		{"search_codex", `{"query":"x","k":51}`},
		{"search_codex", `{"query":"x","k":1.5}`},
		{"search_codex", `{"query":"nothing"}`},
		{"status", `{}`},
		{"status", `{"verbose":true}`},
		{"karma_verify", `{"trace":1}`},
	}
	for _, s := range seeds {
		f.Add(s.tool, []byte(s.args))
	}
	fd := newFakeDaemon(f)
	_, cs := connect(f, fd, "reader")
	f.Fuzz(func(t *testing.T, tool string, args []byte) {
		if !json.Valid(args) {
			return // the client cannot send it: arguments are JSON
		}
		before := len(fd.asked())
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: json.RawMessage(args)})
		if err != nil {
			var we *jsonrpc.Error
			if !errors.As(err, &we) || we.Message == "" {
				t.Fatalf("%s %s: %v, not a JSON-RPC error", tool, args, err)
			}
			return
		}
		text := mcptest.Text(res)
		if res.IsError {
			if strings.TrimSpace(text) == "" {
				t.Fatalf("%s %s: a tool error that says nothing", tool, args)
			}
			return
		}
		var in map[string]any
		if err := json.Unmarshal(args, &in); err != nil && string(args) != "null" {
			t.Fatalf("%s %s: arguments that are no object succeed: %q", tool, args, text)
		}
		switch tool {
		case "ask":
			asks := fd.asked()
			if len(asks) != before+1 {
				t.Fatalf("ask %s succeeds after %d asks of the daemon", args, len(asks)-before)
			}
			a := asks[len(asks)-1]
			if strings.TrimSpace(a.Query) == "" || ctxd.CheckSessionID(a.Session) != nil {
				t.Fatalf("ask %s asked the daemon %+v", args, a)
			}
		case "search_codex":
			if k, ok := in["k"]; ok {
				if n, isNum := k.(float64); !isNum || n != float64(int(n)) || n < 1 || n > maxK {
					t.Fatalf("search_codex %s succeeds with k %v", args, k)
				}
			}
		case "status":
		default:
			t.Fatalf("%s %s: a tool the server does not offer succeeds: %q", tool, args, text)
		}
	})
}

// FuzzCodexURI turns any slash path into a codex URI and any string back
// into a path. A valid path comes back unchanged from its URI, and
// whatever a URI names is a valid path (no .., no leading /), never the
// root, whose own URI names it again.
func FuzzCodexURI(f *testing.F) {
	for _, s := range []string{"README.md", "dir with space/a", "pkg/handlers.go", "a%2Fb", "ünï/cödé.go", "?#", "../etc/passwd", "/abs", "a//b", ".", ""} {
		f.Add(s, uriPrefix+s)
	}
	f.Add("x", "ctxd-codex:///%zz")
	f.Add("x", "ctxd-codex:///a%2F..%2F..%2Fetc")
	f.Add("x", "file:///etc/passwd")
	f.Fuzz(func(t *testing.T, p, uri string) {
		if fs.ValidPath(p) && p != "." {
			if got, ok := codexPath(codexURI(p)); !ok || got != p {
				t.Fatalf("path %q: URI %q names %q (%v)", p, codexURI(p), got, ok)
			}
		}
		got, ok := codexPath(uri)
		if !ok {
			return
		}
		if !fs.ValidPath(got) || got == "." {
			t.Fatalf("URI %q names the path %q", uri, got)
		}
		if again, ok := codexPath(codexURI(got)); !ok || again != got {
			t.Fatalf("URI %q names %q, whose URI %q names %q", uri, got, codexURI(got), again)
		}
	})
}
