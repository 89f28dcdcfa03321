package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// karmaDaemon answers the karma routes on a Unix socket the way the
// daemon does, and records each request: "METHOD PATH?QUERY BODY".
type karmaDaemon struct {
	sock string
	mu   sync.Mutex
	reqs []string
}

func (d *karmaDaemon) requests() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.reqs
	d.reqs = nil
	return out
}

func serveKarma(t *testing.T) *karmaDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctxd-k-") // short: a socket path is at most ~108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &karmaDaemon{sock: filepath.Join(dir, "ctxd.sock")}
	ln, err := net.Listen("unix", d.sock)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	judged := func(id int64, action string, j ctxd.KarmaJudgement) ctxd.Trace {
		tr := ctxd.Trace{ID: id, Status: ctxd.TraceRecorded, Note: j.Note}
		switch action {
		case ctxd.KarmaVerify:
			tr.Status = ctxd.TraceVerified
		case ctxd.KarmaReject:
			tr.Status = ctxd.TraceRejected
		case ctxd.KarmaPin:
			tr.Pinned = true
		case ctxd.KarmaSupersede:
			tr.SupersededBy = j.By
		}
		return tr
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		d.mu.Lock()
		d.reqs = append(d.reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+string(body)))
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		var v any
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/v1/karma":
			v = map[string]any{"traces": []ctxd.Trace{
				{ID: 2, Session: "s", Status: ctxd.TraceVerified, Pinned: true, Query: "a   question\nover two lines", CreatedAt: at},
				{ID: 1, Session: "s", Status: ctxd.TraceRecorded, SupersededBy: 2, Query: strings.Repeat("long ", 20), CreatedAt: at},
			}}
		case r.Method == http.MethodGet && r.URL.Path == "/v1/karma/7":
			v = ctxd.TraceHistory{Trace: ctxd.Trace{ID: 7, Status: ctxd.TraceVerified},
				Events: []ctxd.KarmaEvent{{Trace: 7, Action: ctxd.KarmaVerify, At: at}}}
		case r.Method == http.MethodGet && r.URL.Path == "/v1/karma/404":
			w.WriteHeader(http.StatusNotFound)
			v = map[string]any{"error": map[string]string{"kind": "not_found", "message": "no trace 404"}}
		case r.Method == http.MethodGet && r.URL.Path == "/v1/sessions/s 1/karma":
			v = map[string]any{"snapshots": []ctxd.KarmaSnapshot{{Session: "s 1", KarmaEpoch: 1, Reason: "first", At: at}}}
		case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/karma/3/"):
			var j ctxd.KarmaJudgement
			_ = json.Unmarshal(body, &j)
			v = judged(3, strings.TrimPrefix(r.URL.Path, "/v1/karma/3/"), j)
		default:
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(v)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("the fake daemon did not stop within 10s")
		}
	})
	return d
}

// TestKarmaCommand runs each `ctxd karma` subcommand against a fake
// daemon: the request it sends, what it prints, and its refusals of bad
// command lines before anything is sent.
func TestKarmaCommand(t *testing.T) {
	t.Setenv("CTXD_TOKEN", "")
	t.Setenv("CTXD_DAEMON_UIDS", "")
	d := serveKarma(t)
	cases := []struct {
		name   string
		args   []string // --socket added at the end, unless they place it (SOCK)
		reqs   []string // the requests sent, in order
		stdout []string // what the output holds
		err    string   // what the error says ("": none)
	}{
		{name: "no subcommand", err: "usage:\n  ctxd karma list"},
		{name: "unknown", args: []string{"frob"}, err: `unknown karma command "frob"`},
		{name: "list", args: []string{"list"}, reqs: []string{"GET /v1/karma?"},
			stdout: []string{"ID  STATUS", "2   verified", "pinned", "a question over two lines", "1   recorded (superseded by 2)", strings.Repeat("long ", 11) + "long…"}},
		{name: "list filtered", args: []string{"list", "--session", "s", "--status", "verified", "--pinned", "--q", "two words", "--at", "2026-01-02T03:04:05+01:00"},
			reqs: []string{"GET /v1/karma?at=2026-01-02T02%3A04%3A05Z&pinned=true&q=two+words&session=s&status=verified"}, stdout: []string{"ID  STATUS"}},
		{name: "list json", args: []string{"list", "--json"}, reqs: []string{"GET /v1/karma?"}, stdout: []string{"[\n  {\n    \"id\": 2,"}},
		{name: "list with an argument", args: []string{"list", "x"}, err: `karma list takes no argument "x"`},
		{name: "list at a bad time", args: []string{"list", "--at", "yesterday"}, err: `--at "yesterday" must be an RFC 3339 time`},
		{name: "list with a judging flag", args: []string{"list", "--note", "x"}, err: "flag provided but not defined: -note"},
		{name: "show", args: []string{"show", "7"}, reqs: []string{"GET /v1/karma/7"}, stdout: []string{"\"trace\": {\n    \"id\": 7,", "\"action\": \"verify\""}},
		{name: "show unknown", args: []string{"show", "404"}, reqs: []string{"GET /v1/karma/404"}, err: "no trace 404"},
		{name: "show without an id", args: []string{"show"}, err: "karma show needs an argument"},
		{name: "show a bad id", args: []string{"show", "x7"}, err: `trace id "x7" must be a positive number`},
		{name: "show id zero", args: []string{"show", "0"}, err: `trace id "0" must be a positive number`},
		{name: "epochs", args: []string{"epochs", "s 1"}, reqs: []string{"GET /v1/sessions/s%201/karma"}, stdout: []string{"\"karma_epoch\": 1", "\"reason\": \"first\""}},
		{name: "epochs without a session", args: []string{"epochs"}, err: "karma epochs needs an argument"},
		{name: "verify", args: []string{"verify", "3", "--note", "checked"}, reqs: []string{`POST /v1/karma/3/verify {"note":"checked"}`},
			stdout: []string{"trace 3: verified (sessions take it in at their next karma epoch)\n"}},
		{name: "reject, flags first", args: []string{"reject", "--note", "wrong", "3"}, reqs: []string{`POST /v1/karma/3/reject {"note":"wrong"}`},
			stdout: []string{"trace 3: rejected (sessions"}},
		{name: "pin", args: []string{"pin", "3"}, reqs: []string{`POST /v1/karma/3/pin {}`}, stdout: []string{"trace 3: recorded, pinned (sessions"}},
		{name: "unpin json", args: []string{"unpin", "3", "--json"}, reqs: []string{`POST /v1/karma/3/unpin {}`}, stdout: []string{"\"id\": 3,", "\"pinned\": false"}},
		{name: "pin with a note", args: []string{"pin", "3", "--note", "x"}, err: "flag provided but not defined: -note"},
		{name: "supersede", args: []string{"supersede", "3", "--by", "4", "--note", "newer"}, reqs: []string{`POST /v1/karma/3/supersede {"note":"newer","by":4}`},
			stdout: []string{"trace 3: recorded, superseded by 4 (sessions"}},
		{name: "supersede without by", args: []string{"supersede", "3"}, err: "supersede needs --by ID2"},
		{name: "verify two ids", args: []string{"verify", "3", "4"}, err: `unexpected arguments ["4" "--socket"`},
		{name: "flags around the id", args: []string{"verify", "--socket", "SOCK", "3", "--note", "after", "--json"},
			reqs: []string{`POST /v1/karma/3/verify {"note":"after"}`}, stdout: []string{"\"note\": \"after\""}},
		{name: "a second id after flags", args: []string{"reject", "--note", "x", "3", "4"}, err: `unexpected arguments ["4" "--socket"`},
		{name: "a bad flag after the id", args: []string{"pin", "--json", "3", "--note", "x"}, err: "flag provided but not defined: -note"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			args := c.args
			if slices.Contains(args, "SOCK") {
				args = slices.Clone(args)
				args[slices.Index(args, "SOCK")] = d.sock
			} else if len(args) > 0 {
				args = append(args[:len(args):len(args)], "--socket", d.sock)
			}
			err := cmdKarma(args, &out)
			switch {
			case c.err == "" && err != nil:
				t.Errorf("error %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Errorf("error %v, want one saying %q", err, c.err)
			}
			for _, want := range c.stdout {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			if c.stdout == nil && out.Len() > 0 {
				t.Errorf("output %q, want none", out.String())
			}
			if got := d.requests(); strings.Join(got, "\n") != strings.Join(c.reqs, "\n") {
				t.Errorf("requests %q, want %q", got, c.reqs)
			}
		})
	}
}
