package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// karmaSchema is migration 4. Traces keep their text forever; their
// derived columns (status … supersedes) are the fold of their events
// (karma.Fold), rewritten in the transaction that appends each event.
// text_doc is the trace_text document that holds the trace's text and
// current note: 0 for the one written with the trace (rowid −id), else
// the id of the judging event that wrote it (rowid = that id). Every
// document, like every event and snapshot, is only ever appended: the
// triggers refuse the rest.
const karmaSchema = `
CREATE TABLE traces (
	id                    INTEGER PRIMARY KEY AUTOINCREMENT,
	session               TEXT    NOT NULL,
	sigil                 TEXT    NOT NULL,
	query                 TEXT    NOT NULL,
	answer                TEXT    NOT NULL,
	model                 TEXT    NOT NULL,
	fingerprint           TEXT    NOT NULL,
	codex                 TEXT    NOT NULL,
	created_unix_nano     INTEGER NOT NULL,
	status                TEXT    NOT NULL DEFAULT 'recorded' CHECK (status IN ('recorded', 'verified', 'rejected')),
	pinned                INTEGER NOT NULL DEFAULT 0,
	note                  TEXT    NOT NULL DEFAULT '',
	judged_unix_nano      INTEGER,
	valid_until_unix_nano INTEGER,
	superseded_by         INTEGER NOT NULL DEFAULT 0,
	supersedes            INTEGER NOT NULL DEFAULT 0,
	text_doc              INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX traces_by_sigil ON traces (sigil, created_unix_nano);
CREATE INDEX traces_by_session ON traces (session, created_unix_nano);
CREATE INDEX traces_by_time ON traces (created_unix_nano);
CREATE INDEX traces_eligible ON traces (sigil, id)
	WHERE superseded_by = 0 AND status != 'rejected' AND (status = 'verified' OR pinned = 1);
CREATE TRIGGER traces_text_fixed BEFORE UPDATE OF id, session, sigil, query, answer, model, fingerprint, codex, created_unix_nano ON traces
	BEGIN SELECT RAISE(ABORT, 'a trace''s text never changes'); END;
CREATE TRIGGER traces_kept BEFORE DELETE ON traces
	BEGIN SELECT RAISE(ABORT, 'traces are never deleted'); END;

CREATE TABLE karma_events (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	trace        INTEGER NOT NULL REFERENCES traces (id),
	action       TEXT    NOT NULL,
	sigil        TEXT    NOT NULL,
	note         TEXT    NOT NULL,
	other        INTEGER NOT NULL,
	at_unix_nano INTEGER NOT NULL
);
CREATE INDEX karma_events_by_trace ON karma_events (trace, id);
CREATE INDEX karma_events_by_other ON karma_events (other, id) WHERE other != 0;
CREATE TRIGGER karma_events_fixed BEFORE UPDATE ON karma_events
	BEGIN SELECT RAISE(ABORT, 'karma events are append-only'); END;
CREATE TRIGGER karma_events_kept BEFORE DELETE ON karma_events
	BEGIN SELECT RAISE(ABORT, 'karma events are append-only'); END;

CREATE TABLE karma_snapshots (
	session       TEXT    NOT NULL,
	karma_epoch   INTEGER NOT NULL,
	sigil         TEXT    NOT NULL,
	session_epoch INTEGER NOT NULL,
	reason        TEXT    NOT NULL,
	entries       TEXT    NOT NULL,
	at_unix_nano  INTEGER NOT NULL,
	PRIMARY KEY (session, karma_epoch)
) WITHOUT ROWID;
CREATE TRIGGER karma_snapshots_fixed BEFORE UPDATE ON karma_snapshots
	BEGIN SELECT RAISE(ABORT, 'karma snapshots are kept as saved'); END;
CREATE TRIGGER karma_snapshots_kept BEFORE DELETE ON karma_snapshots
	BEGIN SELECT RAISE(ABORT, 'karma snapshots are kept as saved'); END;

CREATE VIRTUAL TABLE trace_text USING fts5(query, answer, note, content='', tokenize='unicode61 remove_diacritics 0');
`

// karmaBindings is migration 6: the code each trace holds for. binding is
// what it was answered from (JSON ctxd.TraceBinding; ” for traces
// recorded before), fixed like the trace's text; rebound is derived (the
// latest verification's binding, ” for none); an event's binding is the
// code a verification was made against.
const karmaBindings = `
ALTER TABLE traces ADD COLUMN binding TEXT NOT NULL DEFAULT '';
ALTER TABLE traces ADD COLUMN rebound TEXT NOT NULL DEFAULT '';
ALTER TABLE karma_events ADD COLUMN binding TEXT NOT NULL DEFAULT '';
DROP TRIGGER traces_text_fixed;
CREATE TRIGGER traces_text_fixed BEFORE UPDATE OF id, session, sigil, query, answer, model, fingerprint, codex, created_unix_nano, binding ON traces
	BEGIN SELECT RAISE(ABORT, 'a trace''s text never changes'); END;
`

// traceColumns are the columns scanTrace reads, in its order.
const traceColumns = `id, session, sigil, query, answer, model, fingerprint, codex, created_unix_nano,
	status, pinned, note, judged_unix_nano, valid_until_unix_nano, superseded_by, supersedes, binding, rebound`

// RecordTrace stores a new trace, recorded and unpinned, and returns its
// id. t's ID and derived fields are ignored; its Sigil and CreatedAt are
// required.
func (s *Store) RecordTrace(ctx context.Context, t ctxd.Trace) (int64, error) {
	switch {
	case t.Sigil == "":
		return 0, ctxd.Errorf(ctxd.KindInvalid, "record trace: no sigil")
	case t.CreatedAt.IsZero():
		return 0, ctxd.Errorf(ctxd.KindInvalid, "record trace: no time")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: record trace: %w", s.fault(err))
	}
	defer tx.Rollback()
	var id int64
	if err := tx.QueryRowContext(ctx, `
		INSERT INTO traces (session, sigil, query, answer, model, fingerprint, codex, created_unix_nano, binding)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		t.Session, t.Sigil, t.Query, t.Answer, t.Model, t.Fingerprint, t.Codex, t.CreatedAt.UnixNano(), karma.BindingJSON(&t.Binding)).Scan(&id); err != nil {
		return 0, fmt.Errorf("sqlite: record trace: %w", s.fault(err))
	}
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO trace_text (rowid, query, answer, note) VALUES (?, ?, ?, '')", -id, t.Query, t.Answer); err != nil {
		return 0, fmt.Errorf("sqlite: record trace: %w", s.fault(err))
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: record trace: %w", s.fault(err))
	}
	return id, nil
}

// KarmaEvent appends ev and updates its trace (and, for a supersede, the
// replacing trace) in the same transaction; the rules are karma.Judge's.
// An unknown trace is KindNotFound.
func (s *Store) KarmaEvent(ctx context.Context, ev ctxd.KarmaEvent) (ctxd.Trace, error) {
	if ev.At.IsZero() {
		return ctxd.Trace{}, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d: no time", ev.Trace)
	}
	ev.At = fromNano(ev.At.UnixNano())
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return ctxd.Trace{}, fmt.Errorf("sqlite: karma event: %w", s.fault(err))
	}
	defer tx.Rollback()
	t, err := traceTx(ctx, tx, ev.Trace)
	if err != nil {
		return ctxd.Trace{}, err
	}
	var other *ctxd.Trace
	if ev.Action == ctxd.KarmaSupersede && ev.Other != 0 && ev.Other != ev.Trace {
		o, err := traceTx(ctx, tx, ev.Other)
		switch {
		case err == nil:
			other = &o
		case ctxd.KindOf(err) != ctxd.KindNotFound:
			return ctxd.Trace{}, err
		}
	}
	nt, no, err := karma.Judge(t, other, ev)
	if err != nil {
		return ctxd.Trace{}, err
	}
	var eid int64
	if err := tx.QueryRowContext(ctx, `
		INSERT INTO karma_events (trace, action, sigil, note, other, at_unix_nano, binding)
		VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id`,
		ev.Trace, ev.Action, ev.Sigil, ev.Note, ev.Other, ev.At.UnixNano(), karma.BindingJSON(ev.Binding)).Scan(&eid); err != nil {
		return ctxd.Trace{}, fmt.Errorf("sqlite: karma event: %w", s.fault(err))
	}
	if err := writeDerived(ctx, tx, nt); err != nil {
		return ctxd.Trace{}, err
	}
	if ev.Action == ctxd.KarmaSupersede {
		if err := writeDerived(ctx, tx, no); err != nil {
			return ctxd.Trace{}, err
		}
	}
	if karma.Judges(ev.Action) {
		if _, err := tx.ExecContext(ctx,
			"INSERT INTO trace_text (rowid, query, answer, note) VALUES (?, ?, ?, ?)", eid, t.Query, t.Answer, ev.Note); err != nil {
			return ctxd.Trace{}, fmt.Errorf("sqlite: karma event: %w", s.fault(err))
		}
		if _, err := tx.ExecContext(ctx, "UPDATE traces SET text_doc = ? WHERE id = ?", eid, t.ID); err != nil {
			return ctxd.Trace{}, fmt.Errorf("sqlite: karma event: %w", s.fault(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return ctxd.Trace{}, fmt.Errorf("sqlite: karma event: %w", s.fault(err))
	}
	return nt, nil
}

func writeDerived(ctx context.Context, tx *sql.Tx, t ctxd.Trace) error {
	if _, err := tx.ExecContext(ctx, `
		UPDATE traces SET status = ?, pinned = ?, note = ?, judged_unix_nano = ?, valid_until_unix_nano = ?,
			superseded_by = ?, supersedes = ?, rebound = ? WHERE id = ?`,
		t.Status, t.Pinned, t.Note, nullNano(t.JudgedAt), nullNano(t.ValidUntil), t.SupersededBy, t.Supersedes, karma.BindingJSON(t.Rebound), t.ID); err != nil {
		return fmt.Errorf("sqlite: trace %d: %w", t.ID, err)
	}
	return nil
}

// Trace returns one trace and its events, oldest first: those on it and
// the supersede events that name it as the replacing trace, so that
// karma.Fold of the trace with them is the trace.
func (s *Store) Trace(ctx context.Context, id int64) (ctxd.Trace, []ctxd.KarmaEvent, error) {
	tx, err := s.readTx(ctx)
	if err != nil {
		return ctxd.Trace{}, nil, fmt.Errorf("sqlite: trace %d: %w", id, s.fault(err))
	}
	defer tx.Rollback()
	t, err := traceTx(ctx, tx, id)
	if err != nil {
		return ctxd.Trace{}, nil, err
	}
	evs, err := eventsTx(ctx, tx, []int64{id}, time.Time{})
	if err != nil {
		return ctxd.Trace{}, nil, err
	}
	out := make([]ctxd.KarmaEvent, len(evs))
	for i, e := range evs {
		out[i] = e.KarmaEvent
	}
	return t, out, nil
}

// Traces lists traces as f says, newest first (by CreatedAt, then id).
// Text matches traces whose query, answer and note (as of f.At) hold
// every word of it (runs of letters and digits, any case); a Text with no
// words matches nothing.
func (s *Store) Traces(ctx context.Context, f ctxd.TraceFilter) ([]ctxd.Trace, error) {
	limit, err := karma.FilterLimit(f)
	if err != nil {
		return nil, err
	}
	var match string
	if f.Text != "" {
		if match = textMatch(f.Text); match == "" {
			return nil, nil
		}
	}
	tx, err := s.readTx(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqlite: traces: %w", s.fault(err))
	}
	defer tx.Rollback()
	if f.At.IsZero() {
		return tracesNowTx(ctx, tx, f, match, limit)
	}
	return tracesAtTx(ctx, tx, f, match, limit)
}

// tracesNowTx lists the traces as they stand: the derived columns filter.
func tracesNowTx(ctx context.Context, tx *sql.Tx, f ctxd.TraceFilter, match string, limit int) ([]ctxd.Trace, error) {
	var where []string
	var args []any
	if f.Sigil != "" {
		where, args = append(where, "sigil = ?"), append(args, f.Sigil)
	}
	if f.Session != "" {
		where, args = append(where, "session = ?"), append(args, f.Session)
	}
	if f.Status != "" {
		where, args = append(where, "status = ?"), append(args, f.Status)
	}
	if f.Pinned {
		where = append(where, "pinned = 1")
	}
	if match != "" {
		where = append(where, "(CASE text_doc WHEN 0 THEN -id ELSE text_doc END) IN (SELECT rowid FROM trace_text WHERE trace_text MATCH ?)")
		args = append(args, match)
	}
	q := "SELECT " + traceColumns + " FROM traces"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_unix_nano DESC, id DESC LIMIT ?"
	return queryTraces(ctx, tx, q, append(args, limit)...)
}

// tracesAtTx lists the traces as they stood at f.At (karma.TracesAt).
func tracesAtTx(ctx context.Context, tx *sql.Tx, f ctxd.TraceFilter, match string, limit int) ([]ctxd.Trace, error) {
	where, args := []string{"created_unix_nano <= ?"}, []any{f.At.UnixNano()}
	if f.Sigil != "" {
		where, args = append(where, "sigil = ?"), append(args, f.Sigil)
	}
	if f.Session != "" {
		where, args = append(where, "session = ?"), append(args, f.Session)
	}
	return karma.TracesAt(f, match != "", limit, karma.Pager{
		Page: func(after bool, afterCreated, afterID int64) ([]ctxd.Trace, error) {
			pw, pargs := where, args
			if after {
				pw = append(pw[:len(pw):len(pw)], "(created_unix_nano < ? OR created_unix_nano = ? AND id < ?)")
				pargs = append(pargs[:len(pargs):len(pargs)], afterCreated, afterCreated, afterID)
			}
			return queryTraces(ctx, tx, "SELECT "+traceColumns+" FROM traces WHERE "+strings.Join(pw, " AND ")+
				" ORDER BY created_unix_nano DESC, id DESC LIMIT ?", append(pargs, karma.PageSize)...)
		},
		Events: func(ids []int64) ([]karma.StoredEvent, error) { return eventsTx(ctx, tx, ids, f.At) },
		Matching: func(docs []int64) (map[int64]bool, error) {
			list, _ := json.Marshal(docs)
			rows, err := tx.QueryContext(ctx,
				"SELECT rowid FROM trace_text WHERE trace_text MATCH ? AND rowid IN (SELECT value FROM json_each(?))", match, string(list))
			if err != nil {
				return nil, fmt.Errorf("sqlite: traces: %w", err)
			}
			defer rows.Close()
			out := map[int64]bool{}
			for rows.Next() {
				var d int64
				if err := rows.Scan(&d); err != nil {
					return nil, fmt.Errorf("sqlite: traces: %w", err)
				}
				out[d] = true
			}
			return out, rows.Err()
		},
	})
}

// textMatch is the FTS5 query for every word of text ("" when it has
// none). Quoting each word keeps FTS5 syntax in text from having effect.
func textMatch(text string) string {
	words := strings.FieldsFunc(text, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	for i, w := range words {
		words[i] = `"` + strings.ToLower(w) + `"`
	}
	return strings.Join(words, " ")
}

// Eligible is every trace of sigil that may enter the karma block now
// (karma.Eligible), by id.
func (s *Store) Eligible(ctx context.Context, sigil string) ([]ctxd.Trace, error) {
	ts, err := queryTraces(ctx, s.rdb, "SELECT "+traceColumns+` FROM traces
		WHERE sigil = ? AND superseded_by = 0 AND status != 'rejected' AND (status = 'verified' OR pinned = 1)
		ORDER BY id`, sigil)
	return ts, s.fault(err)
}

// KarmaSnapshot is the session's latest snapshot (of the highest epoch).
func (s *Store) KarmaSnapshot(ctx context.Context, session string) (ctxd.KarmaSnapshot, bool, error) {
	snaps, err := s.snapshots(ctx, "WHERE session = ? ORDER BY karma_epoch DESC LIMIT 1", session)
	if err != nil || len(snaps) == 0 {
		return ctxd.KarmaSnapshot{}, false, err
	}
	return snaps[0], true, nil
}

// KarmaSnapshots lists a session's snapshots by epoch.
func (s *Store) KarmaSnapshots(ctx context.Context, session string) ([]ctxd.KarmaSnapshot, error) {
	return s.snapshots(ctx, "WHERE session = ? ORDER BY karma_epoch", session)
}

// SaveKarmaSnapshot stores a new snapshot. Its epoch must be after the
// session's latest (KindConflict otherwise): snapshots are never replaced.
func (s *Store) SaveKarmaSnapshot(ctx context.Context, snap ctxd.KarmaSnapshot) error {
	if err := karma.CheckSnapshot(snap); err != nil {
		return err
	}
	entries, err := json.Marshal(snap.Entries)
	if err != nil {
		return fmt.Errorf("sqlite: karma snapshot: %w", s.fault(err))
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite: karma snapshot: %w", s.fault(err))
	}
	defer tx.Rollback()
	var latest int
	if err := tx.QueryRowContext(ctx,
		"SELECT COALESCE(MAX(karma_epoch), 0) FROM karma_snapshots WHERE session = ?", snap.Session).Scan(&latest); err != nil {
		return fmt.Errorf("sqlite: karma snapshot: %w", s.fault(err))
	}
	if snap.KarmaEpoch <= latest {
		return ctxd.Errorf(ctxd.KindConflict, "karma snapshot of session %q: epoch %d is not after the saved epoch %d", snap.Session, snap.KarmaEpoch, latest)
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO karma_snapshots (session, karma_epoch, sigil, session_epoch, reason, entries, at_unix_nano)
		VALUES (?, ?, ?, ?, ?, ?, ?)`,
		snap.Session, snap.KarmaEpoch, snap.Sigil, snap.SessionEpoch, snap.Reason, string(entries), snap.At.UnixNano()); err != nil {
		return fmt.Errorf("sqlite: karma snapshot: %w", s.fault(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: karma snapshot: %w", s.fault(err))
	}
	return nil
}

func (s *Store) snapshots(ctx context.Context, tail string, args ...any) ([]ctxd.KarmaSnapshot, error) {
	rows, err := s.rdb.QueryContext(ctx,
		"SELECT session, karma_epoch, sigil, session_epoch, reason, entries, at_unix_nano FROM karma_snapshots "+tail, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: karma snapshots: %w", s.fault(err))
	}
	defer rows.Close()
	var out []ctxd.KarmaSnapshot
	for rows.Next() {
		var snap ctxd.KarmaSnapshot
		var entries string
		var at int64
		if err := rows.Scan(&snap.Session, &snap.KarmaEpoch, &snap.Sigil, &snap.SessionEpoch, &snap.Reason, &entries, &at); err != nil {
			return nil, fmt.Errorf("sqlite: karma snapshots: %w", s.fault(err))
		}
		if err := json.Unmarshal([]byte(entries), &snap.Entries); err != nil {
			return nil, fmt.Errorf("sqlite: karma snapshot %d of session %q: %w", snap.KarmaEpoch, snap.Session, s.fault(err))
		}
		snap.At = fromNano(at)
		out = append(out, snap)
	}
	return out, rows.Err()
}

// eventsTx returns the events of the traces ids (on them, or supersede
// events naming them as the replacing trace) up to at (zero: all), in the
// order they were stored.
func eventsTx(ctx context.Context, tx *sql.Tx, ids []int64, at time.Time) ([]karma.StoredEvent, error) {
	list, _ := json.Marshal(ids)
	until := int64(1<<63 - 1)
	if !at.IsZero() {
		until = at.UnixNano()
	}
	rows, err := tx.QueryContext(ctx, `
		SELECT id, trace, action, sigil, note, other, at_unix_nano, binding FROM karma_events
		WHERE (trace IN (SELECT value FROM json_each(?1)) OR other IN (SELECT value FROM json_each(?1)) AND action = 'supersede')
			AND at_unix_nano <= ?2
		ORDER BY id`, string(list), until)
	if err != nil {
		return nil, fmt.Errorf("sqlite: karma events: %w", err)
	}
	defer rows.Close()
	var out []karma.StoredEvent
	for rows.Next() {
		var e karma.StoredEvent
		var at int64
		var binding string
		if err := rows.Scan(&e.ID, &e.Trace, &e.Action, &e.Sigil, &e.Note, &e.Other, &at, &binding); err != nil {
			return nil, fmt.Errorf("sqlite: karma events: %w", err)
		}
		e.At = fromNano(at)
		if e.Binding, err = karma.ParseBinding(binding); err != nil {
			return nil, fmt.Errorf("sqlite: karma event %d: %w", e.ID, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// querier is *sql.DB or *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func queryTraces(ctx context.Context, q querier, query string, args ...any) ([]ctxd.Trace, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: traces: %w", err)
	}
	defer rows.Close()
	var out []ctxd.Trace
	for rows.Next() {
		t, err := scanTrace(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: traces: %w", err)
	}
	return out, nil
}

// traceTx loads one trace; an unknown id is KindNotFound.
func traceTx(ctx context.Context, tx *sql.Tx, id int64) (ctxd.Trace, error) {
	t, err := scanTrace(tx.QueryRowContext(ctx, "SELECT "+traceColumns+" FROM traces WHERE id = ?", id))
	if errors.Is(err, sql.ErrNoRows) {
		return t, ctxd.Errorf(ctxd.KindNotFound, "no trace %d", id)
	}
	return t, err
}

func scanTrace(r interface{ Scan(...any) error }) (ctxd.Trace, error) {
	var t ctxd.Trace
	var created int64
	var judged, until sql.NullInt64
	var binding, rebound string
	if err := r.Scan(&t.ID, &t.Session, &t.Sigil, &t.Query, &t.Answer, &t.Model, &t.Fingerprint, &t.Codex, &created,
		&t.Status, &t.Pinned, &t.Note, &judged, &until, &t.SupersededBy, &t.Supersedes, &binding, &rebound); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return t, err
		}
		return t, fmt.Errorf("sqlite: trace: %w", err)
	}
	b, err := karma.ParseBinding(binding)
	if err != nil {
		return t, fmt.Errorf("sqlite: trace %d: %w", t.ID, err)
	}
	if b != nil {
		t.Binding = *b
	} else {
		t.Binding = ctxd.TraceBinding{Codex: t.Codex} // recorded before bindings: its codex alone
	}
	if t.Rebound, err = karma.ParseBinding(rebound); err != nil {
		return t, fmt.Errorf("sqlite: trace %d: %w", t.ID, err)
	}
	t.CreatedAt = fromNano(created)
	if judged.Valid {
		at := fromNano(judged.Int64)
		t.JudgedAt = &at
	}
	if until.Valid {
		at := fromNano(until.Int64)
		t.ValidUntil = &at
	}
	return t, nil
}

// fromNano is the time of a stored Unix nanosecond count, in UTC.
func fromNano(n int64) time.Time { return time.Unix(0, n).UTC() }

func nullNano(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixNano()
}
