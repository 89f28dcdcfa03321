package ollama

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	"syscall"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/ctxd/ctxd"
)

// Errors callers branch on. The errors returned wrap them in a *ctxd.Error
// of kind KindUnavailable and KindBackend.
var (
	ErrUnavailable   = errors.New("ollama is not reachable")
	ErrModelNotFound = errors.New("model not found")
)

// Options are fixed for the life of a client. The load options (NumCtx,
// NumBatch, NumThread, NumGPU) make Ollama reload the model when they
// change, so they are sent identically on every request; zero fields are
// left to Ollama's defaults, which are just as fixed.
type Options struct {
	NumCtx    int
	NumBatch  int
	NumThread int
	NumGPU    int            // -1: let Ollama decide
	KeepAlive *time.Duration // how long the model stays loaded after a request; nil: forever

	Temperature float64 // sampling; does not reload the model
	Seed        int

	// Dial, when set, makes the client's connections: a managed server's
	// (*Server).DialContext reaches only the process ctxd started. Nil:
	// plain TCP.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client talks to one Ollama server about one model.
type Client struct {
	api   *api.Client
	http  *http.Client
	base  *url.URL
	model string
	opts  Options
}

var _ ctxd.Backend = (*Client)(nil)

// New returns a client for model at base (e.g. http://127.0.0.1:11434).
func New(base *url.URL, model string, opts Options) *Client {
	dial := opts.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 4}}
	return &Client{api: api.NewClient(base, hc), http: hc, base: base, model: model, opts: opts}
}

// Model is the model name the client uses.
func (c *Client) Model() string { return c.model }

// URL is the server's base URL.
func (c *Client) URL() *url.URL { return c.base }

// options builds the request options: the fixed load options plus the
// per-request ones.
func (c *Client) options(req ctxd.GenerateRequest) map[string]any {
	o := map[string]any{}
	if c.opts.NumCtx > 0 {
		o["num_ctx"] = c.opts.NumCtx
	}
	if c.opts.NumBatch > 0 {
		o["num_batch"] = c.opts.NumBatch
	}
	if c.opts.NumThread > 0 {
		o["num_thread"] = c.opts.NumThread
	}
	if c.opts.NumGPU != 0 {
		o["num_gpu"] = c.opts.NumGPU
	}
	if req.MaxTokens > 0 {
		o["num_predict"] = req.MaxTokens
	}
	o["temperature"] = c.opts.Temperature
	o["seed"] = c.opts.Seed
	// Keep the whole prompt if the runner ever shifts: ctxd sizes requests
	// so it never has to, and a shift must not drop the stable blocks.
	o["num_keep"] = req.NumKeep
	if len(req.Stop) > 0 {
		o["stop"] = req.Stop
	}
	return o
}

func (c *Client) keepAlive() *api.Duration {
	if c.opts.KeepAlive == nil {
		return &api.Duration{Duration: -1} // forever
	}
	return &api.Duration{Duration: *c.opts.KeepAlive}
}

// Generate sends the prompt verbatim (raw mode) and calls onToken for
// every piece of the answer as it arrives. Ollama picks the slot itself
// (the free one holding the longest prefix), so req.Slot is not sent.
// Cancelling ctx closes the request, which stops the generation.
func (c *Client) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	var (
		gen   = ctxd.Generation{BackendCached: -1} // Ollama does not say
		sb    strings.Builder
		start = time.Now()
		first = true
		done  bool
		cbErr error // onToken's error: the caller's, returned as it is
	)
	greq := &api.GenerateRequest{
		Model: c.model, Prompt: req.Prompt, Raw: true,
		KeepAlive: c.keepAlive(), Options: c.options(req),
	}
	clean, err := c.generate(ctx, greq, func(r api.GenerateResponse) error {
		if r.Response != "" {
			if first {
				gen.TTFT = time.Since(start)
				first = false
			}
			sb.WriteString(r.Response)
			if onToken != nil {
				if err := onToken(r.Response); err != nil {
					cbErr = err
					return err
				}
			}
		}
		if r.Done {
			done = true
			gen.DoneReason = r.DoneReason
			gen.PromptEvalCount, gen.PromptEvalDuration = r.Metrics.PromptEvalCount, r.Metrics.PromptEvalDuration
			gen.EvalCount, gen.EvalDuration = r.Metrics.EvalCount, r.Metrics.EvalDuration
			if first {
				gen.TTFT = time.Since(start)
			}
		}
		return nil
	})
	gen.Text = sb.String()
	if cbErr != nil {
		return gen, cbErr
	}
	if err != nil && !first && ctx.Err() == nil && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
		return gen, &ctxd.Error{Kind: ctxd.KindBackend, Err: err, Message: fmt.Sprintf(
			"ollama: generate: the server at %s broke off the answer after %d bytes of it (%v): it crashed or was stopped; the partial answer is not recorded", c.base, sb.Len(), err)}
	}
	if err != nil {
		return gen, c.wrap("generate", err)
	}
	if !done && clean {
		// The stream ended cleanly without its final message: Ollama does
		// that when it aborts a generation (one token repeated 30 times,
		// in v0.6.5).
		gen.DoneReason = ctxd.DoneIncomplete
		gen.Note = "Ollama aborts a generation that repeats one token 30 times"
		if first {
			gen.TTFT = time.Since(start)
		}
	}
	return gen, nil
}

// generate posts a generate request and hands each line of the answer
// stream to fn. Unlike the api package's client, it tells a stream that
// ended cleanly without its final message (clean) from one that broke: a
// read error, a cancelled context, a dropped connection are errors.
func (c *Client) generate(ctx context.Context, req *api.GenerateRequest, fn func(api.GenerateResponse) error) (clean bool, err error) {
	body, err := json.Marshal(req)
	if err != nil {
		return false, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base.JoinPath("/api/generate").String(), bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= http.StatusBadRequest {
		// An error answer is one JSON object, or nothing, or text.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return false, api.StatusError{StatusCode: resp.StatusCode, Status: resp.Status, ErrorMessage: e.Error}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var line struct {
			api.GenerateResponse
			Error string `json:"error,omitempty"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return false, fmt.Errorf("the server at %s did not answer as Ollama does (Content-Type %q, body %.200q): %w", c.base, resp.Header.Get("Content-Type"), sc.Text(), err)
		}
		if line.Error != "" {
			return false, errors.New(line.Error)
		}
		if err := fn(line.GenerateResponse); err != nil {
			return false, err
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, err // the body ended because the request was cancelled
	}
	return true, nil
}

// Load loads the model with the fixed options and keeps it loaded. Ollama
// loads a model for a generate request with an empty prompt.
func (c *Client) Load(ctx context.Context) error {
	req := &api.GenerateRequest{Model: c.model, KeepAlive: c.keepAlive(), Options: c.options(ctxd.GenerateRequest{})}
	if err := c.api.Generate(ctx, req, func(api.GenerateResponse) error { return nil }); err != nil {
		return c.wrap("load", err)
	}
	return nil
}

// Unload unloads the model (a generate request that keeps it alive for
// no time) and returns once the server no longer lists it as running: its
// memory is given back.
func (c *Client) Unload(ctx context.Context) error {
	zero := api.Duration{Duration: 0}
	req := &api.GenerateRequest{Model: c.model, KeepAlive: &zero}
	if err := c.api.Generate(ctx, req, func(api.GenerateResponse) error { return nil }); err != nil {
		return c.wrap("unload", err)
	}
	for {
		ps, err := c.api.ListRunning(ctx)
		if err != nil {
			return c.wrap("unload", err)
		}
		running := false
		for _, m := range ps.Models {
			if m.Name == c.model || m.Model == c.model || strings.TrimSuffix(m.Name, ":latest") == strings.TrimSuffix(c.model, ":latest") {
				running = true
			}
		}
		if !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return c.wrap("unload", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Ping checks the server answers.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.api.Heartbeat(ctx); err != nil {
		return c.wrap("ping", err)
	}
	return nil
}

// Version is the server's version string.
func (c *Client) Version(ctx context.Context) (string, error) {
	v, err := c.api.Version(ctx)
	if err != nil {
		return "", c.wrap("version", err)
	}
	return v, nil
}

// Facts are what ctxd needs to know about the model.
type Facts struct {
	Architecture  string         `json:"architecture"`
	ContextLength int            `json:"context_length"`
	GGUFPath      string         `json:"-"` // the model file on this machine, for the tokenizer
	Info          map[string]any `json:"-"`
	// Template is the model's chat template as Ollama renders it (a Go
	// template), and Stop the stop sequences of the model's parameters.
	// A model without a chat template has Ollama's default, "{{ .Prompt }}".
	Template string   `json:"-"`
	Stop     []string `json:"-"`
}

// Facts reads the model's architecture and file from /api/show.
func (c *Client) Facts(ctx context.Context) (Facts, error) {
	resp, err := c.api.Show(ctx, &api.ShowRequest{Model: c.model})
	if err != nil {
		return Facts{}, c.wrap("show", err)
	}
	f := Facts{Info: resp.ModelInfo, Template: resp.Template, Stop: stopParameters(resp.Parameters)}
	f.Architecture, _ = resp.ModelInfo["general.architecture"].(string)
	if v, ok := resp.ModelInfo[f.Architecture+".context_length"].(float64); ok {
		f.ContextLength = int(v)
	}
	sc := bufio.NewScanner(strings.NewReader(resp.Modelfile))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "FROM "); ok {
			f.GGUFPath = strings.TrimSpace(rest)
			break
		}
	}
	if f.Architecture == "" || f.ContextLength == 0 {
		return f, fmt.Errorf("ollama: show %s: model info lacks architecture or context length", c.model)
	}
	return f, nil
}

// stopParameters reads the stop sequences out of /api/show's parameters
// text: one `stop "<|im_end|>"` line each (the value Go-quoted).
func stopParameters(params string) []string {
	var out []string
	for _, line := range strings.Split(params, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || key != "stop" {
			continue
		}
		if v, err := strconv.Unquote(strings.TrimSpace(value)); err == nil {
			out = append(out, v)
		}
	}
	slices.Sort(out) // the server lists parameters from a map
	return out
}

// Import creates the model from a local GGUF file: the file is uploaded as
// a blob and a model is created from it. Importing the same file again is
// cheap and changes nothing.
func (c *Client) Import(ctx context.Context, ggufPath string) error {
	f, err := os.Open(ggufPath)
	if err != nil {
		return fmt.Errorf("ollama: import: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("ollama: import: hash %s: %w", ggufPath, err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("ollama: import: %w", err)
	}
	if err := c.api.CreateBlob(ctx, digest, f); err != nil {
		return c.wrap("import: upload blob", err)
	}
	stream := false
	req := &api.CreateRequest{Model: c.model, Files: map[string]string{"model.gguf": digest}, Stream: &stream}
	if err := c.api.Create(ctx, req, func(api.ProgressResponse) error { return nil }); err != nil {
		return c.wrap("import: create", err)
	}
	return nil
}

// wrap classifies an API error: a missing model is KindBackend (and
// ErrModelNotFound), an unreachable server KindUnavailable (and
// ErrUnavailable), anything else KindBackend. A cancelled request stays
// what it is.
func (c *Client) wrap(op string, err error) error {
	var se api.StatusError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("ollama: %s: %w", op, err)
	case errors.As(err, &se) && se.StatusCode == http.StatusNotFound,
		// The streaming endpoints report a missing model as a bare error
		// line ("model 'x' not found") rather than a StatusError.
		strings.Contains(err.Error(), "'"+c.model+"' not found"):
		return &ctxd.Error{Kind: ctxd.KindBackend, Err: fmt.Errorf("%w: %v", ErrModelNotFound, err),
			Message: fmt.Sprintf("ollama: %s: %v: %q is not in the server's models (%v)", op, ErrModelNotFound, c.model, err)}
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), isDialError(err):
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %v", ErrUnavailable, err),
			Message: fmt.Sprintf("ollama: %s: %v at %s: %v", op, ErrUnavailable, c.base, err)}
	}
	return &ctxd.Error{Kind: ctxd.KindBackend, Err: err, Message: fmt.Sprintf("ollama: %s: %v", op, err)}
}

func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
