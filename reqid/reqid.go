// Package reqid gives every request an id that follows it through the
// daemon: into the context, the response's X-Request-Id header, the
// answer's summary, and every log line written with that context.
package reqid

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
)

// Header is the HTTP header that carries a request's id, both ways.
const Header = "X-Request-Id"

// MaxLen bounds an id a client sends.
const MaxLen = 64

type key struct{}

// New returns a fresh id: 16 hex digits.
func New() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Valid reports whether a client's id may be used as it is: 1 to MaxLen
// characters from [A-Za-z0-9._:-], so it can go into logs and headers
// unquoted and cannot forge a log line.
func Valid(id string) bool {
	if id == "" || len(id) > MaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// With returns ctx carrying id.
func With(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, key{}, id)
}

// From is ctx's request id ("" when it has none).
func From(ctx context.Context) string {
	id, _ := ctx.Value(key{}).(string)
	return id
}

// Handler wraps a log handler so that every record logged with a
// request's context carries its id as request_id.
func Handler(next slog.Handler) slog.Handler { return handler{next} }

type handler struct{ next slog.Handler }

func (h handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if id := From(ctx); id != "" {
		r = r.Clone()
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.next.Handle(ctx, r)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler { return handler{h.next.WithAttrs(as)} }
func (h handler) WithGroup(name string) slog.Handler    { return handler{h.next.WithGroup(name)} }
