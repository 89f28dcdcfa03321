package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

// scripted is a WebSocket server that runs script on each connection:
// the daemon's side played by hand, for what the daemon never does on
// purpose (dropping a connection mid-answer). The daemon's own behaviour
// is tested against the Go client in daemon/ws_test.go.
func scripted(t *testing.T, script func(ctx context.Context, ws *websocket.Conn)) (url string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/ws" || r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, `{"error":"wrong path or token","kind":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer ws.CloseNow()
		script(r.Context(), ws)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func write(ctx context.Context, t *testing.T, ws *websocket.Conn, m ctxd.WSMessage) {
	b, _ := json.Marshal(m)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		t.Error(err)
	}
}

func readAsk(ctx context.Context, t *testing.T, ws *websocket.Conn) ctxd.WSMessage {
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Error(err)
		return ctxd.WSMessage{}
	}
	var m ctxd.WSMessage
	if err := json.Unmarshal(b, &m); err != nil || m.Type != ctxd.WSAsk {
		t.Errorf("not an ask: %s (%v)", b, err)
	}
	return m
}

// TestConnDemultiplexes: messages reach the ask of their id, whatever the
// order they come in; notices and errors of no ask reach Notices.
func TestConnDemultiplexes(t *testing.T) {
	t.Parallel()
	url := scripted(t, func(ctx context.Context, ws *websocket.Conn) {
		a, b := readAsk(ctx, t, ws), readAsk(ctx, t, ws)
		if a.Query == "b" {
			a, b = b, a
		}
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSToken, ID: b.ID, Text: b.Query + "-1 "})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSNotice, Notice: ctxd.NoticeEnvironment, Environment: &ctxd.Environment{VRAM: "high"}})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSToken, ID: a.ID, Text: a.Query + "-1 "})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSError, Error: "malformed JSON message", Kind: ctxd.KindInvalid, Status: 400})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSToken, ID: b.ID, Text: b.Query + "-2"})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSSummary, ID: b.ID, Summary: &ctxd.Summary{Session: b.Session}})
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSError, ID: a.ID, Error: "does not fit", Kind: ctxd.KindDoesNotFit, Status: 422})
		_, _, _ = ws.Read(ctx) // until the client closes
	})
	conn, err := client.NewTCP(url, client.WithToken("tok")).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		text string
		sum  *ctxd.Summary
		err  error
	}
	ask := func(session, query string, out chan<- result) {
		var text string
		sum, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: session, Query: query}, func(s string) { text += s })
		out <- result{text, sum, err}
	}
	ra, rb := make(chan result, 1), make(chan result, 1)
	go ask("sa", "a", ra)
	go ask("sb", "b", rb)
	a, b := <-ra, <-rb
	var api *client.APIError
	if !errors.As(a.err, &api) || api.Kind != ctxd.KindDoesNotFit || a.text != "a-1 " {
		t.Errorf("ask a: %q, %v", a.text, a.err)
	}
	if b.err != nil || b.sum.Session != "sb" || b.text != "b-1 b-2" {
		t.Errorf("ask b: %q, %+v, %v", b.text, b.sum, b.err)
	}
	var kinds []string
	for range 2 {
		select {
		case n := <-conn.Notices():
			kinds = append(kinds, n.Type)
		case <-time.After(10 * time.Second):
			t.Fatal("notices missing")
		}
	}
	if kinds[0] != ctxd.WSNotice || kinds[1] != ctxd.WSError {
		t.Errorf("notices: %v", kinds)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if _, ok := <-conn.Notices(); ok {
		t.Error("Notices still open after Close")
	}
}

// TestConnThatDropsEndsItsAsks: an ask running when the connection drops
// returns an error instead of waiting for ever.
func TestConnThatDropsEndsItsAsks(t *testing.T) {
	t.Parallel()
	url := scripted(t, func(ctx context.Context, ws *websocket.Conn) {
		m := readAsk(ctx, t, ws)
		write(ctx, t, ws, ctxd.WSMessage{Type: ctxd.WSToken, ID: m.ID, Text: "partial"})
		// and drop the connection
	})
	conn, err := client.NewTCP(url, client.WithToken("tok")).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	done := make(chan error, 1)
	go func() {
		_, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q"}, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("an ask on a dropped connection succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an ask on a dropped connection did not return")
	}
	<-conn.Done()
	if conn.Err() == nil {
		t.Error("no error after the drop")
	}
	if _, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "s", Query: "q"}, nil); err == nil {
		t.Error("an ask after the drop succeeded")
	}
}

// TestConnectRefused: an upgrade the daemon refuses is an *APIError.
func TestConnectRefused(t *testing.T) {
	t.Parallel()
	url := scripted(t, func(context.Context, *websocket.Conn) {})
	_, err := client.NewTCP(url, client.WithToken("wrong")).Connect(t.Context())
	var api *client.APIError
	if !errors.As(err, &api) || api.Status != http.StatusUnauthorized || api.Kind != ctxd.KindUnauthorized {
		t.Errorf("refused upgrade: %v", err)
	}
}
