package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/ctxd/ctxd"
)

// schemaVersion is the user_version the migrations below bring a database to.
const schemaVersion = 7

var migrations = []string{
	`CREATE TABLE sessions (
		id           TEXT PRIMARY KEY,
		created_unix INTEGER NOT NULL,
		epoch        INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE turns (
		session_id   TEXT    NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
		seq          INTEGER NOT NULL,
		epoch        INTEGER NOT NULL,
		query        TEXT    NOT NULL,
		excerpts     TEXT    NOT NULL DEFAULT '[]',
		answer       TEXT    NOT NULL,
		verbatim     INTEGER NOT NULL DEFAULT 0,
		summary      TEXT    NOT NULL DEFAULT '{}',
		created_unix INTEGER NOT NULL,
		PRIMARY KEY (session_id, seq)
	);`,
	// 2: epochs may start with a condensed summary of the turns before them.
	`ALTER TABLE sessions ADD COLUMN summary TEXT NOT NULL DEFAULT '';`,
	// 3: turns up to bare_through render without their codex excerpts
	// (written before migration 7; read still, for what it marked).
	`ALTER TABLE sessions ADD COLUMN bare_through INTEGER NOT NULL DEFAULT 0;`,
	// 4: karma: traces, their events and the karma each session was shown.
	karmaSchema,
	// 5: a session belongs to the sigil that began it ('' for sessions
	// recorded before: the daemon's default sigil claims them).
	`ALTER TABLE sessions ADD COLUMN sigil TEXT NOT NULL DEFAULT '';`,
	// 6: the code a trace holds for (karma tied to code versions).
	karmaBindings,
	// 7: a turn renders without its codex excerpts once bare (the newest
	// turns' excerpts give way first, keeping the prefix before them).
	`ALTER TABLE turns ADD COLUMN bare INTEGER NOT NULL DEFAULT 0;`,
}

// Store is the session store and the karma store. It is safe for
// concurrent use.
//
// It holds two pools on the one database file: db, the single writer
// connection every write goes through (SQLite takes one writer at a time
// anyway), and rdb, the readers. In WAL mode a reader sees the last
// committed state and never waits for a writer, so a write that is slow
// or stuck (on the disk, or holding its transaction) delays other writes
// only: sessions, status and the watchdog still read.
type Store struct {
	db   *sql.DB // the writer: one connection
	rdb  *sql.DB // the readers: query_only connections
	path string  // the database file, named in errors
}

// readers is how many read connections the store opens at most.
const readers = 4

var (
	_ ctxd.Store          = (*Store)(nil)
	_ ctxd.SessionCounter = (*Store)(nil)
	_ ctxd.KarmaStore     = (*Store)(nil)
)

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	// The database is created private (SQLite gives its -wal and -shm
	// files the database's mode), and an existing one is made private.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	f.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	// synchronous(FULL): a commit is on disk when it returns, so an
	// acknowledged write (a verified trace, a turn) survives a crash of
	// the machine, not only of the daemon.
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_pragma=synchronous(FULL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serializes anyway
	// The files are closed when the store idles (fault.go says why).
	db.SetConnMaxIdleTime(idleClose)
	s := &Store{db: db, path: path}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: %s: %w", path, err)
	}
	// The readers come after the migrations, which made the file WAL (a
	// persistent mode the readers find). query_only: nothing written by
	// mistake through a reader. synchronous(FULL) too, since the last
	// connection to close checkpoints the log into the database, and a
	// reader may be that one.
	rdsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(FULL)&_pragma=query_only(1)"
	rdb, err := sql.Open("sqlite", rdsn)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	rdb.SetMaxOpenConns(readers)
	rdb.SetMaxIdleConns(readers)
	rdb.SetConnMaxIdleTime(idleClose)
	s.rdb = rdb
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return err
	}
	if v > schemaVersion {
		return fmt.Errorf("database schema version %d is newer than this ctxd understands (%d)", v, schemaVersion)
	}
	for ; v < schemaVersion; v++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to version %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the database: the readers, then the writer.
func (s *Store) Close() error { return errors.Join(s.rdb.Close(), s.db.Close()) }

// readTx begins a read transaction on a reader: the reads in it see one
// committed state, whatever the writer does meanwhile.
func (s *Store) readTx(ctx context.Context) (*sql.Tx, error) {
	return s.rdb.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
}

// Session loads a session; a session never seen before is empty, not an error.
func (s *Store) Session(ctx context.Context, id string) (ctxd.Session, error) {
	sess := ctxd.Session{ID: id}
	tx, err := s.readTx(ctx)
	if err != nil {
		return sess, fmt.Errorf("sqlite: session %q: %w", id, s.fault(err))
	}
	defer tx.Rollback()
	var bare int64
	err = tx.QueryRowContext(ctx, "SELECT epoch, summary, bare_through, sigil FROM sessions WHERE id = ?", id).Scan(&sess.Epoch, &sess.Summary, &bare, &sess.Owner)
	if errors.Is(err, sql.ErrNoRows) {
		return sess, nil
	}
	if err != nil {
		return sess, fmt.Errorf("sqlite: session %q: %w", id, s.fault(err))
	}
	rows, err := tx.QueryContext(ctx,
		"SELECT seq, query, excerpts, answer, verbatim, bare FROM turns WHERE session_id = ? AND epoch = ? ORDER BY seq", id, sess.Epoch)
	if err != nil {
		return sess, fmt.Errorf("sqlite: session %q turns: %w", id, s.fault(err))
	}
	defer rows.Close()
	for rows.Next() {
		var t ctxd.Turn
		var excerpts string
		var seq int64
		var bareTurn bool
		if err := rows.Scan(&seq, &t.Query, &excerpts, &t.Answer, &t.Verbatim, &bareTurn); err != nil {
			return sess, fmt.Errorf("sqlite: session %q turn: %w", id, s.fault(err))
		}
		if err := json.Unmarshal([]byte(excerpts), &t.Excerpts); err != nil {
			return sess, fmt.Errorf("sqlite: session %q turn excerpts: %w", id, s.fault(err))
		}
		if seq <= bare || bareTurn {
			t.Excerpts = nil
		}
		sess.Turns = append(sess.Turns, t)
		sess.Seqs = append(sess.Seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return sess, fmt.Errorf("sqlite: session %q turns: %w", id, s.fault(err))
	}
	rows.Close()
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM turns WHERE session_id = ?", id).Scan(&sess.Count); err != nil {
		return sess, fmt.Errorf("sqlite: session %q: %w", id, s.fault(err))
	}
	return sess, nil
}

// NewEpoch starts the session's next epoch with the turns keep (sequence
// numbers), the current epoch's turns after since, and summary. Turns left
// out stay in the database under their old epoch: compaction drops them
// from the prompt, never from the record.
func (s *Store) NewEpoch(ctx context.Context, id string, keep []int64, since int64, summary string, now time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO sessions (id, created_unix) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", id, now.Unix()); err != nil {
		return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
	}
	var epoch int
	if err := tx.QueryRowContext(ctx,
		"UPDATE sessions SET epoch = epoch + 1, summary = ? WHERE id = ? RETURNING epoch", summary, id).Scan(&epoch); err != nil {
		return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
	}
	if _, err := tx.ExecContext(ctx, "UPDATE turns SET epoch = ? WHERE session_id = ? AND epoch = ? AND seq > ?", epoch, id, epoch-1, since); err != nil {
		return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
	}
	for _, seq := range keep {
		if _, err := tx.ExecContext(ctx, "UPDATE turns SET epoch = ? WHERE session_id = ? AND seq = ?", epoch, id, seq); err != nil {
			return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: new epoch: %w", s.fault(err))
	}
	return epoch, nil
}

// DropExcerpts starts the session's next epoch with the same turns and
// summary, the turns seqs (nil: all so far) without their excerpts from
// then on.
func (s *Store) DropExcerpts(ctx context.Context, id string, seqs []int64, now time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO sessions (id, created_unix) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", id, now.Unix()); err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	var epoch int
	if err := tx.QueryRowContext(ctx, "UPDATE sessions SET epoch = epoch + 1 WHERE id = ? RETURNING epoch", id).Scan(&epoch); err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	if _, err := tx.ExecContext(ctx, "UPDATE turns SET epoch = ? WHERE session_id = ? AND epoch = ?", epoch, id, epoch-1); err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	bare, args := "UPDATE turns SET bare = 1 WHERE session_id = ? AND epoch = ?", []any{id, epoch}
	if seqs != nil {
		list, _ := json.Marshal(seqs)
		bare, args = "UPDATE turns SET bare = 1 WHERE session_id = ? AND seq IN (SELECT value FROM json_each(?))", []any{id, string(list)}
	}
	if _, err := tx.ExecContext(ctx, bare, args...); err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: drop excerpts: %w", s.fault(err))
	}
	return epoch, nil
}

// ReplaceTurns starts the session's next epoch, with no summary, holding
// turns as new records (their summary column says they came from the
// client); the turns before stay in the record under their epochs.
func (s *Store) ReplaceTurns(ctx context.Context, id string, turns []ctxd.Turn, now time.Time) (int, []int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("sqlite: replace turns: %w", s.fault(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO sessions (id, created_unix) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", id, now.Unix()); err != nil {
		return 0, nil, fmt.Errorf("sqlite: replace turns: %w", s.fault(err))
	}
	var epoch int
	if err := tx.QueryRowContext(ctx,
		"UPDATE sessions SET epoch = epoch + 1, summary = '' WHERE id = ? RETURNING epoch", id).Scan(&epoch); err != nil {
		return 0, nil, fmt.Errorf("sqlite: replace turns: %w", s.fault(err))
	}
	seqs := make([]int64, 0, len(turns))
	for _, t := range turns {
		excerpts, err := json.Marshal(t.Excerpts)
		if err != nil || t.Excerpts == nil {
			excerpts = []byte("[]")
		}
		var seq int64
		if err := tx.QueryRowContext(ctx, `
			INSERT INTO turns (session_id, seq, epoch, query, excerpts, answer, verbatim, summary, created_unix)
			SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ?, ?, '{"from_client":true}', ?
			FROM turns WHERE session_id = ? RETURNING seq`,
			id, epoch, t.Query, string(excerpts), t.Answer, t.Verbatim, now.Unix(), id).Scan(&seq); err != nil {
			return 0, nil, fmt.Errorf("sqlite: replace turns: %w", s.fault(err))
		}
		seqs = append(seqs, seq)
	}
	if err := tx.Commit(); err != nil {
		return 0, nil, fmt.Errorf("sqlite: replace turns: %w", s.fault(err))
	}
	return epoch, seqs, nil
}

// AppendTurn adds a finished turn to the session's current epoch, creating
// the session if needed. summary is stored as given (JSON).
func (s *Store) AppendTurn(ctx context.Context, id string, t ctxd.Turn, summary []byte, now time.Time) (int64, error) {
	excerpts, err := json.Marshal(t.Excerpts)
	if err != nil {
		return 0, fmt.Errorf("sqlite: append turn: %w", s.fault(err))
	}
	if t.Excerpts == nil {
		excerpts = []byte("[]")
	}
	if len(summary) == 0 {
		summary = []byte("{}")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: append turn: %w", s.fault(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO sessions (id, created_unix) VALUES (?, ?) ON CONFLICT (id) DO NOTHING", id, now.Unix()); err != nil {
		return 0, fmt.Errorf("sqlite: append turn: %w", s.fault(err))
	}
	var seq int64
	if err := tx.QueryRowContext(ctx, `
		INSERT INTO turns (session_id, seq, epoch, query, excerpts, answer, verbatim, summary, created_unix)
		SELECT ?, COALESCE(MAX(seq), 0) + 1, (SELECT epoch FROM sessions WHERE id = ?), ?, ?, ?, ?, ?, ?
		FROM turns WHERE session_id = ? RETURNING seq`,
		id, id, t.Query, string(excerpts), t.Answer, t.Verbatim, string(summary), now.Unix(), id).Scan(&seq); err != nil {
		return 0, fmt.Errorf("sqlite: append turn: %w", s.fault(err))
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: append turn: %w", s.fault(err))
	}
	return seq, nil
}

// DeleteSession removes a session and its turns. Deleting an unknown
// session is not an error. The session's traces and karma snapshots stay:
// the karma record is never deleted.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, "DELETE FROM sessions WHERE id = ?", id); err != nil {
		return fmt.Errorf("sqlite: delete session %q: %w", id, s.fault(err))
	}
	return nil
}

// Sessions lists all sessions by id.
func (s *Store) Sessions(ctx context.Context) ([]ctxd.SessionInfo, error) {
	rows, err := s.rdb.QueryContext(ctx, `
		SELECT s.id, s.epoch, s.sigil, COUNT(t.seq) FROM sessions s
		LEFT JOIN turns t ON t.session_id = s.id GROUP BY s.id ORDER BY s.id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: sessions: %w", s.fault(err))
	}
	defer rows.Close()
	var out []ctxd.SessionInfo
	for rows.Next() {
		var si ctxd.SessionInfo
		if err := rows.Scan(&si.ID, &si.Epoch, &si.Sigil, &si.Turns); err != nil {
			return nil, fmt.Errorf("sqlite: sessions: %w", s.fault(err))
		}
		out = append(out, si)
	}
	return out, rows.Err()
}

// SessionCount is how many sessions Sessions would list, without listing
// them.
func (s *Store) SessionCount(ctx context.Context) (int, error) {
	var n int
	if err := s.rdb.QueryRowContext(ctx, "SELECT COUNT(*) FROM sessions").Scan(&n); err != nil {
		return 0, fmt.Errorf("sqlite: sessions: %w", s.fault(err))
	}
	return n, nil
}

// ClaimSession makes sigil the owner of session id (creating it) unless
// it has one, and returns its owner then; a session recorded before
// owners, with turns, goes to legacy only.
func (s *Store) ClaimSession(ctx context.Context, id, sigil, legacy string, now time.Time) (string, error) {
	var owner string
	err := s.db.QueryRowContext(ctx, `
		INSERT INTO sessions (id, created_unix, sigil) VALUES (?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET sigil = CASE
			WHEN sigil = '' AND (? = ? OR NOT EXISTS (SELECT 1 FROM turns WHERE session_id = sessions.id)) THEN excluded.sigil
			ELSE sigil END
		RETURNING sigil`, id, now.Unix(), sigil, sigil, legacy).Scan(&owner)
	if err != nil {
		return "", fmt.Errorf("sqlite: claim session %q: %w", id, s.fault(err))
	}
	return owner, nil
}
