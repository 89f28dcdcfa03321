package sqlite

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

func TestSessionsSurviveReopen(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "state", "ctxd.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := s.Session(ctx, "new")
	if err != nil || len(empty.Turns) != 0 {
		t.Fatalf("unknown session: %+v %v", empty, err)
	}
	now := time.Unix(1700000000, 0)
	turns := []ctxd.Turn{
		{Query: "q1", Answer: "a1"},
		{Query: "q2", Answer: "a\x00 with NUL and ### marks", Excerpts: []ctxd.Excerpt{{Path: "a.go", Text: "x"}}},
	}
	for _, tr := range turns {
		if _, err := s.AppendTurn(ctx, "s1", tr, []byte(`{"prompt_tokens":3}`), now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AppendTurn(ctx, "s2", ctxd.Turn{Query: "other", Answer: ""}, nil, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Session(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Turns) != 2 || got.Turns[1].Answer != turns[1].Answer || got.Turns[1].Excerpts[0].Path != "a.go" {
		t.Fatalf("reopened session = %+v", got)
	}
	list, err := s.Sessions(ctx)
	if err != nil || len(list) != 2 || list[0].Turns != 2 || list[1].Turns != 1 {
		t.Fatalf("sessions = %+v %v", list, err)
	}
	if err := s.DeleteSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Session(ctx, "s1"); len(got.Turns) != 0 {
		t.Errorf("deleted session still has %d turns", len(got.Turns))
	}
}

func TestNewEpochKeepsTheRecord(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "ctxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Unix(1700000000, 0)
	for i := range 5 {
		tr := ctxd.Turn{Query: string(rune('a' + i)), Answer: "x", Verbatim: i == 0}
		if _, err := s.AppendTurn(ctx, "s", tr, nil, now); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := s.Session(ctx, "s")
	epoch, err := s.NewEpoch(ctx, "s", []int64{before.Seqs[0], before.Seqs[4]}, "they talked", now)
	if err != nil || epoch != 1 {
		t.Fatalf("epoch %d, %v", epoch, err)
	}
	if _, err := s.AppendTurn(ctx, "s", ctxd.Turn{Query: "f", Answer: "y"}, nil, now); err != nil {
		t.Fatal(err)
	}
	after, err := s.Session(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	var qs string
	for _, tr := range after.Turns {
		qs += tr.Query
	}
	if after.Epoch != 1 || after.Summary != "they talked" || qs != "aef" {
		t.Errorf("after compaction: epoch %d summary %q turns %q", after.Epoch, after.Summary, qs)
	}
	var total int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM turns WHERE session_id = 's'").Scan(&total); err != nil || total != 6 {
		t.Errorf("the record holds %d turns, want all 6 (%v)", total, err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "ctxd.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, "PRAGMA user_version = 99"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); err == nil {
		t.Fatal("opened a database from a newer ctxd")
	}
}
