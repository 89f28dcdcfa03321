package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/sockowner"
)

// Client is a ctxd API client.
type Client struct {
	socket string
	base   string // http://ctxd on the socket, or the TCP listener's URL
	token  string
	sigil  string // X-Ctxd-Sigil: the sigil requests act as on the socket ("": the token's, or the default)
	http   *http.Client
	uids   []int // the uids a daemon on the socket may run as, besides the client's own
}

// Option configures a client.
type Option func(*Client)

// WithToken sends a sigil's token with every request (Authorization:
// Bearer): the request acts as that sigil. The TCP listener requires one.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithSigil has every request act as the sigil name (X-Ctxd-Sigil): on
// the socket, where the daemon trusts its owner, that reaches the sessions
// and traces of an agent that uses a token elsewhere. With a token, it
// must name the token's own sigil.
func WithSigil(name string) Option { return func(c *Client) { c.sigil = name } }

// WithTransport sends every request through rt instead of the socket: for
// a program that serves the daemon's API in process (the daemon's own MCP
// endpoint does), and for tests.
func WithTransport(rt http.RoundTripper) Option {
	return func(c *Client) { c.http = &http.Client{Transport: rt} }
}

// WithDaemonUIDs lets the client talk to a daemon on the socket that runs
// as one of uids (a system service's user), besides the client's own uid.
func WithDaemonUIDs(uids ...int) Option { return func(c *Client) { c.uids = append(c.uids, uids...) } }

// ErrNotTheDaemon is a socket served by a process the client does not
// trust: one of another uid (someone took the socket's place).
var ErrNotTheDaemon = errors.New("the socket's server is not a daemon this client trusts")

// New returns a client for the daemon listening on the Unix socket.
// Before it sends anything on a connection it checks who serves the
// socket (SO_PEERCRED): a process of another uid than the client's (or
// one WithDaemonUIDs allows) is refused, so a socket another user put in
// the daemon's place never sees a question.
func New(socket string, opts ...Option) *Client {
	c := &Client{socket: socket, base: "http://ctxd"}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, err
			}
			if err := c.checkServer(conn); err != nil {
				conn.Close()
				return nil, err
			}
			return conn, nil
		},
	}
	c.http = &http.Client{Transport: tr}
	for _, o := range opts {
		o(c)
	}
	return c
}

// checkServer refuses a socket served by a process of an untrusted uid.
func (c *Client) checkServer(conn net.Conn) error {
	cred, ok := sockowner.Peer(conn)
	uid, pid := cred.UID, cred.PID
	if !ok || uid == os.Getuid() || slices.Contains(c.uids, uid) {
		return nil // no peer credentials on this system: nothing to check against
	}
	return fmt.Errorf("ctxd: %w: %s is served by pid %d running as uid %d, not as you (uid %d); "+
		"remove the socket and its directory and restart ctxd, or allow that uid (CTXD_DAEMON_UIDS)",
		ErrNotTheDaemon, c.socket, pid, uid, os.Getuid())
}

// NewTCP returns a client for the daemon's TCP listener at base (e.g.
// http://127.0.0.1:11435); it needs WithToken.
func NewTCP(base string, opts ...Option) *Client {
	c := &Client{socket: base, base: strings.TrimSuffix(base, "/"), http: &http.Client{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// APIError is an error answer from the daemon.
type APIError struct {
	Status  int
	Kind    ctxd.Kind
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// ErrorKind is the error's kind, as the daemon named it: ctxd.KindOf
// reads it.
func (e *APIError) ErrorKind() ctxd.Kind { return e.Kind }

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.sigil != "" {
		req.Header.Set("X-Ctxd-Sigil", c.sigil)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ctxd: cannot reach the daemon at %s (is `ctxd serve` running?): %w", c.socket, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var e struct {
			Error string    `json:"error"`
			Kind  ctxd.Kind `json:"kind"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = string(b)
		}
		return nil, &APIError{Status: resp.StatusCode, Kind: e.Kind, Message: e.Error}
	}
	return resp, nil
}

// GetJSON fetches path and decodes the answer into v.
func (c *Client) GetJSON(ctx context.Context, path string, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// GetRaw fetches path and returns the body.
func (c *Client) GetRaw(ctx context.Context, path string) ([]byte, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// stream posts body to path and decodes each NDJSON line of the answer into
// a new E, handing it to handle until handle says the stream is done.
func stream[E any](ctx context.Context, c *Client, path string, body any, handle func(E) (done bool, err error)) error {
	resp, err := c.do(ctx, http.MethodPost, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev E
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("ctxd: bad stream line %q: %w", sc.Text(), err)
		}
		if done, err := handle(ev); done || err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("ctxd: stream: %w", err)
	}
	return fmt.Errorf("ctxd: the stream from %s ended without a result", path)
}

// Ask sends a query and calls onToken with each piece of the answer. It
// returns the summary that ends the stream.
func (c *Client) Ask(ctx context.Context, req ctxd.AskRequest, onToken func(string)) (*ctxd.Summary, error) {
	var sum *ctxd.Summary
	err := stream(ctx, c, "/v1/ask", req, func(ev ctxd.Event) (bool, error) {
		switch ev.Type {
		case ctxd.EventToken:
			if onToken != nil {
				onToken(ev.Text)
			}
		case ctxd.EventSummary:
			sum = ev.Summary
			return true, nil
		case ctxd.EventError:
			return true, &APIError{Status: ev.Status, Kind: ev.Kind, Message: ev.Error}
		}
		return false, nil
	})
	return sum, err
}

// LoadCodex makes the tree at path (on the daemon's machine) the daemon's
// codex, calling onProgress as it loads, and returns the loaded codex.
func (c *Client) LoadCodex(ctx context.Context, path string, onProgress func(ctxd.CodexProgress)) (*ctxd.CodexStats, error) {
	var st *ctxd.CodexStats
	err := stream(ctx, c, "/v1/codex/load", map[string]string{"path": path}, func(ev ctxd.CodexEvent) (bool, error) {
		switch ev.Type {
		case ctxd.CodexEventProgress:
			if onProgress != nil && ev.Progress != nil {
				onProgress(*ev.Progress)
			}
		case ctxd.CodexEventCodex:
			st = ev.Codex
			return true, nil
		case ctxd.CodexEventError:
			return true, &APIError{Status: ev.Status, Kind: ev.Kind, Message: ev.Error}
		}
		return false, nil
	})
	return st, err
}

// Health is GET /v1/health: nil once the daemon answers requests; an
// *APIError (503) while its backend is starting, saying why.
func (c *Client) Health(ctx context.Context) error {
	resp, err := c.do(ctx, http.MethodGet, "/v1/health", nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// Status is GET /v1/status. The daemon's status has many parts; it is
// decoded into v (httpapi.Status, or a map).
func (c *Client) Status(ctx context.Context, v any) error { return c.GetJSON(ctx, "/v1/status", v) }

// Schema is GET /v1/schema: the RunContext's JSON Schema.
func (c *Client) Schema(ctx context.Context) ([]byte, error) { return c.GetRaw(ctx, "/v1/schema") }

// Sessions is GET /v1/sessions: every session, by id.
func (c *Client) Sessions(ctx context.Context) ([]ctxd.SessionInfo, error) {
	var out struct {
		Sessions []ctxd.SessionInfo `json:"sessions"`
	}
	err := c.GetJSON(ctx, "/v1/sessions", &out)
	return out.Sessions, err
}

// Session is GET /v1/sessions/{id}: the session's current epoch.
func (c *Client) Session(ctx context.Context, id string) (*ctxd.SessionTurns, error) {
	var out ctxd.SessionTurns
	if err := c.GetJSON(ctx, "/v1/sessions/"+url.PathEscape(id), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSession is DELETE /v1/sessions/{id}; it waits for the session's
// running request.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	resp, err := c.do(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(id), nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// LastPrompt is GET /v1/sessions/{id}/prompt: the exact text the
// session's last request sent to the backend.
func (c *Client) LastPrompt(ctx context.Context, id string) (*ctxd.LastPrompt, error) {
	var out ctxd.LastPrompt
	if err := c.GetJSON(ctx, "/v1/sessions/"+url.PathEscape(id)+"/prompt", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CodexStats is GET /v1/codex: the loaded codex.
func (c *Client) CodexStats(ctx context.Context) (*ctxd.CodexStats, error) {
	var out ctxd.CodexStats
	if err := c.GetJSON(ctx, "/v1/codex", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SearchCodex is GET /v1/codex/search: the k codex excerpts that best
// match q (k <= 0: the daemon's default).
func (c *Client) SearchCodex(ctx context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	v := url.Values{"q": {q}}
	if k > 0 {
		v.Set("k", strconv.Itoa(k))
	}
	var out struct {
		Excerpts []ctxd.Excerpt `json:"excerpts"`
	}
	err := c.GetJSON(ctx, "/v1/codex/search?"+v.Encode(), &out)
	return out.Excerpts, err
}

// CodexFiles is GET /v1/codex/files: the codex's files in path order.
func (c *Client) CodexFiles(ctx context.Context) ([]ctxd.CodexFile, error) {
	var out struct {
		Files []ctxd.CodexFile `json:"files"`
	}
	err := c.GetJSON(ctx, "/v1/codex/files", &out)
	return out.Files, err
}

// CodexFile is GET /v1/codex/files/{path}: one file's content as prompts
// see it (secrets redacted).
func (c *Client) CodexFile(ctx context.Context, path string) (*ctxd.CodexFileContent, error) {
	var out ctxd.CodexFileContent
	if err := c.GetJSON(ctx, "/v1/codex/files/"+escapePath(path), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Sigil is GET /v1/sigil: the sigil this client's requests act as.
func (c *Client) Sigil(ctx context.Context) (*ctxd.SigilInfo, error) {
	var out ctxd.SigilInfo
	if err := c.GetJSON(ctx, "/v1/sigil", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// escapePath escapes each segment of a slash-separated path.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// KarmaFilter selects traces for Karma; zero fields do not filter.
type KarmaFilter struct {
	Session string
	Status  string // recorded, verified or rejected
	Pinned  bool
	Text    string    // full-text match over query, answer and note
	At      time.Time // the record as it stood then
	Limit   int
	// Stale: only the traces whose code changed since they were
	// verified (against the codex loaded now): what needs verifying again.
	Stale bool
}

// Karma is GET /v1/karma: this client's sigil's traces, newest first.
func (c *Client) Karma(ctx context.Context, f KarmaFilter) ([]ctxd.Trace, error) {
	v := url.Values{}
	for k, s := range map[string]string{"session": f.Session, "status": f.Status, "q": f.Text} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.Pinned {
		v.Set("pinned", "true")
	}
	if f.Stale {
		v.Set("stale", "true")
	}
	if !f.At.IsZero() {
		v.Set("at", f.At.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit > 0 {
		v.Set("limit", strconv.Itoa(f.Limit))
	}
	var out struct {
		Traces []ctxd.Trace `json:"traces"`
	}
	err := c.GetJSON(ctx, "/v1/karma?"+v.Encode(), &out)
	return out.Traces, err
}

// Trace is GET /v1/karma/{id}: one trace and its events.
func (c *Client) Trace(ctx context.Context, id int64) (*ctxd.TraceHistory, error) {
	var out ctxd.TraceHistory
	if err := c.GetJSON(ctx, "/v1/karma/"+strconv.FormatInt(id, 10), &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Judge is POST /v1/karma/{id}/{action}: verify, reject, pin, unpin, or
// supersede (j.By replaces the trace). It returns once the judgement is
// durable.
func (c *Client) Judge(ctx context.Context, id int64, action string, j ctxd.KarmaJudgement) (*ctxd.Trace, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/karma/"+strconv.FormatInt(id, 10)+"/"+url.PathEscape(action), j)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out ctxd.Trace
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("ctxd: karma %s: %w", action, err)
	}
	return &out, nil
}

// SessionKarma is GET /v1/sessions/{id}/karma: the karma epochs the
// session was shown, oldest first.
func (c *Client) SessionKarma(ctx context.Context, id string) ([]ctxd.KarmaSnapshot, error) {
	var out struct {
		Snapshots []ctxd.KarmaSnapshot `json:"snapshots"`
	}
	err := c.GetJSON(ctx, "/v1/sessions/"+url.PathEscape(id)+"/karma", &out)
	return out.Snapshots, err
}

// Reload has the daemon read its configuration again (POST /v1/reload;
// the admin scope) and decodes the outcome into v (httpapi.ReloadStatus).
// A refused configuration is an *APIError whose message says why; the
// daemon's old configuration stays in force.
func (c *Client) Reload(ctx context.Context, v any) error {
	resp, err := c.do(ctx, http.MethodPost, "/v1/reload", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// DashboardToken asks for a short-lived token that opens the dashboard as
// sigil ("" for the client's own: its token's, or the default).
func (c *Client) DashboardToken(ctx context.Context, sigil string) (*ctxd.DashboardToken, error) {
	path := "/v1/dashboard/token"
	if sigil != "" {
		path += "?sigil=" + url.QueryEscape(sigil)
	}
	resp, err := c.do(ctx, http.MethodPost, path, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out ctxd.DashboardToken
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("ctxd: dashboard token: %w", err)
	}
	return &out, nil
}

// LogLevel returns the daemon's log level; with level set, it changes it
// first (PUT /v1/log/level; the admin scope).
func (c *Client) LogLevel(ctx context.Context, level string) (string, error) {
	method, body := http.MethodGet, any(nil)
	if level != "" {
		method, body = http.MethodPut, map[string]string{"level": level}
	}
	resp, err := c.do(ctx, method, "/v1/log/level", body)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b struct {
		Level string `json:"level"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&b); err != nil {
		return "", fmt.Errorf("ctxd: log level: %w", err)
	}
	return b.Level, nil
}
