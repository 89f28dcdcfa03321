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

// Ask sends a query and calls onToken with each piece of the answer. It
// returns the summary that ends the stream.
func (c *Client) Ask(ctx context.Context, req daemon.AskRequest, onToken func(string)) (*orchestrator.Summary, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/ask", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev daemon.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("ctxd: bad stream line %q: %w", sc.Text(), err)
		}
		switch ev.Type {
		case "token":
			if onToken != nil {
				onToken(ev.Text)
			}
		case "summary":
			return ev.Summary, nil
		case "error":
			return nil, &APIError{Status: ev.Status, Message: ev.Error}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("ctxd: stream: %w", err)
	}
	return nil, errors.New("ctxd: stream ended without a summary")
}

// LoadCodex makes the tree at path (on the daemon's machine) the daemon's
// codex, calling onProgress as it loads, and returns the loaded codex.
func (c *Client) LoadCodex(ctx context.Context, path string, onProgress func(codex.Progress)) (*daemon.CodexStats, error) {
	resp, err := c.do(ctx, http.MethodPost, "/v1/codex/load", map[string]string{"path": path})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev daemon.CodexEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("ctxd: bad stream line: %w", err)
		}
		switch ev.Type {
		case "progress":
			if onProgress != nil && ev.Progress != nil {
				onProgress(*ev.Progress)
			}
		case "error":
			return nil, &APIError{Status: http.StatusBadRequest, Message: ev.Error}
		case "codex":
			return ev.Codex, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("ctxd: stream: %w", err)
	}
	return nil, errors.New("ctxd: codex load ended without a result")
}
