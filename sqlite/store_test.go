package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/internal/storetest"
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
	if n, err := s.SessionCount(ctx); err != nil || n != 2 {
		t.Errorf("session count = %d %v, want 2", n, err)
	}
	if err := s.DeleteSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Session(ctx, "s1"); len(got.Turns) != 0 {
		t.Errorf("deleted session still has %d turns", len(got.Turns))
	}
	if n, err := s.SessionCount(ctx); err != nil || n != 1 {
		t.Errorf("session count after a delete = %d %v, want 1", n, err)
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

// TestReadsProceedBesideAStuckWrite holds the writer connection in a
// transaction that has written (SQLite's write lock held, nothing
// committed) and never ends it until the reads are done, queues a
// ReplaceTurns behind it, and reads everything a session, status or the
// karma list reads: each read must finish within its deadline and see the
// last committed state, and the queued write must still be waiting. Then
// the held transaction commits and the write goes through. On one pool the
// reads would wait for the writer and fail at their deadline.
func TestReadsProceedBesideAStuckWrite(t *testing.T) {
	s := openTemp(t)
	ctx := t.Context()
	if _, err := s.AppendTurn(ctx, "s1", ctxd.Turn{Query: "q", Answer: "a"}, nil, storetest.T0); err != nil {
		t.Fatal(err)
	}
	id := storetest.Record(t, s, "dev", "q", storetest.T0)
	storetest.Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: storetest.T0})
	if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "s1", KarmaEpoch: 1, Sigil: "dev", At: storetest.T0}); err != nil {
		t.Fatal(err)
	}

	held, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { held.Rollback() }) // before openTemp's Close
	if _, err := held.ExecContext(ctx, "INSERT INTO sessions (id, created_unix) VALUES ('uncommitted', 0)"); err != nil {
		t.Fatal(err)
	}
	replaced := make(chan error, 1)
	go func() {
		_, _, err := s.ReplaceTurns(ctx, "s1", []ctxd.Turn{{Query: "r", Answer: "b"}}, storetest.T0)
		replaced <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); s.db.Stats().WaitCount == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("ReplaceTurns did not wait for the held writer within 10s")
		}
	}

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if sess, err := s.Session(rctx, "s1"); err != nil || len(sess.Turns) != 1 || sess.Turns[0].Query != "q" || sess.Epoch != 0 {
		t.Errorf("Session beside the stuck write: %+v, %v", sess, err)
	}
	if list, err := s.Sessions(rctx); err != nil || len(list) != 1 || list[0].ID != "s1" {
		t.Errorf("Sessions beside the stuck write: %+v, %v", list, err)
	}
	if n, err := s.SessionCount(rctx); err != nil || n != 1 {
		t.Errorf("SessionCount beside the stuck write: %d, %v", n, err)
	}
	if ts, err := s.Traces(rctx, ctxd.TraceFilter{Sigil: "dev"}); err != nil || len(ts) != 1 || ts[0].Status != ctxd.TraceVerified {
		t.Errorf("Traces beside the stuck write: %+v, %v", ts, err)
	}
	if ts, err := s.Traces(rctx, ctxd.TraceFilter{Sigil: "dev", At: storetest.T0}); err != nil || len(ts) != 1 {
		t.Errorf("Traces as of a time beside the stuck write: %+v, %v", ts, err)
	}
	if tr, evs, err := s.Trace(rctx, id); err != nil || tr.ID != id || len(evs) != 1 {
		t.Errorf("Trace beside the stuck write: %+v, %+v, %v", tr, evs, err)
	}
	if el, err := s.Eligible(rctx, "dev"); err != nil || len(el) != 1 {
		t.Errorf("Eligible beside the stuck write: %+v, %v", el, err)
	}
	if snap, ok, err := s.KarmaSnapshot(rctx, "s1"); err != nil || !ok || snap.KarmaEpoch != 1 {
		t.Errorf("KarmaSnapshot beside the stuck write: %+v, %v, %v", snap, ok, err)
	}
	if snaps, err := s.KarmaSnapshots(rctx, "s1"); err != nil || len(snaps) != 1 {
		t.Errorf("KarmaSnapshots beside the stuck write: %+v, %v", snaps, err)
	}
	select {
	case err := <-replaced:
		t.Fatalf("ReplaceTurns returned (%v) while the writer was held", err)
	default:
	}

	if err := held.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-replaced:
		if err != nil {
			t.Fatalf("ReplaceTurns once the writer was free: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReplaceTurns did not finish within 10s of the writer's release")
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if n, err := s.SessionCount(actx); err != nil || n != 2 {
		t.Errorf("SessionCount after the writes: %d, %v; want 2", n, err)
	}
	if sess, err := s.Session(actx, "s1"); err != nil || len(sess.Turns) != 1 || sess.Turns[0].Query != "r" || sess.Epoch != 1 {
		t.Errorf("Session after ReplaceTurns: %+v, %v", sess, err)
	}
}

// TestPoolsKeepTheDurability: the readers run with the writer's durability
// settings (the last connection to close checkpoints, and may be a
// reader) and cannot write; the writer is as it always was.
func TestPoolsKeepTheDurability(t *testing.T) {
	s := openTemp(t)
	ctx := t.Context()
	for _, p := range []struct {
		name      string
		db        *sql.DB
		queryOnly int
	}{{"writer", s.db, 0}, {"reader", s.rdb, 1}} {
		var journal string
		var sync, busy, fk, qo int
		for q, dst := range map[string]any{
			"PRAGMA journal_mode": &journal, "PRAGMA synchronous": &sync, "PRAGMA busy_timeout": &busy,
			"PRAGMA foreign_keys": &fk, "PRAGMA query_only": &qo,
		} {
			if err := p.db.QueryRowContext(ctx, q).Scan(dst); err != nil {
				t.Fatalf("%s: %s: %v", p.name, q, err)
			}
		}
		if journal != "wal" || sync != 2 || busy != 5000 || fk != 1 || qo != p.queryOnly {
			t.Errorf("%s: journal_mode %s, synchronous %d, busy_timeout %d, foreign_keys %d, query_only %d; want wal, 2 (FULL), 5000, 1, %d",
				p.name, journal, sync, busy, fk, qo, p.queryOnly)
		}
	}
	if _, err := s.rdb.ExecContext(ctx, "INSERT INTO sessions (id, created_unix) VALUES ('x', 0)"); err == nil {
		t.Error("a reader wrote")
	}
	if s.db.Stats().MaxOpenConnections != 1 {
		t.Errorf("the writer pool holds %d connections, want 1", s.db.Stats().MaxOpenConnections)
	}
}

// TestSessionContract runs the session contract on the store and on the
// fake the daemon's tests use in its place.
func TestSessionContract(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		storetest.Sessions(t, func(tb testing.TB) ctxd.Store { return openTemp(tb) })
	})
	t.Run("fake", func(t *testing.T) {
		storetest.Sessions(t, func(testing.TB) ctxd.Store { return fake.NewStore() })
	})
}
