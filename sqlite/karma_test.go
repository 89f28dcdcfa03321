package sqlite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/karma"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func openTemp(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open(tb.Context(), filepath.Join(tb.TempDir(), "ctxd.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// karmaStores are the stores the contract runs against.
var karmaStores = []struct {
	name string
	open func(testing.TB) ctxd.KarmaStore
}{
	{"sqlite", func(tb testing.TB) ctxd.KarmaStore { return openTemp(tb) }},
	{"fake", func(testing.TB) ctxd.KarmaStore { return fake.NewKarma() }},
}

func record(tb testing.TB, s ctxd.KarmaStore, sigil, query string, at time.Time) int64 {
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

func event(tb testing.TB, s ctxd.KarmaStore, ev ctxd.KarmaEvent) ctxd.Trace {
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

func wantKind(tb testing.TB, err error, kind ctxd.Kind, mentions ...string) {
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

// karmaContract is what every ctxd.KarmaStore does.
var karmaContract = []struct {
	name string
	run  func(t *testing.T, s ctxd.KarmaStore)
}{
	{"bindings and staleness", func(t *testing.T, s ctxd.KarmaStore) {
		// Two traces answered from a retrieved codex: one depends on
		// a.go (its answer names it), the other on b.go. a.go changes:
		// the first is stale, the second is not; verifying the first
		// again against the current code restores it, and the binding
		// survives a reread.
		ctx := t.Context()
		sum := func(c string) string { return strings.Repeat(c, 64) }
		onA := ctxd.TraceBinding{Codex: "v1", Files: []ctxd.TraceFile{{Path: "a.go", SHA256: sum("a"), Cited: true}, {Path: "c.go", SHA256: sum("c")}}}
		onB := ctxd.TraceBinding{Codex: "v1", Files: []ctxd.TraceFile{{Path: "b.go", SHA256: sum("b")}}}
		idA, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "a?", Answer: "see a.go", Codex: "v1", CreatedAt: t0, Binding: onA})
		if err != nil {
			t.Fatal(err)
		}
		idB, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "b?", Answer: "b", Codex: "v1", CreatedAt: t0, Binding: onB})
		if err != nil {
			t.Fatal(err)
		}
		event(t, s, ctxd.KarmaEvent{Trace: idA, Action: ctxd.KarmaVerify, At: t0.Add(time.Minute)})
		event(t, s, ctxd.KarmaEvent{Trace: idB, Action: ctxd.KarmaVerify, At: t0.Add(time.Minute)})
		now := map[string]string{"a.go": sum("d"), "b.go": sum("b"), "c.go": sum("c")} // a.go changed: version v2
		a, _, err := s.Trace(ctx, idA)
		if err != nil || !reflect.DeepEqual(a.Binding, onA) || a.Rebound != nil {
			t.Fatalf("trace A = %+v, %v; want its binding kept", a, err)
		}
		if why := karma.Stale(a, "v2", now); !strings.Contains(why, "changed: a.go") {
			t.Errorf("trace A after a.go changed: stale %q; want it stale, naming a.go", why)
		}
		b, _, _ := s.Trace(ctx, idB)
		if why := karma.Stale(b, "v2", now); why != "" {
			t.Errorf("trace B, whose file did not change: stale %q", why)
		}
		// Verified again against the current code.
		rebound := ctxd.TraceBinding{Codex: "v2", Files: []ctxd.TraceFile{{Path: "a.go", SHA256: sum("d"), Cited: true}, {Path: "c.go", SHA256: sum("c")}}}
		v := event(t, s, ctxd.KarmaEvent{Trace: idA, Action: ctxd.KarmaVerify, Note: "still right", At: t0.Add(time.Hour), Binding: &rebound})
		if v.Rebound == nil || !reflect.DeepEqual(*v.Rebound, rebound) || karma.Stale(v, "v2", now) != "" {
			t.Errorf("after verifying again: %+v; want it bound to v2 and not stale", v)
		}
		a, evs, err := s.Trace(ctx, idA)
		if err != nil || a.Rebound == nil || !reflect.DeepEqual(*a.Rebound, rebound) || len(evs) != 2 || evs[1].Binding == nil {
			t.Errorf("reread: %+v, events %+v, %v", a, evs, err)
		}
		// The history still says what it was verified against first.
		then, err := s.Traces(ctx, ctxd.TraceFilter{Sigil: "dev", At: t0.Add(30 * time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		for _, tr := range then {
			if tr.ID == idA && (tr.Rebound != nil || karma.Stale(tr, "v2", now) == "") {
				t.Errorf("trace A as it stood before the second verification: %+v; want it unbound and stale", tr)
			}
		}
		// A trace answered from the whole codex goes stale with any change.
		whole := ctxd.TraceBinding{Codex: "v1", Whole: true}
		idW, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "w?", Answer: "w", Codex: "v1", CreatedAt: t0, Binding: whole})
		if err != nil {
			t.Fatal(err)
		}
		w, _, _ := s.Trace(ctx, idW)
		if karma.Stale(w, "v1", now) != "" || karma.Stale(w, "v2", now) == "" {
			t.Errorf("whole-codex trace: stale on v1 %q, on v2 %q; want only on v2", karma.Stale(w, "v1", now), karma.Stale(w, "v2", now))
		}
	}},
	{"round trip", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		created := t0.Add(123456789) // nanoseconds are kept
		in := ctxd.Trace{Session: "sess", Sigil: "dev", Query: "how?", Answer: "so", Model: "m", Fingerprint: "fp", Codex: "cx", CreatedAt: created,
			Status: ctxd.TraceVerified, Pinned: true} // derived fields are ignored
		id, err := s.RecordTrace(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		got, evs, err := s.Trace(ctx, id)
		want := in
		want.ID, want.Status, want.Pinned = id, ctxd.TraceRecorded, false
		if err != nil || len(evs) != 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("recorded = %+v, %v, %v; want %+v", got, evs, err, want)
		}
		t1, t2, t3, t4 := t0.Add(time.Hour), t0.Add(2*time.Hour), t0.Add(3*time.Hour), t0.Add(4*time.Hour)
		v := event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Note: "checked", At: t1})
		if v.Status != ctxd.TraceVerified || v.Note != "checked" || v.JudgedAt == nil || !v.JudgedAt.Equal(t1) {
			t.Errorf("verified = %+v", v)
		}
		p := event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaPin, At: t2})
		if !p.Pinned || p.Status != ctxd.TraceVerified || p.Note != "checked" {
			t.Errorf("pinned = %+v", p)
		}
		r := event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaReject, Note: "wrong after all", At: t3})
		if r.Status != ctxd.TraceRejected || !r.Pinned || r.Note != "wrong after all" || !r.JudgedAt.Equal(t3) {
			t.Errorf("rejected = %+v", r)
		}
		u := event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaUnpin, At: t4})
		got, evs, err = s.Trace(ctx, id)
		if err != nil || !reflect.DeepEqual(got, u) || u.Pinned {
			t.Fatalf("Trace = %+v, %v; the event returned %+v", got, err, u)
		}
		actions := []string{}
		for _, ev := range evs {
			actions = append(actions, ev.Action)
		}
		if want := []string{ctxd.KarmaVerify, ctxd.KarmaPin, ctxd.KarmaReject, ctxd.KarmaUnpin}; !slices.Equal(actions, want) {
			t.Errorf("events = %v, want %v", actions, want)
		}
		if evs[0].Sigil != "judge" || evs[0].Note != "checked" || !evs[0].At.Equal(t1) {
			t.Errorf("first event = %+v", evs[0])
		}
		if folded, err := karma.Fold(got, evs, time.Time{}); err != nil || !reflect.DeepEqual(folded, got) {
			t.Errorf("the fold of the events = %+v, %v; the trace %+v", folded, err, got)
		}
	}},
	{"bad requests", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		id := record(t, s, "dev", "q", t0)
		_, err := s.RecordTrace(ctx, ctxd.Trace{Query: "q", CreatedAt: t0})
		wantKind(t, err, ctxd.KindInvalid, "sigil")
		_, err = s.RecordTrace(ctx, ctxd.Trace{Sigil: "dev", Query: "q"})
		wantKind(t, err, ctxd.KindInvalid, "time")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: 999, Action: ctxd.KarmaVerify, At: t0})
		wantKind(t, err, ctxd.KindNotFound, "999")
		_, _, err = s.Trace(ctx, 999)
		wantKind(t, err, ctxd.KindNotFound, "999")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: "bless", At: t0})
		wantKind(t, err, ctxd.KindInvalid, "bless")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify})
		wantKind(t, err, ctxd.KindInvalid, "time")
		_, err = s.Traces(ctx, ctxd.TraceFilter{Status: "great"})
		wantKind(t, err, ctxd.KindInvalid, "great")
		_, err = s.Traces(ctx, ctxd.TraceFilter{Limit: -1})
		wantKind(t, err, ctxd.KindInvalid)
		if _, evs, _ := s.Trace(ctx, id); len(evs) != 0 {
			t.Errorf("refused events were stored: %+v", evs)
		}
	}},
	{"supersession", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		old := record(t, s, "dev", "old", t0)
		fix := record(t, s, "dev", "fix", t0.Add(time.Minute))
		third := record(t, s, "dev", "third", t0.Add(2*time.Minute))
		foreign := record(t, s, "ops", "foreign", t0)
		event(t, s, ctxd.KarmaEvent{Trace: old, Action: ctxd.KarmaVerify, At: t0.Add(time.Hour)})
		event(t, s, ctxd.KarmaEvent{Trace: fix, Action: ctxd.KarmaVerify, At: t0.Add(time.Hour)})
		sup := ctxd.KarmaEvent{Trace: old, Action: ctxd.KarmaSupersede, At: t0.Add(2 * time.Hour)}

		for _, tc := range []struct {
			other    int64
			kind     ctxd.Kind
			mentions string
		}{
			{0, ctxd.KindInvalid, ""},
			{old, ctxd.KindInvalid, "itself"},
			{12345, ctxd.KindInvalid, "12345"},
			{foreign, ctxd.KindInvalid, "ops"},
		} {
			ev := sup
			ev.Other = tc.other
			_, err := s.KarmaEvent(ctx, ev)
			wantKind(t, err, tc.kind, tc.mentions)
		}
		sup.Other = fix
		got := event(t, s, sup)
		if got.SupersededBy != fix || got.ValidUntil == nil || !got.ValidUntil.Equal(sup.At) || got.Status != ctxd.TraceVerified {
			t.Errorf("superseded = %+v", got)
		}
		f, fevs, _ := s.Trace(ctx, fix)
		if f.Supersedes != old || len(fevs) != 2 || fevs[1].Action != ctxd.KarmaSupersede {
			t.Errorf("replacing trace = %+v, events %+v", f, fevs)
		}
		if folded, err := karma.Fold(f, fevs, time.Time{}); err != nil || !reflect.DeepEqual(folded, f) {
			t.Errorf("the fold of the replacing trace's events = %+v, %v", folded, err)
		}
		again := sup
		again.Other = third
		_, err := s.KarmaEvent(ctx, again)
		wantKind(t, err, ctxd.KindConflict, fmt.Sprint(old), fmt.Sprint(fix), fmt.Sprint(third))
		// A superseded trace does not replace another.
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: third, Action: ctxd.KarmaSupersede, Other: old, At: t0.Add(3 * time.Hour)})
		wantKind(t, err, ctxd.KindConflict, fmt.Sprint(old))
		// A chain: fix is itself corrected by third.
		event(t, s, ctxd.KarmaEvent{Trace: fix, Action: ctxd.KarmaSupersede, Other: third, At: t0.Add(3 * time.Hour)})
		f, _, _ = s.Trace(ctx, fix)
		if f.Supersedes != old || f.SupersededBy != third {
			t.Errorf("middle of the chain = %+v", f)
		}
		if _, evs, _ := s.Trace(ctx, old); len(evs) != 2 {
			t.Errorf("refused supersedes were stored: %+v", evs)
		}
	}},
	{"eligible", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
		recorded := record(t, s, "a", "recorded", at(0))
		verified := record(t, s, "a", "verified", at(1))
		pinned := record(t, s, "a", "pinned only", at(2))
		rejectedPinned := record(t, s, "a", "rejected pinned", at(3))
		superseded := record(t, s, "a", "superseded", at(4))
		unpinned := record(t, s, "a", "pinned then unpinned", at(5))
		bVerified := record(t, s, "b", "b's", at(6))
		bPinned := record(t, s, "b", "b's pinned", at(7))
		_ = recorded
		for _, id := range []int64{verified, superseded, bVerified} {
			event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: at(10)})
		}
		for _, id := range []int64{pinned, rejectedPinned, unpinned, bPinned} {
			event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaPin, At: at(11)})
		}
		event(t, s, ctxd.KarmaEvent{Trace: rejectedPinned, Action: ctxd.KarmaReject, At: at(12)})
		event(t, s, ctxd.KarmaEvent{Trace: superseded, Action: ctxd.KarmaSupersede, Other: verified, At: at(12)})
		event(t, s, ctxd.KarmaEvent{Trace: unpinned, Action: ctxd.KarmaUnpin, At: at(13)})
		for sigil, want := range map[string][]int64{"a": {verified, pinned}, "b": {bVerified, bPinned}, "c": {}} {
			got, err := s.Eligible(ctx, sigil)
			if err != nil || !slices.Equal(traceIDs(got), want) {
				t.Errorf("Eligible(%s) = %v, %v; want %v", sigil, traceIDs(got), err, want)
			}
			for _, tr := range got {
				if tr.Sigil != sigil || !karma.Eligible(tr) {
					t.Errorf("Eligible(%s) holds %+v", sigil, tr)
				}
			}
		}
	}},
	{"as of a time", func(t *testing.T, s ctxd.KarmaStore) {
		t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
		a := record(t, s, "dev", "first", t0)
		event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaVerify, Note: "good", At: t1})
		b := record(t, s, "dev", "correction", t1.Add(time.Minute))
		event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, At: t1.Add(2 * time.Minute)})
		event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaSupersede, Other: b, At: t2})
		event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaPin, At: t2.Add(time.Minute)})
		asOf := func(at time.Time) map[int64]ctxd.Trace {
			ts, err := s.Traces(t.Context(), ctxd.TraceFilter{At: at})
			if err != nil {
				t.Fatal(err)
			}
			out := map[int64]ctxd.Trace{}
			for _, tr := range ts {
				out[tr.ID] = tr
			}
			return out
		}
		before := asOf(t0.Add(time.Minute))
		if len(before) != 1 || before[a].Status != ctxd.TraceRecorded || before[a].JudgedAt != nil {
			t.Errorf("before t1: %+v", before)
		}
		between := asOf(t1.Add(30 * time.Minute))
		if ta := between[a]; ta.Status != ctxd.TraceVerified || ta.Note != "good" || ta.SupersededBy != 0 || ta.ValidUntil != nil || !karma.Eligible(ta) {
			t.Errorf("between t1 and t2, a = %+v", ta)
		}
		if tb := between[b]; tb.Supersedes != 0 || tb.Status != ctxd.TraceVerified {
			t.Errorf("between t1 and t2, b = %+v", tb)
		}
		after := asOf(t2)
		if ta := after[a]; ta.SupersededBy != b || !ta.ValidUntil.Equal(t2) || ta.Pinned || karma.Eligible(ta) {
			t.Errorf("at t2, a = %+v", ta)
		}
		if tb := after[b]; tb.Supersedes != a {
			t.Errorf("at t2, b = %+v", tb)
		}
		now := asOf(time.Time{})
		if ta := now[a]; !ta.Pinned || ta.SupersededBy != b {
			t.Errorf("now, a = %+v", ta)
		}
		// Filters apply to the state as of then.
		if got := list(t, s, ctxd.TraceFilter{At: t0.Add(time.Minute), Status: ctxd.TraceVerified}); len(got) != 0 {
			t.Errorf("verified before t1: %v", got)
		}
		if got := list(t, s, ctxd.TraceFilter{At: t1, Status: ctxd.TraceVerified}); !slices.Equal(got, []int64{a}) {
			t.Errorf("verified at t1: %v", got)
		}
		if got := list(t, s, ctxd.TraceFilter{At: t2, Pinned: true}); len(got) != 0 {
			t.Errorf("pinned at t2: %v", got)
		}
		if got := list(t, s, ctxd.TraceFilter{Pinned: true}); !slices.Equal(got, []int64{a}) {
			t.Errorf("pinned now: %v", got)
		}
	}},
	{"text", func(t *testing.T, s ctxd.KarmaStore) {
		a := record(t, s, "dev", "How do I retry a Timeout?", t0)
		b := record(t, s, "dev", "What is the config path?", t0.Add(time.Minute))
		c := record(t, s, "ops", "Timeout on the config reload", t0.Add(2*time.Minute))
		event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, Note: "confirmed by zebra", At: t0.Add(time.Hour)})
		event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, Note: "confirmed by yak", At: t0.Add(2 * time.Hour)})
		for _, tc := range []struct {
			f    ctxd.TraceFilter
			want []int64
		}{
			{ctxd.TraceFilter{Text: "timeout"}, []int64{c, a}},
			{ctxd.TraceFilter{Text: "TIMEOUT retry"}, []int64{a}},
			{ctxd.TraceFilter{Text: "timeout", Sigil: "ops"}, []int64{c}},
			{ctxd.TraceFilter{Text: "config answer"}, []int64{c, b}}, // query and answer together
			{ctxd.TraceFilter{Text: "yak"}, []int64{b}},
			{ctxd.TraceFilter{Text: "zebra"}, []int64{}}, // an earlier note
			{ctxd.TraceFilter{Text: "zebra", At: t0.Add(90 * time.Minute)}, []int64{b}},
			{ctxd.TraceFilter{Text: "yak", At: t0.Add(90 * time.Minute)}, []int64{}},
			{ctxd.TraceFilter{Text: "path confirmed", At: t0.Add(90 * time.Minute)}, []int64{b}},
			{ctxd.TraceFilter{Text: "config", At: t0.Add(90 * time.Minute)}, []int64{c, b}},
			{ctxd.TraceFilter{Text: `timeout NOT "retry" OR * ^`}, []int64{}}, // FTS5 syntax is words
			{ctxd.TraceFilter{Text: "?!"}, []int64{}},
			{ctxd.TraceFilter{Text: "tim"}, []int64{}}, // whole words
		} {
			if got := list(t, s, tc.f); !slices.Equal(got, tc.want) {
				t.Errorf("Traces(%+v) = %v, want %v", tc.f, got, tc.want)
			}
		}
	}},
	{"filters and order", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		var all []int64
		for i := range 250 {
			id, err := s.RecordTrace(ctx, ctxd.Trace{Session: fmt.Sprint("s", i%2), Sigil: fmt.Sprint("g", i%3), Query: "q", CreatedAt: t0.Add(time.Duration(i%125) * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, id)
			if i%5 == 0 {
				event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: t0.Add(time.Hour)})
			}
		}
		newest := slices.Clone(all)
		slices.SortFunc(newest, func(x, y int64) int { // by CreatedAt, then id, newest first
			cx, cy := (x-1)%125, (y-1)%125
			if cx != cy {
				return int(cy - cx)
			}
			return int(y - x)
		})
		keep := func(ids []int64, ok func(int64) bool) []int64 {
			out := []int64{}
			for _, id := range ids {
				if ok(id) {
					out = append(out, id)
				}
			}
			return out
		}
		verified := func(id int64) bool { return (id-1)%5 == 0 }
		for _, tc := range []struct {
			name string
			f    ctxd.TraceFilter
			want []int64
		}{
			{"default limit", ctxd.TraceFilter{}, newest[:100]},
			{"limit", ctxd.TraceFilter{Limit: 7}, newest[:7]},
			{"sigil", ctxd.TraceFilter{Sigil: "g1", Limit: 1000}, keep(newest, func(id int64) bool { return (id-1)%3 == 1 })},
			{"session and status", ctxd.TraceFilter{Session: "s0", Status: ctxd.TraceVerified, Limit: 1000},
				keep(newest, func(id int64) bool { return (id-1)%2 == 0 && verified(id) })},
			{"recorded", ctxd.TraceFilter{Status: ctxd.TraceRecorded, Limit: 1000}, keep(newest, func(id int64) bool { return !verified(id) })},
			{"as of, across pages", ctxd.TraceFilter{At: t0.Add(2 * time.Hour), Status: ctxd.TraceVerified, Limit: 45}, keep(newest, verified)[:45]},
			{"as of, all", ctxd.TraceFilter{At: t0.Add(2 * time.Hour), Limit: 1000}, newest},
			{"as of, created by then", ctxd.TraceFilter{At: t0.Add(9 * time.Second), Sigil: "g0"},
				keep(newest, func(id int64) bool { return (id-1)%125 <= 9 && (id-1)%3 == 0 })},
		} {
			if got := list(t, s, tc.f); !slices.Equal(got, tc.want) {
				t.Errorf("%s: Traces = %v, want %v", tc.name, got, tc.want)
			}
		}
	}},
	{"snapshots", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		if _, ok, err := s.KarmaSnapshot(ctx, "sess"); ok || err != nil {
			t.Fatalf("no snapshot yet: %v, %v", ok, err)
		}
		one := ctxd.KarmaSnapshot{Session: "sess", Sigil: "dev", KarmaEpoch: 1, SessionEpoch: 0, Reason: "first", At: t0,
			Entries: []ctxd.KarmaEntry{{Trace: 3, Text: "Q: a\nA: b", Pinned: true, Score: 7.123456789, Verified: true}}}
		two := ctxd.KarmaSnapshot{Session: "sess", Sigil: "dev", KarmaEpoch: 2, SessionEpoch: 4, Reason: "codex changed", At: t0.Add(time.Hour)}
		other := ctxd.KarmaSnapshot{Session: "other", Sigil: "dev", KarmaEpoch: 1, Reason: "first", At: t0, Entries: []ctxd.KarmaEntry{}}
		for _, snap := range []ctxd.KarmaSnapshot{one, two, other} {
			if err := s.SaveKarmaSnapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
		}
		again := one
		again.Reason = "rewritten"
		wantKind(t, s.SaveKarmaSnapshot(ctx, again), ctxd.KindConflict, "1")
		wantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 0, At: t0}), ctxd.KindInvalid)
		wantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "", KarmaEpoch: 3, At: t0}), ctxd.KindInvalid)
		wantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 3}), ctxd.KindInvalid)
		latest, ok, err := s.KarmaSnapshot(ctx, "sess")
		if err != nil || !ok || !reflect.DeepEqual(latest, two) {
			t.Errorf("latest = %+v, %v, %v; want %+v", latest, ok, err, two)
		}
		all, err := s.KarmaSnapshots(ctx, "sess")
		if err != nil || !reflect.DeepEqual(all, []ctxd.KarmaSnapshot{one, two}) {
			t.Errorf("snapshots = %+v, %v", all, err)
		}
		if o, _, _ := s.KarmaSnapshot(ctx, "other"); !reflect.DeepEqual(o, other) {
			t.Errorf("other session's = %+v", o)
		}
		if none, err := s.KarmaSnapshots(ctx, "nobody"); len(none) != 0 || err != nil {
			t.Errorf("unknown session's snapshots = %+v, %v", none, err)
		}
	}},
}

func TestKarmaContract(t *testing.T) {
	for _, st := range karmaStores {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range karmaContract {
				t.Run(tc.name, func(t *testing.T) { tc.run(t, st.open(t)) })
			}
		})
	}
}

func TestTracesSurviveSessionDeletion(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	if _, err := s.AppendTurn(ctx, "sess", ctxd.Turn{Query: "q", Answer: "a"}, nil, t0); err != nil {
		t.Fatal(err)
	}
	id := record(t, s, "dev", "q", t0)
	event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: t0})
	if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 1, At: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSession(ctx, "sess"); err != nil {
		t.Fatal(err)
	}
	if tr, evs, err := s.Trace(ctx, id); err != nil || tr.Session != "sess" || len(evs) != 1 {
		t.Errorf("after deleting the session: %+v, %v, %v", tr, evs, err)
	}
	if snaps, err := s.KarmaSnapshots(ctx, "sess"); err != nil || len(snaps) != 1 {
		t.Errorf("snapshots after deleting the session: %+v, %v", snaps, err)
	}
}

func TestKarmaRecordIsAppendOnly(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	id := record(t, s, "dev", "q", t0)
	event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: t0})
	if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 1, At: t0}); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		"UPDATE traces SET answer = 'else'",
		"UPDATE traces SET created_unix_nano = 0",
		"DELETE FROM traces",
		"UPDATE karma_events SET note = 'else'",
		"DELETE FROM karma_events",
		"UPDATE karma_snapshots SET reason = 'else'",
		"DELETE FROM karma_snapshots",
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err == nil {
			t.Errorf("%s: no error", stmt)
		}
	}
	if tr, evs, err := s.Trace(ctx, id); err != nil || tr.Answer != "answer to q" || len(evs) != 1 {
		t.Errorf("after the refused writes: %+v, %v, %v", tr, evs, err)
	}
}

func TestEligibleUsesItsIndex(t *testing.T) {
	s := openTemp(t)
	rows, err := s.db.QueryContext(t.Context(), "EXPLAIN QUERY PLAN SELECT "+traceColumns+` FROM traces
		WHERE sigil = ? AND superseded_by = 0 AND status != 'rejected' AND (status = 'verified' OR pinned = 1)
		ORDER BY id`, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if p := strings.Join(plan, "; "); !strings.Contains(p, "traces_eligible") || strings.Contains(p, "TEMP B-TREE") {
		t.Errorf("plan: %s", p)
	}
}

func TestMigrationFromVersion3KeepsSessions(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "ctxd.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	// Take the database back to version 3 with a session in it.
	for _, stmt := range []string{
		"DROP TABLE trace_text", "DROP TABLE karma_snapshots", "DROP TABLE karma_events", "DROP TABLE traces",
		"ALTER TABLE sessions DROP COLUMN sigil", "PRAGMA user_version = 3",
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := s.AppendTurn(ctx, "sess", ctxd.Turn{Query: "q", Answer: "a"}, nil, t0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("user_version = %d, %v", v, err)
	}
	if sess, err := s.Session(ctx, "sess"); err != nil || len(sess.Turns) != 1 || sess.Owner != "" {
		t.Errorf("session after the migration: %+v, %v", sess, err)
	}
	// A session recorded before owners goes to the default sigil only.
	if owner, err := s.ClaimSession(ctx, "sess", "other", "default", t0); err != nil || owner != "" {
		t.Errorf("another sigil claiming a legacy session: %q %v", owner, err)
	}
	if owner, err := s.ClaimSession(ctx, "sess", "default", "default", t0); err != nil || owner != "default" {
		t.Errorf("the default sigil claiming a legacy session: %q %v", owner, err)
	}
	if owner, err := s.ClaimSession(ctx, "new", "other", "default", t0); err != nil || owner != "other" {
		t.Errorf("a new session: %q %v", owner, err)
	}
	record(t, s, "dev", "q", t0)
}

func TestCommitsAreSynchronous(t *testing.T) {
	s := openTemp(t)
	var mode int
	if err := s.db.QueryRowContext(t.Context(), "PRAGMA synchronous").Scan(&mode); err != nil || mode != 2 {
		t.Errorf("synchronous = %d, %v; want 2 (FULL)", mode, err)
	}
}

// TestCrashKeepsAcknowledgedVerification runs itself again as a child
// process that records and verifies a trace, says "acked" once the store
// has returned (and its readers have read it, one still in its read
// transaction), and waits; the parent kills it on the spot (SIGKILL: no
// Close, nothing flushed by the child after the acknowledgement) and finds
// the verification in the database.
func TestCrashKeepsAcknowledgedVerification(t *testing.T) {
	if os.Getenv("CTXD_KARMA_CRASH_CHILD") == "1" {
		crashChild(t, os.Getenv("CTXD_KARMA_CRASH_DB"))
		return
	}
	path := filepath.Join(t.TempDir(), "ctxd.db")
	// A child that hangs before "acked" is killed at this deadline, which
	// ends the wait for its line.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashKeepsAcknowledgedVerification$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CTXD_KARMA_CRASH_CHILD=1", "CTXD_KARMA_CRASH_DB="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := false
	for sc := bufio.NewScanner(stdout); sc.Scan(); {
		if sc.Text() == "acked" {
			acked = true
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	err = cmd.Wait()
	if !acked {
		t.Fatalf("the child never acknowledged: %v\n%s", err, stderr.Bytes())
	}
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the child was not killed: %v\n%s", err, stderr.Bytes())
	}

	s, err := Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr, evs, err := s.Trace(t.Context(), 1)
	if err != nil || tr.Status != ctxd.TraceVerified || tr.Note != "acknowledged" || len(evs) != 1 {
		t.Fatalf("after the crash: %+v, %+v, %v", tr, evs, err)
	}
	if el, err := s.Eligible(t.Context(), "dev"); err != nil || len(el) != 1 {
		t.Errorf("eligible after the crash: %+v, %v", el, err)
	}
}

func crashChild(t *testing.T, path string) {
	ctx := context.Background()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.RecordTrace(ctx, ctxd.Trace{Session: "sess", Sigil: "dev", Query: "q", Answer: "a", CreatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Note: "acknowledged", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// Die with the readers open too, one of them inside a read
	// transaction that has seen the verification.
	reading, err := s.readTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var status string
	if err := reading.QueryRowContext(ctx, "SELECT status FROM traces WHERE id = ?", id).Scan(&status); err != nil || status != ctxd.TraceVerified {
		t.Fatalf("a reader after the acknowledgement: %q, %v", status, err)
	}
	if el, err := s.Eligible(ctx, "dev"); err != nil || len(el) != 1 {
		t.Fatalf("eligible after the acknowledgement: %+v, %v", el, err)
	}
	fmt.Println("acked")
	time.Sleep(time.Minute) // killed long before
	t.Fatal("not killed")
}

// TestTraceBindings: a trace recorded before bindings (an empty binding
// column, as migration 6 leaves it) holds for its codex alone and never
// goes stale; a trace's binding is fixed like its text.
func TestTraceBindings(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO traces (session, sigil, query, answer, model, fingerprint, codex, created_unix_nano)
		VALUES ('s', 'dev', 'q', 'a', 'm', 'fp', 'v1', 1)`); err != nil {
		t.Fatal(err)
	}
	legacy, _, err := s.Trace(ctx, 1)
	if err != nil || legacy.Binding.Codex != "v1" || legacy.Binding.Whole || len(legacy.Binding.Files) != 0 {
		t.Fatalf("legacy trace %+v, %v", legacy, err)
	}
	if why := karma.Stale(legacy, "v2", map[string]string{}); why != "" {
		t.Errorf("a legacy trace went stale: %q", why)
	}
	id, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "q", Answer: "a", CreatedAt: t0,
		Binding: ctxd.TraceBinding{Codex: "v1", Files: []ctxd.TraceFile{{Path: "a.go", SHA256: strings.Repeat("a", 64)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, "UPDATE traces SET binding = '' WHERE id = ?", id); err == nil || !strings.Contains(err.Error(), "never changes") {
		t.Errorf("rewriting a trace's binding: %v; want it refused", err)
	}
}
