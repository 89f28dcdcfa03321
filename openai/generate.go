package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
)

// chunk is one event of a streamed /v1/completions answer. Servers add
// their own fields beside the standard ones: llama-server's timings are
// read where present.
type chunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings *struct {
		CacheN      int     `json:"cache_n"`
		PromptN     int     `json:"prompt_n"`
		PromptMs    float64 `json:"prompt_ms"`
		PredictedN  int     `json:"predicted_n"`
		PredictedMs float64 `json:"predicted_ms"`
	} `json:"timings"`
	Error *struct {
		Message string `json:"message"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// measured applies what a chunk says of the prompt and the answer. A
// server that has reported cached tokens before and leaves them out now
// (vLLM's and SGLang's way of saying 0) reused none.
func (ch chunk) measured(gen *ctxd.Generation, reports *atomic.Bool) {
	if u := ch.Usage; u != nil && u.PromptTokens > 0 { // Ollama's content chunks carry a usage of zeros
		gen.PromptEvalCount, gen.EvalCount = u.PromptTokens, u.CompletionTokens
		switch d := u.PromptTokensDetails; {
		case d != nil && d.CachedTokens != nil:
			gen.BackendCached = *d.CachedTokens
			reports.Store(true)
		case reports.Load():
			gen.BackendCached = 0
		}
	}
	if t := ch.Timings; t != nil {
		if gen.BackendCached < 0 {
			gen.BackendCached = t.CacheN
		}
		gen.PromptEvalDuration = time.Duration(t.PromptMs * float64(time.Millisecond))
		gen.EvalDuration = time.Duration(t.PredictedMs * float64(time.Millisecond))
	}
}

// doneReason maps an OpenAI finish_reason to ctxd's.
func doneReason(r string) string {
	switch r {
	case "stop", "eos", "stop_sequence", "":
		return ctxd.DoneStop
	case "length", "max_tokens":
		return ctxd.DoneLength
	}
	return r
}

// body is the /v1/completions request for req.
func (c *Client) body(req ctxd.GenerateRequest) map[string]any {
	b := map[string]any{
		"model": c.opts.Model, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"temperature": c.opts.Temperature, "seed": c.opts.Seed,
	}
	if c.opts.Tokens && len(req.Tokens) > 0 {
		b["prompt"] = req.Tokens
	} else {
		b["prompt"] = req.Prompt
	}
	if req.MaxTokens > 0 {
		b["max_tokens"] = req.MaxTokens
	}
	if len(req.Stop) > 0 {
		b["stop"] = req.Stop
	}
	for field, tmpl := range c.opts.Routing.Fields {
		if _, taken := b[field]; taken {
			continue // validated away; never let a hint replace the prompt
		}
		if v := expand(tmpl, req.Session, req.Parent); v != "" {
			b[field] = v
		}
	}
	return b
}

// headers are req's routing headers.
func (c *Client) headers(req ctxd.GenerateRequest) http.Header {
	h := http.Header{"Accept": {"text/event-stream"}}
	for name, tmpl := range c.opts.Routing.Headers {
		if v := expand(tmpl, req.Session, req.Parent); v != "" {
			h.Set(name, v)
		}
	}
	return h
}

// Generate streams a completion of req's prompt. Cancelling ctx closes
// the request, which stops the generation.
func (c *Client) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	const path = "/v1/completions"
	gen := ctxd.Generation{BackendCached: -1}
	if onToken == nil {
		onToken = func(string) error { return nil }
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := newWatchdog(c.opts.IdleTimeout, cancel)
	defer idle.stop()
	start := time.Now()
	resp, err := c.send(ctx, request{method: http.MethodPost, path: path, body: c.body(req), header: c.headers(req), close: true})
	if err != nil {
		return gen, c.idleError(idle, path, err)
	}
	// The connection closes with the answer (request.close): what ends
	// a generation early stops the server's work too.
	defer resp.Body.Close()
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	finish := ""
	done := false
	for sc.Scan() {
		idle.kick()
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			if data, ok = strings.CutPrefix(line, "error:"); ok { // llama-server's error event
				data = `{"error":` + strings.TrimSpace(data) + `}`
			} else if strings.HasPrefix(line, "{") { // an error body some servers send unframed
				data = line
			} else {
				continue // blank separators, comments, event: lines
			}
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			done = true
			break
		}
		var ch chunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return gen, c.wrap(path, fmt.Errorf("bad event %q: %w", data, err))
		}
		if ch.Error != nil {
			if strings.Contains(ch.Error.Message, "does not match the expected") {
				// llama-server generated the answer, then its output parser
				// rejected the text (random weights end on half a UTF-8
				// character): what streamed is the answer. Kept, and marked.
				gen.Text, gen.DoneReason = sb.String(), ctxd.DoneIncomplete
				gen.Note = "the server's output parser rejected the end of the generated text (" + ch.Error.Message + ")"
				return gen, nil
			}
			return gen, c.statusError(path, http.StatusInternalServerError, ch.Error.Message)
		}
		ch.measured(&gen, &c.reportsCached)
		for _, choice := range ch.Choices {
			if choice.Text != "" {
				if sb.Len() == 0 {
					gen.TTFT = time.Since(start)
				}
				sb.WriteString(choice.Text)
				if err := onToken(choice.Text); err != nil {
					gen.Text = sb.String()
					return gen, err
				}
			}
			if choice.FinishReason != nil && *choice.FinishReason != "" {
				finish = *choice.FinishReason
			}
		}
	}
	gen.Text = sb.String()
	if gen.TTFT == 0 {
		gen.TTFT = time.Since(start)
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() == nil {
			return gen, c.brokeOff(path, sb.Len(), err)
		}
		return gen, c.idleError(idle, path, c.wrap(path, err))
	}
	if !done && finish == "" {
		if err := ctx.Err(); err != nil {
			return gen, c.idleError(idle, path, fmt.Errorf("openai: %s: %w", path, err))
		}
		return gen, c.brokeOff(path, sb.Len(), fmt.Errorf("the answer stream ended before its last event: %w", io.ErrUnexpectedEOF))
	}
	gen.DoneReason = doneReason(finish)
	return gen, nil
}

// brokeOff is the error of an answer whose stream the server began and
// did not end (n bytes of text came): the server crashed, was stopped or
// lost the connection. The request is not sent again (the engine had it).
func (c *Client) brokeOff(path string, n int, err error) error {
	return &ctxd.Error{Kind: ctxd.KindBackend, Err: err, Message: fmt.Sprintf(
		"openai: %s%s: the server broke off the answer after %d bytes of it (%v): it crashed, was stopped or lost the connection; the partial answer is not recorded", c.base, path, n, err)}
}

// idleError names the idle timeout when it is what ended a request.
func (c *Client) idleError(w *watchdog, path string, err error) error {
	if w.fired() {
		return &ctxd.Error{Kind: ctxd.KindBackend, Err: err,
			Message: fmt.Sprintf("openai: %s%s: the server sent nothing for %s (backend.idle_timeout); the request was closed", c.base, path, c.opts.IdleTimeout)}
	}
	return err
}

// watchdog calls its function once nothing kicked it for d.
type watchdog struct {
	mu   sync.Mutex
	t    *time.Timer
	d    time.Duration
	fire bool
}

func newWatchdog(d time.Duration, f func()) *watchdog {
	w := &watchdog{d: d}
	w.t = time.AfterFunc(d, func() {
		w.mu.Lock()
		w.fire = true
		w.mu.Unlock()
		f()
	})
	return w
}

func (w *watchdog) kick() { w.t.Reset(w.d) }
func (w *watchdog) stop() { w.t.Stop() }
func (w *watchdog) fired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fire
}
