package storetest

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// Karma runs the karma contract (what every ctxd.KarmaStore does) as
// subtests of t, each on a fresh, empty store from open.
func Karma(t *testing.T, open func(testing.TB) ctxd.KarmaStore) {
	for _, tc := range karmaCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
	for _, tc := range karmaConcurrencyCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
}

// karmaCases are the karma contract.
var karmaCases = []struct {
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
		idA, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "a?", Answer: "see a.go", Codex: "v1", CreatedAt: T0, Binding: onA})
		if err != nil {
			t.Fatal(err)
		}
		idB, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "b?", Answer: "b", Codex: "v1", CreatedAt: T0, Binding: onB})
		if err != nil {
			t.Fatal(err)
		}
		Event(t, s, ctxd.KarmaEvent{Trace: idA, Action: ctxd.KarmaVerify, At: T0.Add(time.Minute)})
		Event(t, s, ctxd.KarmaEvent{Trace: idB, Action: ctxd.KarmaVerify, At: T0.Add(time.Minute)})
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
		v := Event(t, s, ctxd.KarmaEvent{Trace: idA, Action: ctxd.KarmaVerify, Note: "still right", At: T0.Add(time.Hour), Binding: &rebound})
		if v.Rebound == nil || !reflect.DeepEqual(*v.Rebound, rebound) || karma.Stale(v, "v2", now) != "" {
			t.Errorf("after verifying again: %+v; want it bound to v2 and not stale", v)
		}
		a, evs, err := s.Trace(ctx, idA)
		if err != nil || a.Rebound == nil || !reflect.DeepEqual(*a.Rebound, rebound) || len(evs) != 2 || evs[1].Binding == nil {
			t.Errorf("reread: %+v, events %+v, %v", a, evs, err)
		}
		// The history still says what it was verified against first.
		then, err := s.Traces(ctx, ctxd.TraceFilter{Sigil: "dev", At: T0.Add(30 * time.Minute)})
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
		idW, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "w?", Answer: "w", Codex: "v1", CreatedAt: T0, Binding: whole})
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
		created := T0.Add(123456789) // nanoseconds are kept
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
		t1, t2, t3, t4 := T0.Add(time.Hour), T0.Add(2*time.Hour), T0.Add(3*time.Hour), T0.Add(4*time.Hour)
		v := Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Note: "checked", At: t1})
		if v.Status != ctxd.TraceVerified || v.Note != "checked" || v.JudgedAt == nil || !v.JudgedAt.Equal(t1) {
			t.Errorf("verified = %+v", v)
		}
		p := Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaPin, At: t2})
		if !p.Pinned || p.Status != ctxd.TraceVerified || p.Note != "checked" {
			t.Errorf("pinned = %+v", p)
		}
		r := Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaReject, Note: "wrong after all", At: t3})
		if r.Status != ctxd.TraceRejected || !r.Pinned || r.Note != "wrong after all" || !r.JudgedAt.Equal(t3) {
			t.Errorf("rejected = %+v", r)
		}
		u := Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaUnpin, At: t4})
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
		id := Record(t, s, "dev", "q", T0)
		_, err := s.RecordTrace(ctx, ctxd.Trace{Query: "q", CreatedAt: T0})
		WantKind(t, err, ctxd.KindInvalid, "sigil")
		_, err = s.RecordTrace(ctx, ctxd.Trace{Sigil: "dev", Query: "q"})
		WantKind(t, err, ctxd.KindInvalid, "time")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: 999, Action: ctxd.KarmaVerify, At: T0})
		WantKind(t, err, ctxd.KindNotFound, "999")
		_, _, err = s.Trace(ctx, 999)
		WantKind(t, err, ctxd.KindNotFound, "999")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: "bless", At: T0})
		WantKind(t, err, ctxd.KindInvalid, "bless")
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify})
		WantKind(t, err, ctxd.KindInvalid, "time")
		_, err = s.Traces(ctx, ctxd.TraceFilter{Status: "great"})
		WantKind(t, err, ctxd.KindInvalid, "great")
		_, err = s.Traces(ctx, ctxd.TraceFilter{Limit: -1})
		WantKind(t, err, ctxd.KindInvalid)
		if _, evs, _ := s.Trace(ctx, id); len(evs) != 0 {
			t.Errorf("refused events were stored: %+v", evs)
		}
	}},
	{"supersession", func(t *testing.T, s ctxd.KarmaStore) {
		ctx := t.Context()
		old := Record(t, s, "dev", "old", T0)
		fix := Record(t, s, "dev", "fix", T0.Add(time.Minute))
		third := Record(t, s, "dev", "third", T0.Add(2*time.Minute))
		foreign := Record(t, s, "ops", "foreign", T0)
		Event(t, s, ctxd.KarmaEvent{Trace: old, Action: ctxd.KarmaVerify, At: T0.Add(time.Hour)})
		Event(t, s, ctxd.KarmaEvent{Trace: fix, Action: ctxd.KarmaVerify, At: T0.Add(time.Hour)})
		sup := ctxd.KarmaEvent{Trace: old, Action: ctxd.KarmaSupersede, At: T0.Add(2 * time.Hour)}

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
			WantKind(t, err, tc.kind, tc.mentions)
		}
		sup.Other = fix
		got := Event(t, s, sup)
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
		WantKind(t, err, ctxd.KindConflict, fmt.Sprint(old), fmt.Sprint(fix), fmt.Sprint(third))
		// A superseded trace does not replace another.
		_, err = s.KarmaEvent(ctx, ctxd.KarmaEvent{Trace: third, Action: ctxd.KarmaSupersede, Other: old, At: T0.Add(3 * time.Hour)})
		WantKind(t, err, ctxd.KindConflict, fmt.Sprint(old))
		// A chain: fix is itself corrected by third.
		Event(t, s, ctxd.KarmaEvent{Trace: fix, Action: ctxd.KarmaSupersede, Other: third, At: T0.Add(3 * time.Hour)})
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
		at := func(m int) time.Time { return T0.Add(time.Duration(m) * time.Minute) }
		recorded := Record(t, s, "a", "recorded", at(0))
		verified := Record(t, s, "a", "verified", at(1))
		pinned := Record(t, s, "a", "pinned only", at(2))
		rejectedPinned := Record(t, s, "a", "rejected pinned", at(3))
		superseded := Record(t, s, "a", "superseded", at(4))
		unpinned := Record(t, s, "a", "pinned then unpinned", at(5))
		bVerified := Record(t, s, "b", "b's", at(6))
		bPinned := Record(t, s, "b", "b's pinned", at(7))
		_ = recorded
		for _, id := range []int64{verified, superseded, bVerified} {
			Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: at(10)})
		}
		for _, id := range []int64{pinned, rejectedPinned, unpinned, bPinned} {
			Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaPin, At: at(11)})
		}
		Event(t, s, ctxd.KarmaEvent{Trace: rejectedPinned, Action: ctxd.KarmaReject, At: at(12)})
		Event(t, s, ctxd.KarmaEvent{Trace: superseded, Action: ctxd.KarmaSupersede, Other: verified, At: at(12)})
		Event(t, s, ctxd.KarmaEvent{Trace: unpinned, Action: ctxd.KarmaUnpin, At: at(13)})
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
		t1, t2 := T0.Add(time.Hour), T0.Add(2*time.Hour)
		a := Record(t, s, "dev", "first", T0)
		Event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaVerify, Note: "good", At: t1})
		b := Record(t, s, "dev", "correction", t1.Add(time.Minute))
		Event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, At: t1.Add(2 * time.Minute)})
		Event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaSupersede, Other: b, At: t2})
		Event(t, s, ctxd.KarmaEvent{Trace: a, Action: ctxd.KarmaPin, At: t2.Add(time.Minute)})
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
		before := asOf(T0.Add(time.Minute))
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
		if got := list(t, s, ctxd.TraceFilter{At: T0.Add(time.Minute), Status: ctxd.TraceVerified}); len(got) != 0 {
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
		a := Record(t, s, "dev", "How do I retry a Timeout?", T0)
		b := Record(t, s, "dev", "What is the config path?", T0.Add(time.Minute))
		c := Record(t, s, "ops", "Timeout on the config reload", T0.Add(2*time.Minute))
		Event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, Note: "confirmed by zebra", At: T0.Add(time.Hour)})
		Event(t, s, ctxd.KarmaEvent{Trace: b, Action: ctxd.KarmaVerify, Note: "confirmed by yak", At: T0.Add(2 * time.Hour)})
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
			{ctxd.TraceFilter{Text: "zebra", At: T0.Add(90 * time.Minute)}, []int64{b}},
			{ctxd.TraceFilter{Text: "yak", At: T0.Add(90 * time.Minute)}, []int64{}},
			{ctxd.TraceFilter{Text: "path confirmed", At: T0.Add(90 * time.Minute)}, []int64{b}},
			{ctxd.TraceFilter{Text: "config", At: T0.Add(90 * time.Minute)}, []int64{c, b}},
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
			id, err := s.RecordTrace(ctx, ctxd.Trace{Session: fmt.Sprint("s", i%2), Sigil: fmt.Sprint("g", i%3), Query: "q", CreatedAt: T0.Add(time.Duration(i%125) * time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, id)
			if i%5 == 0 {
				Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: T0.Add(time.Hour)})
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
			{"as of, across pages", ctxd.TraceFilter{At: T0.Add(2 * time.Hour), Status: ctxd.TraceVerified, Limit: 45}, keep(newest, verified)[:45]},
			{"as of, all", ctxd.TraceFilter{At: T0.Add(2 * time.Hour), Limit: 1000}, newest},
			{"as of, created by then", ctxd.TraceFilter{At: T0.Add(9 * time.Second), Sigil: "g0"},
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
		one := ctxd.KarmaSnapshot{Session: "sess", Sigil: "dev", KarmaEpoch: 1, SessionEpoch: 0, Reason: "first", At: T0,
			Entries: []ctxd.KarmaEntry{{Trace: 3, Text: "Q: a\nA: b", Pinned: true, Score: 7.123456789, Verified: true}}}
		two := ctxd.KarmaSnapshot{Session: "sess", Sigil: "dev", KarmaEpoch: 2, SessionEpoch: 4, Reason: "codex changed", At: T0.Add(time.Hour)}
		other := ctxd.KarmaSnapshot{Session: "other", Sigil: "dev", KarmaEpoch: 1, Reason: "first", At: T0, Entries: []ctxd.KarmaEntry{}}
		for _, snap := range []ctxd.KarmaSnapshot{one, two, other} {
			if err := s.SaveKarmaSnapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
		}
		again := one
		again.Reason = "rewritten"
		WantKind(t, s.SaveKarmaSnapshot(ctx, again), ctxd.KindConflict, "1")
		WantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 0, At: T0}), ctxd.KindInvalid)
		WantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "", KarmaEpoch: 3, At: T0}), ctxd.KindInvalid)
		WantKind(t, s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 3}), ctxd.KindInvalid)
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
