package openai

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ctxd/ctxd"
)

// Options are fixed for the life of a client.
type Options struct {
	Model       string // the model's name on the server (the request's "model")
	APIKey      string // sent as a bearer token when set
	CAFile      string // PEM certificates the server's must chain to ("": the system's roots)
	Temperature float64
	Seed        int
	// Tokens sends the prompt as the token ids ctxd counted (a server that
	// takes them: vLLM, SGLang, llama-server) rather than as text, so the
	// server caches exactly what ctxd counted.
	Tokens bool
	// Retries is how often a request that cannot have reached a model
	// (refused connection, 429 or 503 before any answer) is sent again.
	Retries int
	// ConnectTimeout bounds a connection's dial and TLS handshake (0: 10 s).
	ConnectTimeout time.Duration
	// IdleTimeout ends a generation whose server sends nothing, not even
	// its answer's headers, for this long (0: 10 minutes: a long prompt on
	// a busy engine can take minutes before its first token).
	IdleTimeout time.Duration
	Routing     Routing
	Logger      *slog.Logger
	// Transport replaces the HTTP transport (tests inject faults); nil:
	// one built from the options.
	Transport http.RoundTripper
}

// Routing says how each request names its session to the engine and the
// router in front of it. Values are templates: {session} is the session's
// routing key (a condensation of the session's history goes under it too,
// as it reads the same cached prefix), {parent} the parent's of a
// sub-agent's session (ctxd.AskRequest.Parent). A header or field whose
// value comes out empty is not sent.
type Routing struct {
	Headers map[string]string // HTTP header name → value template
	Fields  map[string]string // top-level request body field → value template
}

// DefaultRouting is what the engines route by, by their documentation
// and source: NVIDIA Dynamo's session headers (x-dynamo-session-id, the
// affinity key of its KV router; x-dynamo-parent-session-id, a sub-agent's
// parent) and the SGLang gateway's routing key (X-SMG-Routing-Key, which
// its consistent_hashing and manual policies hash). docs/scale.md says
// more.
func DefaultRouting() Routing {
	return Routing{
		Headers: map[string]string{
			"X-Dynamo-Session-ID":        "{session}",
			"X-Dynamo-Parent-Session-ID": "{parent}",
			"X-SMG-Routing-Key":          "{session}",
		},
		Fields: map[string]string{},
	}
}

// RoutingKey is the key a session is routed by: the same on every daemon
// (a session handed to another daemon lands on the same engine). It is a
// digest, not the id: the engine's logs do not show the session's name or
// its sigil, though one who can guess an id can compute its key.
func RoutingKey(session string) string {
	if session == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("ctxd-session\x00" + session))
	return hex.EncodeToString(sum[:16])
}

// expand fills a value template.
func expand(tmpl, session, parent string) string {
	return strings.NewReplacer("{session}", RoutingKey(session), "{parent}", RoutingKey(parent)).Replace(tmpl)
}

// Client talks to one OpenAI-compatible server (or a router).
type Client struct {
	base string // scheme://host[:port][/prefix], without /v1
	http *http.Client
	opts Options
	log  *slog.Logger
	// shape is how the server's /tokenize takes its text, once known
	// (a tokenizeShape).
	shape atomic.Int32
	// reportsCached: the server has reported cached_tokens; vLLM and
	// SGLang leave the field out when it is 0.
	reportsCached atomic.Bool
}

var _ ctxd.Backend = (*Client)(nil)

// New returns a client for the server at base: its URL, with or without
// the trailing /v1.
func New(base string, opts Options) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("openai: %q is not an http(s) URL", base)
	}
	if u.User != nil {
		return nil, fmt.Errorf("openai: the URL holds credentials: give the key as backend.api_key instead")
	}
	u.RawQuery, u.Fragment = "", ""
	u.Path = strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1")
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 10 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{base: u.String(), opts: opts, log: opts.Logger}
	tr := opts.Transport
	if tr == nil {
		t := &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: opts.ConnectTimeout,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     4 * time.Second, // under llama-server's 5 s keep-alive
		}
		if opts.CAFile != "" {
			pem, err := os.ReadFile(opts.CAFile)
			if err != nil {
				return nil, fmt.Errorf("openai: backend.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("openai: backend.ca_file %s holds no PEM certificate", opts.CAFile)
			}
			t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		tr = t
	}
	c.http = &http.Client{Transport: tr}
	return c, nil
}

// requestTimeout bounds a request that is not a generation (the models,
// a count, the probe of a one-token answer): a server that does not
// answer one in this long is taken as not answering.
const requestTimeout = time.Minute

// Addr is the server's base URL.
func (c *Client) Addr() string { return c.base }

// Errors callers branch on, wrapped in *ctxd.Error values.
var (
	// ErrUnavailable: the server cannot be reached (KindUnavailable).
	ErrUnavailable = errors.New("the OpenAI-compatible server is not reachable")
	// ErrTooLong: the prompt is over the server's window (KindDoesNotFit).
	ErrTooLong = errors.New("prompt exceeds the server's context")
	// ErrNoTokenize: the server offers no /tokenize.
	ErrNoTokenize = errors.New("the server offers no /tokenize")
)

// apiError is an OpenAI-style error body: {"error": {...}}, or FastAPI's
// {"detail": ...}, or {"message": ...} (vLLM's and SGLang's older ones).
type apiError struct {
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
	Message string `json:"message"`
	Detail  any    `json:"detail"`
}

func (e apiError) text() string {
	switch {
	case e.Error != nil && e.Error.Message != "":
		return e.Error.Message
	case e.Message != "":
		return e.Message
	case e.Detail != nil:
		b, _ := json.Marshal(e.Detail)
		return string(b)
	}
	return ""
}

// request is one HTTP request to the server, sent by send.
type request struct {
	method, path string
	body         any
	header       http.Header
	// close: the connection closes with the answer. A completion's does:
	// a server may close a connection after a streamed answer without
	// saying so (llama-server does), and a request sent on a pooled one it
	// is closing fails after it was written, when ctxd cannot know whether
	// the server began it, so it cannot be sent again. A new connection
	// per completion costs a dial (and a TLS handshake), small beside a
	// generation.
	close bool
	// idempotent: sending it twice does no harm (a read, a count), so
	// Go's transport may send it again on a new connection when a pooled
	// one was closed under it.
	idempotent bool
}

// send sends r and returns the server's answer, its status under 400.
// Only what cannot have reached a model is tried again (see the package
// doc); the answer's body is the caller's to close.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	var payload []byte
	if r.body != nil {
		var err error
		if payload, err = json.Marshal(r.body); err != nil {
			return nil, err
		}
	}
	for attempt := 0; ; attempt++ {
		resp, retryAfter, err := c.sendOnce(ctx, r, payload)
		if err == nil {
			return resp, nil
		}
		if retryAfter < 0 || attempt >= c.opts.Retries {
			return nil, err
		}
		wait := min(max(retryAfter, time.Duration(250<<attempt)*time.Millisecond), 10*time.Second)
		c.log.Info("backend request not accepted: sending it again", "path", r.path, "attempt", attempt+2, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("openai: %s: %w", r.path, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// sendOnce sends r once. retryAfter ≥ 0 says the request never reached a
// model and may be sent again after that long; −1 that it may not.
func (c *Client) sendOnce(ctx context.Context, r request, payload []byte) (_ *http.Response, retryAfter time.Duration, _ error) {
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.base+r.path, rd)
	if err != nil {
		return nil, -1, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Close = r.close
	if r.idempotent {
		req.Header["Idempotency-Key"] = nil // marks it idempotent; the header is not sent
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		werr := c.wrap(r.path, err)
		if refused(err) {
			return nil, 0, werr
		}
		return nil, -1, werr
	}
	if resp.StatusCode < 400 {
		return resp, -1, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e apiError
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &e) == nil && e.text() != "" {
		msg = e.text()
	}
	err = c.statusError(r.path, resp.StatusCode, msg)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return nil, time.Duration(max(0, secs)) * time.Second, err
	}
	return nil, -1, err
}

// refused reports whether a transport error means the request never left:
// the connection could not be made.
func refused(err error) bool {
	var oe *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &oe) && oe.Op == "dial"
}

// statusErr carries the HTTP status of an error answer beneath its
// *ctxd.Error.
type statusErr struct {
	status int
	cause  error // a sentinel callers branch on, or nil
}

func (e *statusErr) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("HTTP %d: %v", e.status, e.cause)
	}
	return fmt.Sprintf("HTTP %d", e.status)
}
func (e *statusErr) Unwrap() error { return e.cause }

// StatusOf is the HTTP status of the server's error answer in err, 0
// for another error.
func StatusOf(err error) int {
	var se *statusErr
	if errors.As(err, &se) {
		return se.status
	}
	return 0
}

// statusError classifies an error answer.
func (c *Client) statusError(path string, status int, msg string) error {
	if msg == "" {
		msg = http.StatusText(status)
	}
	text := fmt.Sprintf("openai: %s%s: %d %s", c.base, path, status, msg)
	lower := strings.ToLower(msg)
	e := &ctxd.Error{Kind: ctxd.KindBackend, Err: &statusErr{status: status}, Message: text}
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		e.Message += " (check backend.api_key)"
	case strings.Contains(lower, "context length") || strings.Contains(lower, "maximum context") ||
		strings.Contains(lower, "exceed") && strings.Contains(lower, "context"):
		e.Kind, e.Err = ctxd.KindDoesNotFit, &statusErr{status: status, cause: ErrTooLong}
	case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
		e.Kind, e.Err = ctxd.KindUnavailable, &statusErr{status: status, cause: ErrUnavailable}
		e.Message += " (the server is busy or starting)"
	case status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		// A router or proxy in front of the engines found none answering.
		// Not sent again: the engine may have had the request.
		e.Kind, e.Err = ctxd.KindUnavailable, &statusErr{status: status, cause: ErrUnavailable}
		e.Message += " (a router or proxy in front of the engine found no engine answering: it is down, restarting or unreachable)"
	case status == http.StatusNotFound && strings.Contains(lower, "model"):
		e.Message += " (check backend.model against the server's /v1/models)"
	case status < 500:
		e.Message += " (ctxd sent a request the server refused)"
	}
	return e
}

// wrap classifies a transport error.
func (c *Client) wrap(path string, err error) error {
	var cve *tls.CertificateVerificationError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("openai: %s: %w", path, err)
	case errors.As(err, &cve):
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %v", ErrUnavailable, err),
			Message: fmt.Sprintf("openai: %s%s: the server's certificate is not trusted (%v): give its CA as backend.ca_file", c.base, path, err)}
	case refused(err), errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %v", ErrUnavailable, err),
			Message: fmt.Sprintf("openai: %s%s: %v: %v", c.base, path, ErrUnavailable, err)}
	}
	return &ctxd.Error{Kind: ctxd.KindBackend, Err: err, Message: fmt.Sprintf("openai: %s%s: %v", c.base, path, err)}
}

// getJSON reads a JSON answer into out, within requestTimeout.
func (c *Client) getJSON(ctx context.Context, r request, out any) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.send(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return c.wrap(r.path, fmt.Errorf("decode the answer: %w", err))
	}
	return nil
}
