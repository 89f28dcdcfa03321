package storetest

import (
	"slices"
	"testing"

	"github.com/ctxd/ctxd"
)

// Sessions runs the session contract (what every ctxd.Store does) as
// subtests of t, each on a fresh, empty store from open. The cases on
// counting need a ctxd.SessionCounter, and those on the karma record kept
// past a session a ctxd.KarmaStore; a store that is not one skips them.
func Sessions(t *testing.T, open func(testing.TB) ctxd.Store) {
	for _, tc := range sessionCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
	for _, tc := range concurrencyCases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open(t)) })
	}
}

// queries are the queries of turns, in order.
func queries(turns []ctxd.Turn) []string {
	out := []string{}
	for _, t := range turns {
		out = append(out, t.Query)
	}
	return out
}

func appendTurn(tb testing.TB, s ctxd.Store, id string, t ctxd.Turn) int64 {
	tb.Helper()
	seq, err := s.AppendTurn(tb.Context(), id, t, nil, T0)
	if err != nil {
		tb.Fatal(err)
	}
	return seq
}

func session(tb testing.TB, s ctxd.Store, id string) ctxd.Session {
	tb.Helper()
	sess, err := s.Session(tb.Context(), id)
	if err != nil {
		tb.Fatal(err)
	}
	return sess
}

// sessionCases are the session contract.
var sessionCases = []struct {
	name string
	run  func(t *testing.T, s ctxd.Store)
}{
	{"round trip", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		empty, err := s.Session(ctx, "new")
		if err != nil || len(empty.Turns) != 0 || empty.ID != "new" || empty.Epoch != 0 || empty.Count != 0 || empty.Owner != "" {
			t.Fatalf("unknown session: %+v %v", empty, err)
		}
		turns := []ctxd.Turn{
			{Query: "q1", Answer: "a1"},
			{Query: "q2", Answer: "a\x00 with NUL and ### marks", Excerpts: []ctxd.Excerpt{{Path: "a.go", Lines: "1-2", Text: "x\x00y"}}},
			{Query: "bytes \xff\xfe that are not UTF-8", Answer: "\uffff begins with a noncharacter", Verbatim: true},
			{Query: "", Answer: ""},
		}
		for i, tr := range turns {
			seq, err := s.AppendTurn(ctx, "s1", tr, []byte(`{"prompt_tokens":3}`), T0)
			if err != nil || seq != int64(i+1) {
				t.Fatalf("append turn %d: seq %d, %v", i, seq, err)
			}
		}
		appendTurn(t, s, "s2", ctxd.Turn{Query: "other", Answer: ""})
		got := session(t, s, "s1")
		if got.ID != "s1" || got.Epoch != 0 || got.Count != 4 || !slices.Equal(got.Seqs, []int64{1, 2, 3, 4}) || len(got.Turns) != 4 {
			t.Fatalf("session = %+v", got)
		}
		for i, tr := range turns {
			g := got.Turns[i]
			if g.Query != tr.Query || g.Answer != tr.Answer || g.Verbatim != tr.Verbatim || !slices.Equal(g.Excerpts, tr.Excerpts) {
				t.Errorf("turn %d = %#v, want %#v", i, g, tr)
			}
		}
		list, err := s.Sessions(ctx)
		if want := []ctxd.SessionInfo{{ID: "s1", Turns: 4}, {ID: "s2", Turns: 1}}; err != nil || !slices.Equal(list, want) {
			t.Fatalf("sessions = %+v %v; want %+v", list, err, want)
		}
		if err := s.DeleteSession(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if got := session(t, s, "s1"); len(got.Turns) != 0 || got.Count != 0 {
			t.Errorf("deleted session = %+v", got)
		}
		if err := s.DeleteSession(ctx, "never"); err != nil {
			t.Errorf("deleting an unknown session: %v", err)
		}
		if seq := appendTurn(t, s, "s1", ctxd.Turn{Query: "again", Answer: "a"}); seq != 1 {
			t.Errorf("a deleted session begun again: seq %d, want 1", seq)
		}
	}},
	{"new epoch keeps the record", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		for i := range 5 {
			appendTurn(t, s, "s", ctxd.Turn{Query: string(rune('a' + i)), Answer: "x", Verbatim: i == 0})
		}
		before := session(t, s, "s")
		epoch, err := s.NewEpoch(ctx, "s", []int64{before.Seqs[0], before.Seqs[4]}, before.Seqs[len(before.Seqs)-1], "they talked", T0)
		if err != nil || epoch != 1 {
			t.Fatalf("epoch %d, %v", epoch, err)
		}
		appendTurn(t, s, "s", ctxd.Turn{Query: "f", Answer: "y"})
		after := session(t, s, "s")
		if qs := queries(after.Turns); after.Epoch != 1 || after.Summary != "they talked" || !slices.Equal(qs, []string{"a", "e", "f"}) ||
			!slices.Equal(after.Seqs, []int64{1, 5, 6}) || !after.Turns[0].Verbatim {
			t.Errorf("after compaction: epoch %d summary %q turns %q seqs %v", after.Epoch, after.Summary, qs, after.Seqs)
		}
		if after.Count != 6 {
			t.Errorf("the record holds %d turns, want all 6", after.Count)
		}
		if epoch, err := s.NewEpoch(ctx, "fresh", nil, 0, "", T0); err != nil || epoch != 1 {
			t.Errorf("a new epoch of a new session: %d, %v; want 1", epoch, err)
		}
	}},
	{"new epoch keeps turns appended since its caller read", func(t *testing.T, s ctxd.Store) {
		// A daemon reads the session (turns 1 and 2) and compacts it to
		// its last turn while another daemon sharing the store appends
		// turn 3: the new epoch holds 2 and 3, not 2 alone.
		ctx := t.Context()
		appendTurn(t, s, "s", ctxd.Turn{Query: "q1", Answer: "a1"})
		appendTurn(t, s, "s", ctxd.Turn{Query: "q2", Answer: "a2"})
		read := session(t, s, "s")
		appendTurn(t, s, "s", ctxd.Turn{Query: "q3", Answer: "a3"})
		if _, err := s.NewEpoch(ctx, "s", read.Seqs[1:], read.Seqs[1], "", T0); err != nil {
			t.Fatal(err)
		}
		if got := session(t, s, "s"); !slices.Equal(queries(got.Turns), []string{"q2", "q3"}) || got.Count != 3 {
			t.Errorf("after a compaction that raced an append: turns %q (record %d); want q2 and the raced q3", queries(got.Turns), got.Count)
		}
		// A turn the caller read and left out stays out.
		if _, err := s.NewEpoch(ctx, "s", nil, 3, "", T0); err != nil {
			t.Fatal(err)
		}
		if got := session(t, s, "s"); len(got.Turns) != 0 {
			t.Errorf("turns read and left out came back: %q", queries(got.Turns))
		}
	}},
	{"drop excerpts", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		ex := []ctxd.Excerpt{{Path: "a.go", Text: "package a"}}
		appendTurn(t, s, "s", ctxd.Turn{Query: "q1", Answer: "a1", Excerpts: ex})
		appendTurn(t, s, "s", ctxd.Turn{Query: "q2", Answer: "a2", Excerpts: ex})
		if _, err := s.NewEpoch(ctx, "s", []int64{2}, 2, "summary", T0); err != nil {
			t.Fatal(err)
		}
		epoch, err := s.DropExcerpts(ctx, "s", nil, T0)
		if err != nil || epoch != 2 {
			t.Fatalf("drop excerpts: epoch %d, %v; want 2", epoch, err)
		}
		appendTurn(t, s, "s", ctxd.Turn{Query: "q3", Answer: "a3", Excerpts: ex})
		got := session(t, s, "s")
		if got.Epoch != 2 || got.Summary != "summary" || !slices.Equal(queries(got.Turns), []string{"q2", "q3"}) || got.Count != 3 {
			t.Fatalf("after dropping excerpts: %+v", got)
		}
		if got.Turns[0].Excerpts != nil || !slices.Equal(got.Turns[1].Excerpts, ex) {
			t.Errorf("excerpts: %+v, %+v; want none for the turn before, the later turn's kept", got.Turns[0].Excerpts, got.Turns[1].Excerpts)
		}
	}},
	{"drop the newest turns' excerpts", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		ex := []ctxd.Excerpt{{Path: "a.go", Text: "package a"}}
		for _, q := range []string{"q1", "q2", "q3"} {
			appendTurn(t, s, "s", ctxd.Turn{Query: q, Answer: "a", Excerpts: ex})
		}
		epoch, err := s.DropExcerpts(ctx, "s", []int64{2, 3}, T0)
		if err != nil || epoch != 1 {
			t.Fatalf("drop excerpts of turns 2 and 3: epoch %d, %v; want 1", epoch, err)
		}
		appendTurn(t, s, "s", ctxd.Turn{Query: "q4", Answer: "a", Excerpts: ex})
		got := session(t, s, "s")
		var held []int
		for _, tu := range got.Turns {
			held = append(held, len(tu.Excerpts))
		}
		if !slices.Equal(queries(got.Turns), []string{"q1", "q2", "q3", "q4"}) || !slices.Equal(held, []int{1, 0, 0, 1}) {
			t.Fatalf("after dropping turns 2 and 3's excerpts: turns %q holding %v excerpts; want q1..q4 holding [1 0 0 1]", queries(got.Turns), held)
		}
		if _, err := s.DropExcerpts(ctx, "s", nil, T0); err != nil {
			t.Fatal(err)
		}
		if got := session(t, s, "s"); stale(got.Turns) != 0 || len(got.Turns) != 4 {
			t.Errorf("after dropping all: %d turns holding %d excerpts; want 4 holding none", len(got.Turns), stale(got.Turns))
		}
	}},
	{"replace turns", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		appendTurn(t, s, "s", ctxd.Turn{Query: "q1", Answer: "a1"})
		appendTurn(t, s, "s", ctxd.Turn{Query: "q2", Answer: "a2"})
		if _, err := s.NewEpoch(ctx, "s", []int64{1, 2}, 2, "summary", T0); err != nil {
			t.Fatal(err)
		}
		epoch, seqs, err := s.ReplaceTurns(ctx, "s", []ctxd.Turn{{Query: "r1", Answer: "b1"}, {Query: "r2", Answer: "b2", Verbatim: true}}, T0)
		if err != nil || epoch != 2 || !slices.Equal(seqs, []int64{3, 4}) {
			t.Fatalf("replace turns: epoch %d, seqs %v, %v; want 2, [3 4]", epoch, seqs, err)
		}
		got := session(t, s, "s")
		if got.Epoch != 2 || got.Summary != "" || !slices.Equal(queries(got.Turns), []string{"r1", "r2"}) || !slices.Equal(got.Seqs, seqs) ||
			!got.Turns[1].Verbatim || got.Count != 4 {
			t.Errorf("after replacing: %+v", got)
		}
		epoch, seqs, err = s.ReplaceTurns(ctx, "new", nil, T0)
		if err != nil || epoch != 1 || len(seqs) != 0 {
			t.Errorf("replacing a new session's turns with none: epoch %d, seqs %v, %v", epoch, seqs, err)
		}
	}},
	{"session count is the list's length", func(t *testing.T, st ctxd.Store) {
		// A session counts from its first write (a turn, a claim, a new
		// epoch) until it is deleted, as Sessions lists it.
		s, ok := st.(ctxd.SessionCounter)
		if !ok {
			t.Skipf("%T counts no sessions", st)
		}
		ctx := t.Context()
		check := func(step string, want int) {
			t.Helper()
			n, err := s.SessionCount(ctx)
			list, lerr := st.Sessions(ctx)
			if err != nil || lerr != nil || n != want || len(list) != want {
				t.Errorf("%s: count %d (%v), list %d (%v); want %d", step, n, err, len(list), lerr, want)
			}
		}
		check("empty", 0)
		session(t, st, "unseen")
		check("after reading an unknown session", 0)
		appendTurn(t, st, "a", ctxd.Turn{Query: "q", Answer: "a"})
		appendTurn(t, st, "a", ctxd.Turn{Query: "q2", Answer: "a"})
		check("one session, two turns", 1)
		if _, err := st.ClaimSession(ctx, "b", "dev", "dev", T0); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.ReplaceTurns(ctx, "c", nil, T0); err != nil {
			t.Fatal(err)
		}
		check("claimed and replaced", 3)
		if err := st.DeleteSession(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		check("after a delete", 2)
	}},
	{"sessions in byte order", func(t *testing.T, s ctxd.Store) {
		// As SQLite's BINARY collation orders them, whatever a database's
		// collation would.
		ids := []string{"b", "B", "a", "b-2", "é", "A", "a b", "Z"}
		for _, id := range ids {
			appendTurn(t, s, id, ctxd.Turn{Query: "q", Answer: "a"})
		}
		list, err := s.Sessions(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		got := []string{}
		for _, si := range list {
			got = append(got, si.ID)
		}
		if want := []string{"A", "B", "Z", "a", "a b", "b", "b-2", "é"}; !slices.Equal(got, want) {
			t.Errorf("sessions %q, want %q", got, want)
		}
	}},
	{"claim", func(t *testing.T, s ctxd.Store) {
		ctx := t.Context()
		claim := func(id, sigil, want string) {
			t.Helper()
			owner, err := s.ClaimSession(ctx, id, sigil, "default", T0)
			if err != nil || owner != want {
				t.Errorf("%s claiming %q: owner %q, %v; want %q", sigil, id, owner, err, want)
			}
			if got := session(t, s, id).Owner; got != want {
				t.Errorf("%q's owner after %s's claim: %q, want %q", id, sigil, got, want)
			}
		}
		claim("new", "dev", "dev")
		claim("new", "ops", "dev")
		claim("new", "default", "dev")
		if list, err := s.Sessions(ctx); err != nil || len(list) != 1 || list[0].Sigil != "dev" {
			t.Errorf("sessions = %+v, %v; want new, of dev", list, err)
		}
		// A session recorded before owners, with turns, goes to the
		// default sigil only.
		appendTurn(t, s, "legacy", ctxd.Turn{Query: "q", Answer: "a"})
		claim("legacy", "ops", "")
		claim("legacy", "default", "default")
		claim("legacy", "ops", "default")
		// One with no turns yet goes to whoever claims it first.
		if _, err := s.NewEpoch(ctx, "empty", nil, 0, "", T0); err != nil {
			t.Fatal(err)
		}
		claim("empty", "ops", "ops")
	}},
	{"traces survive session deletion", func(t *testing.T, st ctxd.Store) {
		// The karma record is never deleted with a session.
		s, ok := st.(ctxd.KarmaStore)
		if !ok {
			t.Skipf("%T keeps no karma", st)
		}
		ctx := t.Context()
		appendTurn(t, st, "sess", ctxd.Turn{Query: "q", Answer: "a"})
		id := Record(t, s, "dev", "q", T0)
		Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: T0})
		if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 1, At: T0}); err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteSession(ctx, "sess"); err != nil {
			t.Fatal(err)
		}
		if tr, evs, err := s.Trace(ctx, id); err != nil || tr.Session != "sess" || len(evs) != 1 {
			t.Errorf("after deleting the session: %+v, %v, %v", tr, evs, err)
		}
		if snaps, err := s.KarmaSnapshots(ctx, "sess"); err != nil || len(snaps) != 1 {
			t.Errorf("snapshots after deleting the session: %+v, %v", snaps, err)
		}
	}},
}

// stale counts the excerpts turns hold.
func stale(turns []ctxd.Turn) int {
	n := 0
	for _, t := range turns {
		n += len(t.Excerpts)
	}
	return n
}
