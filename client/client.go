package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/orchestrator"
)

// Client is a ctxd API client.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client for the daemon listening on socket.
func New(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}
}

// APIError is an error answer from the daemon.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://ctxd"+path, rd)
	if err != nil {
		return nil, err
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
			Error string `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = string(b)
		}
		return nil, &APIError{Status: resp.StatusCode, Message: e.Error}
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
func (c *Client) Ask(ctx context.Context, req daemon.AskRequest, onToken func(string)) (*orchestrator.Summary, error) {
	var sum *orchestrator.Summary
	err := stream(ctx, c, "/v1/ask", req, func(ev daemon.Event) (bool, error) {
		switch ev.Type {
		case "token":
			if onToken != nil {
				onToken(ev.Text)
			}
		case "summary":
			sum = ev.Summary
			return true, nil
		case "error":
			return true, &APIError{Status: ev.Status, Message: ev.Error}
		}
		return false, nil
	})
	return sum, err
}

// LoadCodex makes the tree at path (on the daemon's machine) the daemon's
// codex, calling onProgress as it loads, and returns the loaded codex.
func (c *Client) LoadCodex(ctx context.Context, path string, onProgress func(codex.Progress)) (*daemon.CodexStats, error) {
	var st *daemon.CodexStats
	err := stream(ctx, c, "/v1/codex/load", map[string]string{"path": path}, func(ev daemon.CodexEvent) (bool, error) {
		switch ev.Type {
		case "progress":
			if onProgress != nil && ev.Progress != nil {
				onProgress(*ev.Progress)
			}
		case "codex":
			st = ev.Codex
			return true, nil
		case "error":
			return true, &APIError{Status: http.StatusBadRequest, Message: ev.Error}
		}
		return false, nil
	})
	return st, err
}
