package sqlite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/internal/storetest"
	"github.com/ctxd/ctxd/karma"
)

func openTemp(tb testing.TB) *Store {
	tb.Helper()
	s, err := Open(tb.Context(), filepath.Join(tb.TempDir(), "ctxd.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// TestKarmaContract runs the karma contract on the store and on the fake
// the daemon's tests use in its place.
func TestKarmaContract(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		storetest.Karma(t, func(tb testing.TB) ctxd.KarmaStore { return openTemp(tb) })
	})
	t.Run("fake", func(t *testing.T) {
		storetest.Karma(t, func(testing.TB) ctxd.KarmaStore { return fake.NewKarma() })
	})
}

func TestKarmaRecordIsAppendOnly(t *testing.T) {
	ctx := t.Context()
	s := openTemp(t)
	id := storetest.Record(t, s, "dev", "q", storetest.T0)
	storetest.Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: storetest.T0})
	if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 1, At: storetest.T0}); err != nil {
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
		"ALTER TABLE sessions DROP COLUMN sigil", "ALTER TABLE turns DROP COLUMN bare", "PRAGMA user_version = 3",
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	if _, err := s.AppendTurn(ctx, "sess", ctxd.Turn{Query: "q", Answer: "a"}, nil, storetest.T0); err != nil {
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
	if owner, err := s.ClaimSession(ctx, "sess", "other", "default", storetest.T0); err != nil || owner != "" {
		t.Errorf("another sigil claiming a legacy session: %q %v", owner, err)
	}
	if owner, err := s.ClaimSession(ctx, "sess", "default", "default", storetest.T0); err != nil || owner != "default" {
		t.Errorf("the default sigil claiming a legacy session: %q %v", owner, err)
	}
	if owner, err := s.ClaimSession(ctx, "new", "other", "default", storetest.T0); err != nil || owner != "other" {
		t.Errorf("a new session: %q %v", owner, err)
	}
	storetest.Record(t, s, "dev", "q", storetest.T0)
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
	id, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: "q", Answer: "a", CreatedAt: storetest.T0,
		Binding: ctxd.TraceBinding{Codex: "v1", Files: []ctxd.TraceFile{{Path: "a.go", SHA256: strings.Repeat("a", 64)}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, "UPDATE traces SET binding = '' WHERE id = ?", id); err == nil || !strings.Contains(err.Error(), "never changes") {
		t.Errorf("rewriting a trace's binding: %v; want it refused", err)
	}
}
