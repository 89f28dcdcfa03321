package reqid_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/reqid"
)

func TestValid(t *testing.T) {
	for id, want := range map[string]bool{
		"abc-123": true, "req_1.2:3": true, reqid.New(): true,
		"": false, "a b": false, "x\ny": false, "é": false, strings.Repeat("a", 65): false, "a=b": false,
	} {
		if got := reqid.Valid(id); got != want {
			t.Errorf("Valid(%q) = %v, want %v", id, got, want)
		}
	}
	if a, b := reqid.New(), reqid.New(); a == b || len(a) != 16 {
		t.Errorf("New gave %q and %q; want two different 16-digit ids", a, b)
	}
}

func TestHandlerAddsTheID(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(reqid.Handler(slog.NewTextHandler(&buf, nil))).With("component", "test")
	log.InfoContext(reqid.With(context.Background(), "r-42"), "answered", "turn", 1)
	log.InfoContext(context.Background(), "no request")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "request_id=r-42") || !strings.Contains(lines[0], "component=test") {
		t.Errorf("first line lacks the request id or the logger's attributes: %s", lines[0])
	}
	if strings.Contains(lines[1], "request_id") {
		t.Errorf("a record without a request has an id: %s", lines[1])
	}
	if reqid.From(context.Background()) != "" {
		t.Error("From of a bare context is not empty")
	}
}
