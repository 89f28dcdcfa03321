// Package logtest records what a component logs, for tests that wait for
// or check one of its messages. Tests only.
package logtest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Recorder is a slog.Handler that keeps every record's message, with its
// "err" attribute after a colon.
type Recorder struct {
	mu   sync.Mutex // guards msgs
	msgs []string
	seen chan struct{}
}

var _ slog.Handler = (*Recorder)(nil)

// New returns an empty recorder.
func New() *Recorder { return &Recorder{seen: make(chan struct{}, 1)} }

func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *Recorder) WithGroup(string) slog.Handler            { return r }

// Handle keeps the record and signals Seen.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	s := rec.Message
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			s += ": " + a.Value.String()
		}
		return true
	})
	r.mu.Lock()
	r.msgs = append(r.msgs, s)
	r.mu.Unlock()
	select {
	case r.seen <- struct{}{}:
	default: // a signal is pending already
	}
	return nil
}

// Seen gets a value after a record arrives (one for any number since the
// last receive).
func (r *Recorder) Seen() <-chan struct{} { return r.seen }

// Messages is every message so far.
func (r *Recorder) Messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// Find is the first message containing s.
func (r *Recorder) Find(s string) (string, bool) {
	for _, m := range r.Messages() {
		if strings.Contains(m, s) {
			return m, true
		}
	}
	return "", false
}
