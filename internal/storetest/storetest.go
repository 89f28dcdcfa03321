// Package storetest is the contract every ctxd store keeps: the karma
// record (Karma) and the sessions (Sessions), run as subtests against a
// fresh store each, so that package sqlite, package pgstore and the
// in-memory fakes of package internal/fake are held to one behaviour.
// What only one store has (SQLite's files and pools, PostgreSQL's
// outages) stays in that store's own tests. Tests only.
package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// T0 is the time the contract's records are made at.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Record records a trace of sigil asking query at at, in session "sess",
// and returns its id; it fails tb if the store refuses.
func Record(tb testing.TB, s ctxd.KarmaStore, sigil, query string, at time.Time) int64 {
	tb.Helper()
	id, err := s.RecordTrace(tb.Context(), ctxd.Trace{
		Session: "sess", Sigil: sigil, Query: query, Answer: "answer to " + query,
		Model: "m", Fingerprint: "fp", CreatedAt: at,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// Event applies ev (judged by sigil "judge" unless it names one) and
// returns the trace after it; it fails tb if the store refuses.
func Event(tb testing.TB, s ctxd.KarmaStore, ev ctxd.KarmaEvent) ctxd.Trace {
	tb.Helper()
	if ev.Sigil == "" {
		ev.Sigil = "judge"
	}
	t, err := s.KarmaEvent(tb.Context(), ev)
	if err != nil {
		tb.Fatalf("%s %d: %v", ev.Action, ev.Trace, err)
	}
	return t
}

// WantKind fails tb unless err is of kind and its message mentions each
// of mentions.
func WantKind(tb testing.TB, err error, kind ctxd.Kind, mentions ...string) {
	tb.Helper()
	if ctxd.KindOf(err) != kind {
		tb.Fatalf("error %v, want kind %s", err, kind)
	}
	for _, m := range mentions {
		if !strings.Contains(err.Error(), m) {
			tb.Errorf("error %q does not mention %q", err, m)
		}
	}
}

func traceIDs(ts []ctxd.Trace) []int64 {
	out := []int64{}
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func list(tb testing.TB, s ctxd.KarmaStore, f ctxd.TraceFilter) []int64 {
	tb.Helper()
	ts, err := s.Traces(tb.Context(), f)
	if err != nil {
		tb.Fatal(err)
	}
	return traceIDs(ts)
}
