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

	"github.com/ctxd/ctxd"
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
	Kind    ctxd.Kind
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
