package dashboard

import (
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

func sum(session string, turn, prompt, evaluated int) ctxd.Summary {
	return ctxd.Summary{Session: session, Turn: turn, PromptTokens: prompt, CachedTokens: prompt - evaluated, EvaluatedTokens: evaluated}
}

// TestFeedFiltersAndBounds: a viewer gets only the turns it may see, in
// order; the feed keeps its last max turns; a session is shown by the id
// its client named.
func TestFeedFiltersAndBounds(t *testing.T) {
	f := NewFeed(3)
	at := time.Unix(1_000_000, 0)
	f.Record("alice", "", sum("a1"+ctxd.SessionScope+"alice", 1, 100, 100), at)
	f.Record("bob", "", sum("b1", 1, 50, 50), at)
	f.Record("alice", "coder", sum("a1", 2, 120, 20), at)
	f.Record("alice", "", sum("a2", 1, 10, 10), at)
	alice := func(s string) bool { return s == "alice" }
	got := f.Turns(alice, 0)
	if len(got) != 2 || got[0].Summary.Turn != 2 || got[1].Session != "a2" || got[0].Persona != "coder" {
		t.Fatalf("alice's turns: %+v", got)
	}
	all := f.Turns(func(string) bool { return true }, 0)
	if len(all) != 3 || all[0].Sigil != "bob" || all[0].Seq != 2 || all[2].Seq != 4 {
		t.Fatalf("the feed should keep its last 3 turns, oldest first: %+v", all)
	}
	if last := f.Turns(func(string) bool { return true }, 1); len(last) != 1 || last[0].Seq != 4 {
		t.Fatalf("the last turn: %+v", last)
	}
	f2 := NewFeed(0)
	f2.Record("alice", "", sum("a1"+ctxd.SessionScope+"alice", 1, 1, 1), at)
	if s := f2.Turns(alice, 0)[0].Session; s != "a1" {
		t.Fatalf("session shown as %q, want the client's id a1", s)
	}
}

// TestFeedSeries: turns count in the bucket of their time, only the
// viewer's, over SeriesBuckets buckets ending with now's.
func TestFeedSeries(t *testing.T) {
	f := NewFeed(0)
	now := time.Unix(1_000_005, 0) // bucket 1_000_000
	f.Record("alice", "", sum("a", 1, 100, 100), now.Add(-BucketSeconds*time.Second))
	f.Record("alice", "", sum("a", 2, 120, 20), now)
	f.Record("alice", "", sum("a", 3, 130, 10), now)
	f.Record("bob", "", sum("b", 1, 500, 500), now)
	f.Record("alice", "", sum("a", 0, 999, 999), now.Add(-time.Hour)) // too old for the series, and for its place in the ring
	measured := sum("b", 2, 500, 20)
	measured.BackendCachedTokens = new(470) // the server's word: 470 reused, not the 480 ctxd expected
	f.Record("bob", "", measured, now)
	s := f.Series(func(s string) bool { return s == "alice" }, now)
	if len(s) != SeriesBuckets || s[len(s)-1].Start != 1_000_000 || s[0].Start != 1_000_000-(SeriesBuckets-1)*BucketSeconds {
		t.Fatalf("buckets: %d, last starts %d", len(s), s[len(s)-1].Start)
	}
	last, prev := s[len(s)-1], s[len(s)-2]
	if last.Requests != 2 || last.Evaluated != 30 || last.Reused != 220 {
		t.Errorf("the last bucket: %+v, want 2 requests, 30 evaluated, 220 reused", last)
	}
	if prev.Requests != 1 || prev.Evaluated != 100 || prev.Reused != 0 {
		t.Errorf("the bucket before: %+v", prev)
	}
	if b := f.Series(func(s string) bool { return s == "bob" }, now); b[len(b)-1].Requests != 2 || b[len(b)-1].Reused != 470 {
		t.Errorf("bob's last bucket: %+v, want 2 requests, 470 reused (the server's count)", b[len(b)-1])
	}
	// The series outlives the kept turns: a feed that keeps one turn still
	// counts every one.
	small := NewFeed(1)
	for i := range 5 {
		small.Record("alice", "", sum("a", i, 10, 10), now)
	}
	if b := small.Series(func(string) bool { return true }, now); b[len(b)-1].Requests != 5 {
		t.Errorf("a feed of one turn counted %d requests, want 5", b[len(b)-1].Requests)
	}
}

// TestFeedPagesAndBehind: a page hears each turn and band change as it
// happens; one whose queue overflows is told it is behind, and a closed
// page is no longer told.
func TestFeedPagesAndBehind(t *testing.T) {
	f := NewFeed(0)
	at := time.Now()
	s := f.Subscribe()
	f.Record("alice", "", sum("a", 1, 1, 1), at)
	f.NoteEnvironment(ctxd.Environment{VRAM: "low"}, at) // the starting point: no change
	f.NoteEnvironment(ctxd.Environment{VRAM: "critical"}, at)
	if e := <-s.Events(); e.Turn == nil || e.Turn.Session != "a" {
		t.Fatalf("first event: %+v", e)
	}
	if e := <-s.Events(); e.Band == nil || e.Band.From.VRAM != "low" || e.Band.To.VRAM != "critical" {
		t.Fatalf("second event: %+v", e)
	}
	if b := f.Bands(); len(b) != 1 {
		t.Fatalf("bands kept: %+v", b)
	}
	for i := range pageQueue + 1 {
		f.Record("alice", "", sum("a", i, 1, 1), at)
	}
	select {
	case <-s.Behind():
	default:
		t.Fatal("a page whose queue overflowed was not told it is behind")
	}
	s.Drain()
	select {
	case e := <-s.Events():
		t.Fatalf("the queue was not drained: %+v", e)
	default:
	}
	if len(f.subs) != 1 {
		t.Fatalf("pages: %d", len(f.subs))
	}
	s.Close()
	f.Record("alice", "", sum("a", 9, 1, 1), at)
	if len(f.subs) != 0 || len(s.Events()) != 0 {
		t.Fatal("a closed page is still told")
	}
}
