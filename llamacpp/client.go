package llamacpp

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
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ctxd/ctxd"
)

// Options are fixed for the life of a client.
type Options struct {
	Temperature float64 // sampling; 0 is greedy
	Seed        int
	APIKey      string // sent as a bearer token when set (llama-server --api-key)

	// Dial, when set, makes the client's connections, whatever the address:
	// a managed server's (*supervise.Process).DialContext reaches only the
	// process ctxd started. Nil: dial the address.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client talks to one llama-server.
type Client struct {
	base  string // http://host:port, or http://unix for a Unix socket
	http  *http.Client
	opts  Options
	addr  string       // as given, for messages
	slots atomic.Int64 // the server's total_slots, once Props has read it
}

var _ ctxd.Backend = (*Client)(nil)

// New returns a client for the server at addr: a base URL
// (http://127.0.0.1:8080) or the path of a Unix socket (ending in .sock,
// as llama-server's --host takes it).
func New(addr string, opts Options) (*Client, error) {
	c := &Client{opts: opts, addr: addr}
	// llama-server closes a connection idle for 5 s (it answers with
	// "Keep-Alive: timeout=5"): the client lets go of one first, so that
	// a request does not go out on a connection the server is closing.
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: idleTimeout}
	switch {
	case strings.HasSuffix(addr, ".sock") && !strings.Contains(addr, "://"):
		c.base = "http://unix"
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "unix", addr)
		}
	default:
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("llamacpp: %q is neither an http(s) URL nor a .sock path", addr)
		}
		c.base = strings.TrimRight(u.String(), "/")
		tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second}).DialContext
	}
	if opts.Dial != nil {
		tr.DialContext = opts.Dial
	}
	c.http = &http.Client{Transport: tr}
	return c, nil
}

// idleTimeout is how long the client keeps an idle connection: under
// llama-server's keep-alive timeout.
const idleTimeout = 4 * time.Second

// Addr is the server's address as given.
func (c *Client) Addr() string { return c.addr }

// Errors callers branch on; the errors returned wrap them in *ctxd.Error
// values of the kinds below.
var (
	// ErrUnavailable: the server cannot be reached (KindUnavailable).
	ErrUnavailable = errors.New("llama-server is not reachable")
	// ErrSlotsDisabled: slot save, restore and erase need --slot-save-path.
	ErrSlotsDisabled = errors.New("llama-server has no --slot-save-path")
	// ErrTooLong: the prompt is over the slot's window (KindDoesNotFit).
	ErrTooLong = errors.New("prompt exceeds the slot's context")
)

// apiError is llama-server's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Type    string `json:"type"`
	NPrompt int    `json:"n_prompt_tokens"`
	NCtx    int    `json:"n_ctx"`
}

// do sends a request and decodes a JSON answer into out (unless nil).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.send(ctx, method, path, body, false)
	if err != nil {
		return err
	}
	defer release(resp.Body)
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return c.wrap(path, fmt.Errorf("decode the answer: %w", err))
	}
	return nil
}

// Most of an answer's tail release reads before it gives up the
// connection instead.
const releaseMax = 64 << 10

// release closes an answer the server has finished sending, reading what
// is left of it first (at most releaseMax bytes): Go's transport reuses a
// connection only once its answer was read to the end, and closes it
// otherwise. A connection made anew costs a dial and, for a managed
// server, the check of who holds its other end (see Options.Dial).
func release(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, releaseMax))
	body.Close()
}

// send sends a request; an error status becomes an error naming the
// server's message. A stream's request asks for its connection to close
// once the answer ends: llama-server closes it then anyway, without
// saying so, and a connection back in the pool would be taken by the next
// request while the server closes it (which fails that request once part
// of it was written).
func (c *Client) send(ctx context.Context, method, path string, body any, stream bool) (*http.Response, error) {
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
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Close = stream
	if c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
	}
	// llama-server closes idle connections on its own schedule; a request
	// sent on one it has just closed fails with EOF before the server read
	// it. Marked idempotent (the header is not sent), Go's transport tries
	// such a request again on a new connection.
	req.Header["Idempotency-Key"] = nil
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.wrap(path, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error apiError `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			e.Error = apiError{Code: resp.StatusCode, Message: strings.TrimSpace(string(b))}
		}
		return nil, c.statusError(path, resp.StatusCode, e.Error)
	}
	return resp, nil
}

// statusError classifies an error answer.
func (c *Client) statusError(path string, status int, e apiError) error {
	msg := fmt.Sprintf("llamacpp: %s: %d %s", path, status, e.Message)
	switch {
	case e.Type == "exceed_context_size_error":
		return &ctxd.Error{Kind: ctxd.KindDoesNotFit, Err: ErrTooLong,
			Message: fmt.Sprintf("%s (%d prompt tokens, slot window %d)", msg, e.NPrompt, e.NCtx)}
	case status == http.StatusNotImplemented && strings.HasPrefix(path, "/slots"):
		return &ctxd.Error{Kind: ctxd.KindConflict, Err: ErrSlotsDisabled, Message: msg}
	case strings.Contains(e.Message, "does not match the expected"):
		// Seen with random-weight models: the server's output parser
		// rejects what the model generated. The request is not at fault.
		return &ctxd.Error{Kind: ctxd.KindBackend, Message: msg + " (llama-server's output parser rejected what the model generated; asking again usually works)"}
	case status == http.StatusUnauthorized:
		return &ctxd.Error{Kind: ctxd.KindBackend, Message: msg + " (check backend.api_key)"}
	case status >= 500:
		return &ctxd.Error{Kind: ctxd.KindBackend, Message: msg}
	}
	return &ctxd.Error{Kind: ctxd.KindBackend, Message: msg + " (ctxd sent a request the server refused)"}
}

// wrap classifies a transport error.
func (c *Client) wrap(path string, err error) error {
	var oe *net.OpError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("llamacpp: %s: %w", path, err)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ECONNRESET),
		errors.As(err, &oe) && oe.Op == "dial":
		return &ctxd.Error{Kind: ctxd.KindUnavailable, Err: fmt.Errorf("%w: %v", ErrUnavailable, err),
			Message: fmt.Sprintf("llamacpp: %s: %v at %s: %v", path, ErrUnavailable, c.addr, err)}
	}
	return &ctxd.Error{Kind: ctxd.KindBackend, Err: err, Message: fmt.Sprintf("llamacpp: %s: %v", path, err)}
}

// Health is nil once the server has loaded its model.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/health", nil, nil)
}

// refill puts a connection back in the pool once a completion's has
// closed (llama-server closes it after every streamed completion): a
// health check made on a new one leaves it idle there, dialled and, for a
// managed server, checked for who holds its other end, so the session's
// next completion, if it comes within the idle timeout, sends its prompt
// at once instead of paying the dial first. It runs after the answer, off
// any request's time to first token; a failure costs only that.
func (c *Client) refill() {
	ctx, cancel := context.WithTimeout(context.Background(), refillTimeout)
	defer cancel()
	_ = c.Health(ctx)
}

// refillTimeout bounds refill's health check: the server answers it at
// once, or is busy with a restart that the next request will find anyway.
const refillTimeout = 2 * time.Second

// Props are the server's facts.
type Props struct {
	TotalSlots   int    `json:"total_slots"`
	ModelPath    string `json:"model_path"`
	ChatTemplate string `json:"chat_template"`
	BOS          string `json:"bos_token"`
	EOS          string `json:"eos_token"`
	Build        string `json:"build_info"`
	Settings     struct {
		NCtx int `json:"n_ctx"` // each slot's window
	} `json:"default_generation_settings"`
}

// Props reads GET /props. The client checks slot ids against the
// total_slots it finds: llama-server takes an id out of range modulo its
// slot count instead of refusing it.
func (c *Client) Props(ctx context.Context) (Props, error) {
	var p Props
	err := c.do(ctx, http.MethodGet, "/props", nil, &p)
	if err == nil && p.TotalSlots > 0 {
		c.slots.Store(int64(p.TotalSlots))
	}
	return p, err
}

// checkSlot refuses a slot id the server does not have.
func (c *Client) checkSlot(slot int) error {
	if n := c.slots.Load(); slot < 0 || n > 0 && int64(slot) >= n {
		return ctxd.Errorf(ctxd.KindInternal, "llamacpp: slot %d out of range: the server has %d slots (it would take the id modulo its slot count)", slot, n)
	}
	return nil
}

// Slot is one entry of GET /slots.
type Slot struct {
	ID           int  `json:"id"`
	NCtx         int  `json:"n_ctx"`
	IsProcessing bool `json:"is_processing"`
	NPrompt      int  `json:"n_prompt_tokens"`
}

// Slots reads GET /slots.
func (c *Client) Slots(ctx context.Context) ([]Slot, error) {
	var s []Slot
	err := c.do(ctx, http.MethodGet, "/slots", nil, &s)
	return s, err
}

// SaveSlot writes slot's KV cache to filename under the server's
// --slot-save-path and returns how many tokens it saved.
func (c *Client) SaveSlot(ctx context.Context, slot int, filename string) (int, error) {
	if err := c.checkSlot(slot); err != nil {
		return 0, err
	}
	var out struct {
		NSaved int `json:"n_saved"`
	}
	err := c.do(ctx, http.MethodPost, "/slots/"+strconv.Itoa(slot)+"?action=save", map[string]string{"filename": filename}, &out)
	return out.NSaved, err
}

// RestoreSlot loads filename into slot and returns how many tokens it
// restored. A failed restore leaves the slot empty.
func (c *Client) RestoreSlot(ctx context.Context, slot int, filename string) (int, error) {
	if err := c.checkSlot(slot); err != nil {
		return 0, err
	}
	var out struct {
		NRestored int `json:"n_restored"`
	}
	err := c.do(ctx, http.MethodPost, "/slots/"+strconv.Itoa(slot)+"?action=restore", map[string]string{"filename": filename}, &out)
	return out.NRestored, err
}

// EraseSlot empties slot.
func (c *Client) EraseSlot(ctx context.Context, slot int) error {
	if err := c.checkSlot(slot); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, "/slots/"+strconv.Itoa(slot)+"?action=erase", nil, nil)
}

// Tokenize tokenizes text with the server's vocabulary: with the special
// tokens a prompt starts with if addSpecial, and special-token text parsed
// into those tokens if parseSpecial (as the server does with a text prompt).
func (c *Client) Tokenize(ctx context.Context, text string, addSpecial, parseSpecial bool) ([]int, error) {
	var out struct {
		Tokens []int `json:"tokens"`
	}
	err := c.do(ctx, http.MethodPost, "/tokenize", map[string]any{"content": text, "add_special": addSpecial, "parse_special": parseSpecial}, &out)
	return out.Tokens, err
}

// ModelMeta is what GET /v1/models says of the served model.
type ModelMeta struct {
	NVocab    int   `json:"n_vocab"`
	NCtxTrain int   `json:"n_ctx_train"`
	NEmbd     int   `json:"n_embd"`
	NParams   int64 `json:"n_params"`
	Size      int64 `json:"size"` // bytes of weights
}

// ModelMeta reads the served model's facts from GET /v1/models.
func (c *Client) ModelMeta(ctx context.Context) (ModelMeta, error) {
	var out struct {
		Data []struct {
			Meta ModelMeta `json:"meta"`
		} `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/models", nil, &out); err != nil {
		return ModelMeta{}, err
	}
	if len(out.Data) == 0 {
		return ModelMeta{}, errors.New("llamacpp: /v1/models lists no model")
	}
	return out.Data[0].Meta, nil
}

// ApplyTemplate renders chat messages with the model's own (Jinja)
// template, with the generation prompt.
func (c *Client) ApplyTemplate(ctx context.Context, messages any) (string, error) {
	var out struct {
		Prompt string `json:"prompt"`
	}
	err := c.do(ctx, http.MethodPost, "/apply-template", map[string]any{"messages": messages}, &out)
	return out.Prompt, err
}

// chunk is one event of a streamed /completion.
type chunk struct {
	Content  string `json:"content"`
	Stop     bool   `json:"stop"`
	StopType string `json:"stop_type"`
	IDSlot   int    `json:"id_slot"`
	Timings  *struct {
		CacheN      int     `json:"cache_n"`
		PromptN     int     `json:"prompt_n"`
		PromptMs    float64 `json:"prompt_ms"`
		PredictedN  int     `json:"predicted_n"`
		PredictedMs float64 `json:"predicted_ms"`
	} `json:"timings"`
	Error *apiError `json:"error"`
	// PromptProgress is reported while the prompt is read (return_progress):
	// processed counts the tokens the slot holds of it, reused or read.
	PromptProgress *struct {
		Total     int `json:"total"`
		Cache     int `json:"cache"`
		Processed int `json:"processed"`
	} `json:"prompt_progress"`
}

// finish applies a completion's final event: why it stopped, and the
// server's measurements.
func (ch chunk) finish(gen *ctxd.Generation) {
	gen.DoneReason = ctxd.DoneStop
	if ch.StopType == "limit" {
		gen.DoneReason = ctxd.DoneLength
	}
	ch.measured(gen)
}

// measured applies the server's measurements an event carries (every
// event does, with timings_per_token: an answer its output parser cuts
// short keeps the prompt's).
func (ch chunk) measured(gen *ctxd.Generation) {
	if t := ch.Timings; t != nil {
		gen.BackendCached = t.CacheN
		gen.PromptEvalCount = t.CacheN + t.PromptN
		gen.PromptEvalDuration = time.Duration(t.PromptMs * float64(time.Millisecond))
		gen.EvalCount = t.PredictedN
		gen.EvalDuration = time.Duration(t.PredictedMs * float64(time.Millisecond))
	}
}

// Generate streams a completion on req.Slot. The prompt goes as token ids
// when req.Tokens holds them (what ctxd counted is then what the server
// caches), else as text. Cancelling ctx closes the request, which stops
// the generation.
func (c *Client) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	if err := c.checkSlot(req.Slot); err != nil {
		return ctxd.Generation{BackendCached: -1}, err
	}
	body := map[string]any{
		"stream": true, "cache_prompt": true, "id_slot": req.Slot, "timings_per_token": true, "return_progress": true,
		"temperature": c.opts.Temperature, "seed": c.opts.Seed,
	}
	if len(req.Tokens) > 0 {
		body["prompt"] = req.Tokens
	} else {
		body["prompt"] = req.Prompt
	}
	if req.MaxTokens > 0 {
		body["n_predict"] = req.MaxTokens
	}
	if len(req.Stop) > 0 {
		body["stop"] = req.Stop
	}
	if onToken == nil {
		onToken = func(string) error { return nil }
	}
	gen := ctxd.Generation{BackendCached: -1}
	start := time.Now()
	resp, err := c.send(ctx, http.MethodPost, "/completion", body, true)
	if err != nil {
		return gen, err
	}
	defer c.refill()
	// The stream's connection closes with it (see send): what ends a
	// generation early (an error from onToken, a bad event, a cancelled
	// ctx) stops the server's work too.
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // blank separators, comments
		}
		var ch chunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return gen, c.wrap("/completion", fmt.Errorf("bad event %q: %w", data, err))
		}
		if ch.Error != nil {
			if strings.Contains(ch.Error.Message, "does not match the expected") {
				// The server generated the answer, then its output parser
				// rejected the text (random weights end on half a UTF-8
				// character): what streamed is the answer, and the slot
				// holds it. Kept, and marked.
				gen.Text, gen.DoneReason = sb.String(), ctxd.DoneIncomplete
				gen.Note = "llama-server's output parser rejected the end of the generated text (" + ch.Error.Message + ")"
				if gen.TTFT == 0 {
					gen.TTFT = time.Since(start)
				}
				return gen, nil
			}
			return gen, c.statusError("/completion", ch.Error.Code, *ch.Error)
		}
		ch.measured(&gen)
		if p := ch.PromptProgress; p != nil {
			gen.PromptRead, gen.BackendCached = p.Processed, p.Cache
		}
		if ch.Content != "" {
			if sb.Len() == 0 {
				gen.TTFT = time.Since(start)
			}
			sb.WriteString(ch.Content)
			if err := onToken(ch.Content); err != nil {
				gen.Text = sb.String()
				return gen, err
			}
		}
		if ch.Stop {
			done = true
			if gen.TTFT == 0 {
				gen.TTFT = time.Since(start)
			}
			ch.finish(&gen)
			break
		}
	}
	gen.Text = sb.String()
	if err := sc.Err(); err != nil {
		return gen, c.wrap("/completion", err)
	}
	if !done {
		if err := ctx.Err(); err != nil {
			return gen, fmt.Errorf("llamacpp: /completion: %w", err)
		}
		return gen, c.wrap("/completion", fmt.Errorf("the answer stream ended before its final event: %w", io.ErrUnexpectedEOF))
	}
	return gen, nil
}
