package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/pgtest"
	"github.com/ctxd/ctxd/internal/storetest"
	"github.com/ctxd/ctxd/sqlite"
)

// column is one column of a table as the schema test compares it.
type column struct {
	typ     string // as declared (SQLite) or information_schema's data_type (PostgreSQL)
	notNull bool
	pk      bool
}

// compatible are the PostgreSQL types that hold what each SQLite type
// holds: SQLite's INTEGER is 64 bits (bigint), and its 0/1 flags are
// booleans here.
var compatible = map[string][]string{
	"INTEGER": {"bigint", "boolean"},
	"TEXT":    {"text"},
}

// sqliteOnly are SQLite's tables that PostgreSQL does without, and why.
var sqliteOnly = map[string]string{
	"sqlite_sequence":    "AUTOINCREMENT's counters: identity columns keep their own",
	"trace_text_data":    "a shadow table of the FTS5 table trace_text (its index): a GIN index here",
	"trace_text_idx":     "a shadow table of the FTS5 table trace_text (its index): a GIN index here",
	"trace_text_docsize": "a shadow table of the FTS5 table trace_text (its documents' sizes)",
	"trace_text_config":  "a shadow table of the FTS5 table trace_text (its settings)",
}

// pgOnly are PostgreSQL's tables that SQLite does without, and why.
var pgOnly = map[string]string{
	"ctxd_schema": "the migrations applied: SQLite keeps the version in PRAGMA user_version",
}

// ftsTable is SQLite's FTS5 table: its columns (query, answer, note) are
// indexed, not stored (it is contentless); PostgreSQL's table of the same
// name holds each document's words (a tsvector) under SQLite's rowid.
const ftsTable = "trace_text"

// TestSchemaMatchesSQLite holds the two stores to one schema: it opens
// both fresh and checks that they are at the same version and that every
// table and column of each is in the other, with a compatible type, the
// same nullability and the same primary key, except the tables and
// columns named above (each of which must exist where it is said to).
func TestSchemaMatchesSQLite(t *testing.T) {
	lite, liteVersion := sqliteSchema(t)
	pg := openTest(t)
	pgTables, pgVersion := postgresSchema(t, pg)
	if liteVersion != pgVersion || pgVersion != schemaVersion {
		t.Errorf("schema versions: SQLite %d, PostgreSQL %d; want both %d", liteVersion, pgVersion, schemaVersion)
	}
	for name, why := range sqliteOnly {
		if _, ok := lite[name]; !ok {
			t.Errorf("SQLite has no table %s (listed as SQLite's alone: %s)", name, why)
		}
		delete(lite, name)
	}
	for name, why := range pgOnly {
		if _, ok := pgTables[name]; !ok {
			t.Errorf("PostgreSQL has no table %s (listed as PostgreSQL's alone: %s)", name, why)
		}
		delete(pgTables, name)
	}
	if got := slices.Sorted(maps.Keys(lite[ftsTable])); !slices.Equal(got, []string{"answer", "note", "query"}) {
		t.Errorf("SQLite's %s indexes %v; want answer, note, query", ftsTable, got)
	}
	want := map[string]column{"rowid": {"bigint", true, true}, "words": {"tsvector", true, false}}
	if got := pgTables[ftsTable]; !maps.Equal(got, want) {
		t.Errorf("PostgreSQL's %s = %+v; want %+v", ftsTable, got, want)
	}
	delete(lite, ftsTable)
	delete(pgTables, ftsTable)

	for _, table := range slices.Sorted(maps.Keys(lite)) {
		cols, ok := pgTables[table]
		if !ok {
			t.Errorf("table %s: in SQLite's schema, not in PostgreSQL's", table)
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(lite[table])) {
			lc := lite[table][name]
			pc, ok := cols[name]
			switch {
			case !ok:
				t.Errorf("column %s.%s: in SQLite's schema, not in PostgreSQL's", table, name)
			case !slices.Contains(compatible[lc.typ], pc.typ):
				t.Errorf("column %s.%s: %s in SQLite, %s in PostgreSQL; want one of %v", table, name, lc.typ, pc.typ, compatible[lc.typ])
			case lc.pk != pc.pk:
				t.Errorf("column %s.%s: in the primary key in SQLite %v, in PostgreSQL %v", table, name, lc.pk, pc.pk)
			case !lc.pk && lc.notNull != pc.notNull: // SQLite lets a key column be NULL unless told; none is
				t.Errorf("column %s.%s: NOT NULL in SQLite %v, in PostgreSQL %v", table, name, lc.notNull, pc.notNull)
			}
		}
		for name := range cols {
			if _, ok := lite[table][name]; !ok {
				t.Errorf("column %s.%s: in PostgreSQL's schema, not in SQLite's", table, name)
			}
		}
	}
	for table := range pgTables {
		if _, ok := lite[table]; !ok {
			t.Errorf("table %s: in PostgreSQL's schema, not in SQLite's", table)
		}
	}
}

// sqliteSchema opens a fresh SQLite store and reads its tables' columns
// and its version.
func sqliteSchema(t *testing.T) (map[string]map[string]column, int) {
	t.Helper()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "ctxd.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	names := queryStrings(t, db, "SELECT name FROM sqlite_master WHERE type = 'table'")
	out := map[string]map[string]column{}
	for _, table := range names {
		rows, err := db.QueryContext(ctx, fmt.Sprintf("PRAGMA table_info(%q)", table))
		if err != nil {
			t.Fatal(err)
		}
		cols := map[string]column{}
		for rows.Next() {
			var cid, notNull, pk int
			var name, typ string
			var dflt sql.NullString
			if err := rows.Scan(&cid, &name, &typ, &notNull, &dflt, &pk); err != nil {
				t.Fatal(err)
			}
			cols[name] = column{typ: strings.ToUpper(typ), notNull: notNull == 1, pk: pk > 0}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		out[table] = cols
	}
	return out, version
}

func queryStrings(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// postgresSchema reads the tables' columns and the version of s's
// database.
func postgresSchema(t *testing.T, s *Store) (map[string]map[string]column, int) {
	t.Helper()
	ctx := t.Context()
	var version int
	if err := s.pool.QueryRow(ctx, "SELECT MAX(version) FROM ctxd_schema").Scan(&version); err != nil {
		t.Fatal(err)
	}
	pks := map[string]bool{}
	rows, err := s.pool.Query(ctx, `
		SELECT kcu.table_name, kcu.column_name FROM information_schema.table_constraints tc
		JOIN information_schema.key_column_usage kcu USING (constraint_schema, constraint_name)
		WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var table, col string
		if err := rows.Scan(&table, &col); err != nil {
			t.Fatal(err)
		}
		pks[table+"."+col] = true
	}
	rows.Close()
	out := map[string]map[string]column{}
	rows, err = s.pool.Query(ctx, `
		SELECT c.table_name, c.column_name, c.data_type, c.is_nullable FROM information_schema.columns c
		JOIN information_schema.tables t USING (table_schema, table_name)
		WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var table, name, typ, nullable string
		if err := rows.Scan(&table, &name, &typ, &nullable); err != nil {
			t.Fatal(err)
		}
		if out[table] == nil {
			out[table] = map[string]column{}
		}
		out[table][name] = column{typ: typ, notNull: nullable == "NO", pk: pks[table+"."+name]}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out, version
}

func TestRefusesNewerSchema(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openURL(t, url, OpenOptions{})
	if _, err := s.pool.Exec(t.Context(), "INSERT INTO ctxd_schema (version, applied_unix) VALUES (99, 0)"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(t.Context(), url)
	if err == nil || !strings.Contains(err.Error(), "database schema version 99 is newer than this ctxd understands (7)") {
		t.Fatalf("opening a database from a newer ctxd: %v", err)
	}
}

// TestConcurrentOpensMigrateOnce: daemons starting at once on a fresh
// database migrate it once, in turn, and all open it.
func TestConcurrentOpensMigrateOnce(t *testing.T) {
	url := pgtest.NewDatabase(t)
	const daemons = 4
	stores := make([]*Store, daemons)
	errs := make([]error, daemons)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range daemons {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = Open(t.Context(), url)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("daemon %d: %v", i, err)
			continue
		}
		defer stores[i].Close()
	}
	if t.Failed() {
		return
	}
	rows, err := stores[0].pool.Query(t.Context(), "SELECT version FROM ctxd_schema ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var versions []int
	for rows.Next() {
		var v int
		rows.Scan(&v)
		versions = append(versions, v)
	}
	if !slices.Equal(versions, []int{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("versions recorded: %v; want each of 1 to 7 once", versions)
	}
}

// TestMigrationFromVersion3KeepsSessions: a database of version 3 with a
// session in it is brought to the current version, the session kept and
// unowned (the default sigil claims it).
func TestMigrationFromVersion3KeepsSessions(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	old := openAt(t, url, 3)
	if _, err := old.pool.Exec(ctx, `INSERT INTO sessions (id, created_unix) VALUES ('sess', 0);
		INSERT INTO turns (session_id, seq, epoch, query, answer, created_unix) VALUES ('sess', 1, 0, 'q', 'a', 0)`); err != nil {
		t.Fatal(err)
	}
	s := openURL(t, url, OpenOptions{})
	if sess, err := s.Session(ctx, "sess"); err != nil || len(sess.Turns) != 1 || sess.Owner != "" {
		t.Errorf("session after the migration: %+v, %v", sess, err)
	}
	if owner, err := s.ClaimSession(ctx, "sess", "other", "default", storetest.T0); err != nil || owner != "" {
		t.Errorf("another sigil claiming a legacy session: %q %v", owner, err)
	}
	if owner, err := s.ClaimSession(ctx, "sess", "default", "default", storetest.T0); err != nil || owner != "default" {
		t.Errorf("the default sigil claiming a legacy session: %q %v", owner, err)
	}
	storetest.Record(t, s, "dev", "q", storetest.T0)
}

// openAt is a store on url migrated to version v only.
func openAt(t *testing.T, url string, v int) *Store {
	t.Helper()
	s := openURL(t, url, OpenOptions{})
	if _, err := s.pool.Exec(t.Context(), "DROP SCHEMA public CASCADE; CREATE SCHEMA public"); err != nil {
		t.Fatal(err)
	}
	for range v {
		if _, err := s.migrateOne(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestKarmaRecordIsAppendOnly: the triggers refuse what SQLite's refuse,
// with their messages, and TRUNCATE too.
func TestKarmaRecordIsAppendOnly(t *testing.T) {
	ctx := t.Context()
	s := openTest(t)
	id := storetest.Record(t, s, "dev", "q", storetest.T0)
	storetest.Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, At: storetest.T0})
	if err := s.SaveKarmaSnapshot(ctx, ctxd.KarmaSnapshot{Session: "sess", KarmaEpoch: 1, At: storetest.T0}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ stmt, message string }{
		{"UPDATE traces SET answer = 'else'", "a trace's text never changes"},
		{"UPDATE traces SET created_unix_nano = 0", "a trace's text never changes"},
		{"UPDATE traces SET binding = ''", "a trace's text never changes"},
		{"DELETE FROM traces", "traces are never deleted"},
		{"TRUNCATE traces CASCADE", "traces are never deleted"},
		{"UPDATE karma_events SET note = 'else'", "karma events are append-only"},
		{"DELETE FROM karma_events", "karma events are append-only"},
		{"TRUNCATE karma_events", "karma events are append-only"},
		{"UPDATE karma_snapshots SET reason = 'else'", "karma snapshots are kept as saved"},
		{"DELETE FROM karma_snapshots", "karma snapshots are kept as saved"},
		{"TRUNCATE karma_snapshots", "karma snapshots are kept as saved"},
	} {
		if _, err := s.pool.Exec(ctx, c.stmt); err == nil || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: %v; want it refused: %s", c.stmt, err, c.message)
		}
	}
	if tr, evs, err := s.Trace(ctx, id); err != nil || tr.Answer != "answer to q" || len(evs) != 1 {
		t.Errorf("after the refused writes: %+v, %v, %v", tr, evs, err)
	}
}

// TestTraceBindings: a trace recorded before bindings holds for its codex
// alone; a trace's binding is fixed like its text.
func TestTraceBindings(t *testing.T) {
	ctx := t.Context()
	s := openTest(t)
	if _, err := s.pool.Exec(ctx, `INSERT INTO traces (session, sigil, query, answer, model, fingerprint, codex, created_unix_nano)
		VALUES ('s', 'dev', 'q', 'a', 'm', 'fp', 'v1', 1)`); err != nil {
		t.Fatal(err)
	}
	legacy, _, err := s.Trace(ctx, 1)
	if err != nil || legacy.Binding.Codex != "v1" || legacy.Binding.Whole || len(legacy.Binding.Files) != 0 {
		t.Fatalf("legacy trace %+v, %v", legacy, err)
	}
}

// TestEligibleUsesItsIndex: the partial index's predicate is the query's,
// so the planner can use it (seqscans off: the table is small).
func TestEligibleUsesItsIndex(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "RESET enable_seqscan")
	rows, err := conn.Query(ctx, "EXPLAIN SELECT "+traceColumns+` FROM traces
		WHERE sigil = $1 AND superseded_by = 0 AND status <> 'rejected' AND (status = 'verified' OR pinned)
		ORDER BY id`, "dev")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line string
		rows.Scan(&line)
		plan = append(plan, line)
	}
	if p := strings.Join(plan, "\n"); !strings.Contains(p, "traces_eligible") || strings.Contains(p, "Sort") {
		t.Errorf("plan:\n%s", p)
	}
}
