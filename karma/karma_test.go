package karma

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func trace(id int64, status string, pinned bool, age time.Duration) ctxd.Trace {
	return ctxd.Trace{
		ID: id, Sigil: "s", Query: "q" + string(rune('a'+id%26)), Answer: "a", Status: status, Pinned: pinned,
		CreatedAt: now.Add(-age),
	}
}

func TestScore(t *testing.T) {
	day := 24 * time.Hour
	o := Options{Now: now, Codex: "c1"}
	tests := []struct {
		name string
		t    ctxd.Trace
		want float64
	}{
		{"recorded, new", trace(1, ctxd.TraceRecorded, false, 0), 1},
		{"verified, new", trace(1, ctxd.TraceVerified, false, 0), 3},
		{"verified, one half-life", trace(1, ctxd.TraceVerified, false, 7*day), 2.5},
		{"verified, two half-lives", trace(1, ctxd.TraceVerified, false, 14*day), 2.25},
		{"pinned recorded, new", trace(1, ctxd.TraceRecorded, true, 0), 5},
		{"pinned verified, new", trace(1, ctxd.TraceVerified, true, 0), 7},
		{"from the future counts as new", trace(1, ctxd.TraceVerified, false, -day), 3},
		{"current codex", func() ctxd.Trace { t := trace(1, ctxd.TraceVerified, false, 0); t.Codex = "c1"; return t }(), 4},
		{"other codex", func() ctxd.Trace { t := trace(1, ctxd.TraceVerified, false, 0); t.Codex = "c0"; return t }(), 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Score(tc.t, o); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("Score = %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("no codex never matches", func(t *testing.T) {
		if got := Score(trace(1, ctxd.TraceVerified, false, 0), Options{Now: now}); got != 3 {
			t.Errorf("Score = %v, want 3", got)
		}
	})
	t.Run("half-life option", func(t *testing.T) {
		got := Score(trace(1, ctxd.TraceVerified, false, day), Options{Now: now, HalfLife: day})
		if got != 2.5 {
			t.Errorf("Score = %v, want 2.5", got)
		}
	})
}

func TestText(t *testing.T) {
	tests := []struct {
		name string
		t    ctxd.Trace
		want string
	}{
		{"plain", ctxd.Trace{Query: "why?", Answer: "because"}, "Q: why?\nA: because"},
		{"trimmed", ctxd.Trace{Query: "  why?\n", Answer: "\tbecause \n"}, "Q: why?\nA: because"},
		{"note", ctxd.Trace{Query: "why?", Answer: "because", Note: " checked \n"}, "Q: why?\nA: because\nnote: checked"},
		{"blank note", ctxd.Trace{Query: "why?", Answer: "because", Note: " \n"}, "Q: why?\nA: because"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Text(tc.t); got != tc.want {
				t.Errorf("Text = %q, want %q", got, tc.want)
			}
		})
	}
}

func ids(es []ctxd.KarmaEntry) []int64 {
	out := make([]int64, len(es))
	for i, e := range es {
		out[i] = e.Trace
	}
	return out
}

func skipIDs(ss []Skip) []int64 {
	out := make([]int64, len(ss))
	for i, s := range ss {
		out[i] = s.Trace
	}
	return out
}

func TestSelect(t *testing.T) {
	day := 24 * time.Hour
	long := func(tr ctxd.Trace, n int) ctxd.Trace { tr.Answer = strings.Repeat("x", n); return tr }
	tests := []struct {
		name    string
		traces  []ctxd.Trace
		o       Options
		want    []int64
		skipped []int64
	}{
		{
			name: "top k by score, rendered by id",
			traces: []ctxd.Trace{
				trace(1, ctxd.TraceVerified, false, 1*day),
				trace(2, ctxd.TraceVerified, false, 30*day),
				trace(3, ctxd.TraceVerified, false, 0),
				trace(4, ctxd.TraceRecorded, true, 90*day),
			},
			o:    Options{TopK: 2},
			want: []int64{1, 3, 4},
		},
		{
			name: "pinned beyond top k",
			traces: []ctxd.Trace{
				trace(1, ctxd.TraceRecorded, true, 0),
				trace(2, ctxd.TraceVerified, true, 0),
				trace(3, ctxd.TraceRecorded, true, 0),
				trace(4, ctxd.TraceVerified, false, 0),
				trace(5, ctxd.TraceVerified, false, day),
			},
			o:    Options{TopK: 1},
			want: []int64{1, 2, 3, 4},
		},
		{
			name: "ties go to the higher id",
			traces: []ctxd.Trace{
				trace(7, ctxd.TraceVerified, false, day),
				trace(9, ctxd.TraceVerified, false, day),
				trace(8, ctxd.TraceVerified, false, day),
			},
			o:    Options{TopK: 2},
			want: []int64{8, 9},
		},
		{
			name: "too long an entry is skipped, not cut",
			traces: []ctxd.Trace{
				long(trace(1, ctxd.TraceVerified, false, 0), 200),
				trace(2, ctxd.TraceVerified, false, day),
			},
			o:       Options{MaxEntryChars: 100},
			want:    []int64{2},
			skipped: []int64{1},
		},
		{
			name: "what does not fit the block is skipped, smaller ones still fit",
			traces: []ctxd.Trace{
				long(trace(1, ctxd.TraceVerified, false, 0), 60),      // 69 characters, chosen
				long(trace(2, ctxd.TraceVerified, false, 1*day), 60),  // does not fit
				long(trace(3, ctxd.TraceVerified, false, 2*day), 10),  // 19 characters, fits
				long(trace(4, ctxd.TraceVerified, false, 3*day), 100), // over MaxEntryChars
			},
			o:       Options{MaxChars: 100, MaxEntryChars: 90},
			want:    []int64{1, 3},
			skipped: []int64{2, 4},
		},
		{
			name: "pinned that does not fit is reported, not cut",
			traces: []ctxd.Trace{
				long(trace(1, ctxd.TraceVerified, true, 0), 60),
				long(trace(2, ctxd.TraceRecorded, true, 0), 60),
				trace(3, ctxd.TraceVerified, false, 0),
			},
			o:       Options{MaxChars: 100},
			want:    []int64{1, 3},
			skipped: []int64{2},
		},
		{
			name: "top k counts chosen entries, not skipped ones",
			traces: []ctxd.Trace{
				long(trace(1, ctxd.TraceVerified, false, 0), 500),
				trace(2, ctxd.TraceVerified, false, day),
				trace(3, ctxd.TraceVerified, false, 2*day),
			},
			o:       Options{TopK: 2, MaxEntryChars: 100},
			want:    []int64{2, 3},
			skipped: []int64{1},
		},
		{
			name: "ineligible traces are skipped",
			traces: []ctxd.Trace{
				trace(1, ctxd.TraceRejected, true, 0),
				func() ctxd.Trace { t := trace(2, ctxd.TraceVerified, false, 0); t.SupersededBy = 3; return t }(),
				trace(3, ctxd.TraceVerified, false, 0),
				trace(4, ctxd.TraceRecorded, false, 0),
			},
			want:    []int64{3},
			skipped: []int64{1, 2, 4},
		},
		{
			name:   "a trace listed twice counts once",
			traces: []ctxd.Trace{trace(1, ctxd.TraceVerified, false, 0), trace(1, ctxd.TraceVerified, false, 0)},
			want:   []int64{1},
		},
		{name: "nothing eligible", traces: nil, want: []int64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Now = now
			entries, skipped := Select(tc.traces, tc.o)
			if got := ids(entries); !slices.Equal(got, tc.want) {
				t.Errorf("entries = %v, want %v", got, tc.want)
			}
			if got := skipIDs(skipped); !slices.Equal(got, tc.skipped) && len(got)+len(tc.skipped) > 0 {
				t.Errorf("skipped = %v (%+v), want %v", got, skipped, tc.skipped)
			}
			total := 0
			for _, e := range entries {
				total += len([]rune(e.Text))
			}
			if max := (tc.o.withDefaults()).MaxChars; total > max {
				t.Errorf("entries hold %d characters, over %d", total, max)
			}
		})
	}
}

func TestSelectEntries(t *testing.T) {
	tr := trace(4, ctxd.TraceVerified, true, 0)
	tr.Note = "right"
	entries, _ := Select([]ctxd.Trace{tr}, Options{Now: now})
	want := ctxd.KarmaEntry{Trace: 4, Text: Text(tr), Pinned: true, Score: 7, Verified: true}
	if len(entries) != 1 || entries[0] != want {
		t.Errorf("entries = %+v, want [%+v]", entries, want)
	}
}

func TestSelectIsStable(t *testing.T) {
	var traces []ctxd.Trace
	for i := range int64(40) {
		status := []string{ctxd.TraceVerified, ctxd.TraceRecorded}[i%2]
		tr := trace(i+1, status, i%7 == 0, time.Duration(i%5)*24*time.Hour)
		tr.Answer = strings.Repeat("y", int(i*37%300))
		if i%3 == 0 {
			tr.Codex = "c1"
		}
		traces = append(traces, tr)
	}
	o := Options{Now: now, Codex: "c1", TopK: 6, MaxChars: 1500, MaxEntryChars: 250}
	entries, skipped := Select(traces, o)
	again, againSkipped := Select(traces, o)
	if !reflect.DeepEqual(entries, again) || !reflect.DeepEqual(skipped, againSkipped) {
		t.Fatal("the same input selected twice differs")
	}
	if !slices.IsSortedFunc(entries, func(a, b ctxd.KarmaEntry) int { return int(a.Trace - b.Trace) }) {
		t.Errorf("entries not in id order: %v", ids(entries))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := slices.Clone(traces)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		got, gotSkipped := Select(shuffled, o)
		if !reflect.DeepEqual(got, entries) || !reflect.DeepEqual(gotSkipped, skipped) {
			t.Fatalf("input order changed the selection: %v, want %v", ids(got), ids(entries))
		}
	}
}

func TestDropLowest(t *testing.T) {
	e := func(id int64, score float64, pinned bool) ctxd.KarmaEntry {
		return ctxd.KarmaEntry{Trace: id, Score: score, Pinned: pinned}
	}
	tests := []struct {
		name    string
		entries []ctxd.KarmaEntry
		rest    []int64
		dropped int64
		ok      bool
	}{
		{"lowest unpinned", []ctxd.KarmaEntry{e(1, 3, false), e(2, 1.5, false), e(3, 5, true), e(4, 2, false)}, []int64{1, 3, 4}, 2, true},
		{"pinned kept though lowest", []ctxd.KarmaEntry{e(1, 0.5, true), e(2, 3, false)}, []int64{1}, 2, true},
		{"tie drops the lower id", []ctxd.KarmaEntry{e(5, 2, false), e(3, 2, false), e(8, 2, false)}, []int64{5, 8}, 3, true},
		{"only pinned", []ctxd.KarmaEntry{e(1, 5, true), e(2, 6, true)}, []int64{1, 2}, 0, false},
		{"empty", nil, []int64{}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.entries)
			rest, dropped, ok := DropLowest(tc.entries)
			if ok != tc.ok || dropped.Trace != tc.dropped || !slices.Equal(ids(rest), tc.rest) {
				t.Errorf("DropLowest = %v, %d, %v; want %v, %d, %v", ids(rest), dropped.Trace, ok, tc.rest, tc.dropped, tc.ok)
			}
			if !slices.Equal(tc.entries, before) {
				t.Errorf("DropLowest changed its input: %v", ids(tc.entries))
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name  string
		o     Options
		field string // "" when valid
	}{
		{"zero but now takes defaults", Options{Now: now}, ""},
		{"no now", Options{}, "Now"},
		{"negative top k", Options{Now: now, TopK: -1}, "TopK"},
		{"negative max chars", Options{Now: now, MaxChars: -1}, "MaxChars"},
		{"negative max entry chars", Options{Now: now, MaxEntryChars: -1}, "MaxEntryChars"},
		{"negative half-life", Options{Now: now, HalfLife: -time.Hour}, "HalfLife"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.field == "" && err != nil || tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field+" ")) {
				t.Errorf("Validate = %v, want an error naming %q", err, tc.field)
			}
		})
	}
}

func TestApply(t *testing.T) {
	t1, t2 := now, now.Add(time.Hour)
	base := ctxd.Trace{ID: 1, Sigil: "s", Status: ctxd.TraceRecorded, CreatedAt: now.Add(-time.Hour)}
	superseded := base
	superseded.SupersededBy = 3
	replacing := ctxd.Trace{ID: 2, Sigil: "s", Status: ctxd.TraceRecorded, Supersedes: 9}
	tests := []struct {
		name string
		t    ctxd.Trace
		ev   ctxd.KarmaEvent
		want func(ctxd.Trace) ctxd.Trace // nil when an error of kind is wanted
		kind ctxd.Kind
	}{
		{"verify", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaVerify, Note: "ok", At: t1},
			func(t ctxd.Trace) ctxd.Trace { t.Status, t.Note, t.JudgedAt = ctxd.TraceVerified, "ok", &t1; return t }, ""},
		{"reject", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaReject, Note: "wrong", At: t1},
			func(t ctxd.Trace) ctxd.Trace {
				t.Status, t.Note, t.JudgedAt = ctxd.TraceRejected, "wrong", &t1
				return t
			}, ""},
		{"pin", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaPin, At: t1},
			func(t ctxd.Trace) ctxd.Trace { t.Pinned = true; return t }, ""},
		{"supersede", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: 2, At: t2},
			func(t ctxd.Trace) ctxd.Trace { t.SupersededBy, t.ValidUntil = 2, &t2; return t }, ""},
		{"supersede, the replacing side", ctxd.Trace{ID: 2}, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: 2, At: t2},
			func(t ctxd.Trace) ctxd.Trace { t.Supersedes = 1; return t }, ""},
		{"no time", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaVerify}, nil, ctxd.KindInvalid},
		{"unknown action", base, ctxd.KarmaEvent{Trace: 1, Action: "bless", At: t1}, nil, ctxd.KindInvalid},
		{"other on a verify", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaVerify, Other: 2, At: t1}, nil, ctxd.KindInvalid},
		{"another trace's event", base, ctxd.KarmaEvent{Trace: 5, Action: ctxd.KarmaVerify, At: t1}, nil, ctxd.KindInvalid},
		{"supersede by nothing", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, At: t1}, nil, ctxd.KindInvalid},
		{"supersede by itself", base, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: 1, At: t1}, nil, ctxd.KindInvalid},
		{"supersede twice", superseded, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: 2, At: t1}, nil, ctxd.KindConflict},
		{"replacing trace already replaces another", replacing, ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: 2, At: t1}, nil, ctxd.KindConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Apply(tc.t, tc.ev)
			if tc.want == nil {
				if ctxd.KindOf(err) != tc.kind {
					t.Fatalf("Apply = %v, want an error of kind %s", err, tc.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.want(tc.t); !reflect.DeepEqual(got, want) {
				t.Errorf("Apply = %+v, want %+v", got, want)
			}
		})
	}
}

func TestJudgeSupersede(t *testing.T) {
	a := ctxd.Trace{ID: 1, Sigil: "s", Status: ctxd.TraceVerified}
	b := ctxd.Trace{ID: 2, Sigil: "s", Status: ctxd.TraceVerified}
	foreign := ctxd.Trace{ID: 3, Sigil: "other"}
	ev := func(other int64) ctxd.KarmaEvent {
		return ctxd.KarmaEvent{Trace: 1, Action: ctxd.KarmaSupersede, Other: other, At: now}
	}
	na, nb, err := Judge(a, &b, ev(2))
	if err != nil || na.SupersededBy != 2 || nb.Supersedes != 1 {
		t.Fatalf("Judge = %+v, %+v, %v", na, nb, err)
	}
	if _, _, err := Judge(a, nil, ev(9)); ctxd.KindOf(err) != ctxd.KindInvalid || !strings.Contains(err.Error(), "9") {
		t.Errorf("unknown replacing trace: %v", err)
	}
	if _, _, err := Judge(a, &foreign, ev(3)); ctxd.KindOf(err) != ctxd.KindInvalid {
		t.Errorf("replacing trace of another sigil: %v", err)
	}
	if _, _, err := Judge(na, &b, ev(2)); ctxd.KindOf(err) != ctxd.KindConflict || !strings.Contains(err.Error(), "1") || !strings.Contains(err.Error(), "2") {
		t.Errorf("superseding twice: %v", err)
	}
	// B, superseded, cannot replace C: a chain runs one way.
	c := ctxd.Trace{ID: 4, Sigil: "s"}
	nb.SupersededBy = 5
	if _, _, err := Judge(c, &nb, ctxd.KarmaEvent{Trace: 4, Action: ctxd.KarmaSupersede, Other: 2, At: now}); ctxd.KindOf(err) != ctxd.KindConflict {
		t.Errorf("superseded trace as replacement: %v", err)
	}
}

func TestFoldAt(t *testing.T) {
	t0 := now
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	base := ctxd.Trace{ID: 1, Sigil: "s", CreatedAt: t0, Status: "stale", Pinned: true, Note: "stale"}
	evs := []ctxd.KarmaEvent{
		{Trace: 1, Action: ctxd.KarmaVerify, Note: "good", At: t1},
		{Trace: 7, Action: ctxd.KarmaPin, At: t1}, // another trace's: ignored
		{Trace: 1, Action: ctxd.KarmaSupersede, Other: 2, At: t2},
	}
	tests := []struct {
		name       string
		at         time.Time
		status     string
		superseded int64
		supersedes int64
	}{
		{"before any event", t0, ctxd.TraceRecorded, 0, 0},
		{"between", t1.Add(time.Minute), ctxd.TraceVerified, 0, 0},
		{"after", t2, ctxd.TraceVerified, 2, 0},
		{"now", time.Time{}, ctxd.TraceVerified, 2, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Fold(base, evs, tc.at)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.status || got.SupersededBy != tc.superseded || got.Pinned || Eligible(got) != (tc.superseded == 0 && tc.status == ctxd.TraceVerified) {
				t.Errorf("Fold = %+v", got)
			}
		})
	}
	// The replacing trace supersedes from t2 on.
	replacing := ctxd.Trace{ID: 2, Sigil: "s", CreatedAt: t0}
	for at, want := range map[time.Time]int64{t1: 0, t2: 1} {
		if got, err := Fold(replacing, evs, at); err != nil || got.Supersedes != want {
			t.Errorf("replacing trace as of %s: %+v, %v", at, got, err)
		}
	}
}
