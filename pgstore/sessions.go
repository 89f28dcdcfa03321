package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctxd/ctxd"
)

// Session loads a session; a session never seen before is empty, not an error.
func (s *Store) Session(ctx context.Context, id string) (ctxd.Session, error) {
	var sess ctxd.Session
	err := s.read(ctx, fmt.Sprintf("session %q", id), func(tx pgx.Tx) error {
		sess = ctxd.Session{ID: id}
		var bare int64
		err := tx.QueryRow(ctx, "SELECT epoch, summary, bare_through, sigil FROM sessions WHERE id = $1", toDB(id)).
			Scan(&sess.Epoch, dec(&sess.Summary), &bare, dec(&sess.Owner))
		if isNoRows(err) {
			return nil
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx,
			"SELECT seq, query, excerpts, answer, verbatim, bare FROM turns WHERE session_id = $1 AND epoch = $2 ORDER BY seq", toDB(id), sess.Epoch)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var t ctxd.Turn
			var excerpts string
			var seq int64
			var bareTurn bool
			if err := rows.Scan(&seq, dec(&t.Query), dec(&excerpts), dec(&t.Answer), &t.Verbatim, &bareTurn); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(excerpts), &t.Excerpts); err != nil {
				return fmt.Errorf("turn %d excerpts: %w", seq, err)
			}
			if seq <= bare || bareTurn {
				t.Excerpts = nil
			}
			sess.Turns = append(sess.Turns, t)
			sess.Seqs = append(sess.Seqs, seq)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT COUNT(*) FROM turns WHERE session_id = $1", toDB(id)).Scan(&sess.Count)
	})
	if err != nil {
		return ctxd.Session{ID: id}, err
	}
	return sess, nil
}

// lockTries bounds how often lockSession creates a session that another
// transaction deletes before it is locked.
const lockTries = 10

// lockSession creates session id unless it exists and locks its row until
// tx ends, so that the writes of one session go one at a time, whichever
// daemon makes them: a write that waited for the lock reads, in its next
// statement, what the one before it committed. It returns the session's
// epoch and owner.
func lockSession(ctx context.Context, tx pgx.Tx, id string, now time.Time) (epoch int, owner string, err error) {
	for range lockTries {
		if _, err := tx.Exec(ctx,
			"INSERT INTO sessions (id, created_unix) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING", toDB(id), now.Unix()); err != nil {
			return 0, "", err
		}
		err := tx.QueryRow(ctx, "SELECT epoch, sigil FROM sessions WHERE id = $1 FOR UPDATE", toDB(id)).Scan(&epoch, dec(&owner))
		if !isNoRows(err) {
			return epoch, owner, err
		}
		// Deleted since the insert, by a transaction that held it: again.
	}
	return 0, "", fmt.Errorf("session %q was deleted %d times while it was being written", id, lockTries)
}

// NewEpoch starts the session's next epoch with the turns keep (sequence
// numbers), the current epoch's turns after since, and summary. Turns left
// out stay in the database under their old epoch: compaction drops them
// from the prompt, never from the record.
func (s *Store) NewEpoch(ctx context.Context, id string, keep []int64, since int64, summary string, now time.Time) (int, error) {
	var epoch int
	err := s.write(ctx, "new epoch", func(tx pgx.Tx) error {
		current, _, err := lockSession(ctx, tx, id, now)
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx,
			"UPDATE sessions SET epoch = epoch + 1, summary = $1 WHERE id = $2 RETURNING epoch", toDB(summary), toDB(id)).Scan(&epoch); err != nil {
			return err
		}
		if keep == nil {
			keep = []int64{}
		}
		_, err = tx.Exec(ctx, "UPDATE turns SET epoch = $1 WHERE session_id = $2 AND (seq = ANY($3) OR epoch = $4 AND seq > $5)", epoch, toDB(id), keep, current, since)
		return err
	})
	return epoch, err
}

// DropExcerpts starts the session's next epoch with the same turns and
// summary, the turns seqs (nil: all so far) without their excerpts from
// then on.
func (s *Store) DropExcerpts(ctx context.Context, id string, seqs []int64, now time.Time) (int, error) {
	var epoch int
	err := s.write(ctx, "drop excerpts", func(tx pgx.Tx) error {
		if _, _, err := lockSession(ctx, tx, id, now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "UPDATE sessions SET epoch = epoch + 1 WHERE id = $1 RETURNING epoch", toDB(id)).Scan(&epoch); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE turns SET epoch = $1 WHERE session_id = $2 AND epoch = $3", epoch, toDB(id), epoch-1); err != nil {
			return err
		}
		if seqs == nil {
			_, err := tx.Exec(ctx, "UPDATE turns SET bare = true WHERE session_id = $1 AND epoch = $2", toDB(id), epoch)
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE turns SET bare = true WHERE session_id = $1 AND seq = ANY($2)", toDB(id), seqs)
		return err
	})
	return epoch, err
}

// ReplaceTurns starts the session's next epoch, with no summary, holding
// turns as new records (their summary column says they came from the
// client); the turns before stay in the record under their epochs.
func (s *Store) ReplaceTurns(ctx context.Context, id string, turns []ctxd.Turn, now time.Time) (int, []int64, error) {
	var epoch int
	var seqs []int64
	err := s.write(ctx, "replace turns", func(tx pgx.Tx) error {
		if _, _, err := lockSession(ctx, tx, id, now); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx,
			"UPDATE sessions SET epoch = epoch + 1, summary = '' WHERE id = $1 RETURNING epoch", toDB(id)).Scan(&epoch); err != nil {
			return err
		}
		seqs = make([]int64, 0, len(turns))
		for _, t := range turns {
			seq, err := insertTurn(ctx, tx, id, epoch, t, []byte(`{"from_client":true}`), now)
			if err != nil {
				return err
			}
			seqs = append(seqs, seq)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	return epoch, seqs, nil
}

// AppendTurn adds a finished turn to the session's current epoch, creating
// the session if needed. summary is stored as given (JSON).
func (s *Store) AppendTurn(ctx context.Context, id string, t ctxd.Turn, summary []byte, now time.Time) (int64, error) {
	var seq int64
	err := s.write(ctx, "append turn", func(tx pgx.Tx) error {
		epoch, _, err := lockSession(ctx, tx, id, now)
		if err != nil {
			return err
		}
		seq, err = insertTurn(ctx, tx, id, epoch, t, summary, now)
		return err
	})
	if err != nil {
		return 0, err
	}
	return seq, nil
}

// insertTurn adds t to session id (locked) in epoch, after its last turn.
func insertTurn(ctx context.Context, tx pgx.Tx, id string, epoch int, t ctxd.Turn, summary []byte, now time.Time) (int64, error) {
	excerpts := []byte("[]")
	if t.Excerpts != nil {
		var err error
		if excerpts, err = json.Marshal(t.Excerpts); err != nil {
			return 0, err
		}
	}
	if len(summary) == 0 {
		summary = []byte("{}")
	}
	var seq int64
	err := tx.QueryRow(ctx, `
		INSERT INTO turns (session_id, seq, epoch, query, excerpts, answer, verbatim, summary, created_unix)
		SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8
		FROM turns WHERE session_id = $1 RETURNING seq`,
		toDB(id), epoch, toDB(t.Query), toDB(string(excerpts)), toDB(t.Answer), t.Verbatim, toDB(string(summary)), now.Unix()).Scan(&seq)
	return seq, err
}

// DeleteSession removes a session and its turns. Deleting an unknown
// session is not an error. The session's traces and karma snapshots stay:
// the karma record is never deleted.
func (s *Store) DeleteSession(ctx context.Context, id string) error {
	return s.write(ctx, fmt.Sprintf("delete session %q", id), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM sessions WHERE id = $1", toDB(id))
		return err
	})
}

// Sessions lists all sessions by id (in byte order, as SQLite's BINARY
// collation sorts them, whatever the database's collation).
func (s *Store) Sessions(ctx context.Context) ([]ctxd.SessionInfo, error) {
	var out []ctxd.SessionInfo
	err := s.read(ctx, "sessions", func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `
			SELECT s.id, s.epoch, s.sigil, COUNT(t.seq) FROM sessions s
			LEFT JOIN turns t ON t.session_id = s.id GROUP BY s.id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var si ctxd.SessionInfo
			if err := rows.Scan(dec(&si.ID), &si.Epoch, dec(&si.Sigil), &si.Turns); err != nil {
				return err
			}
			out = append(out, si)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b ctxd.SessionInfo) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// SessionCount is how many sessions Sessions would list, without listing
// them.
func (s *Store) SessionCount(ctx context.Context) (int, error) {
	var n int
	err := s.read(ctx, "sessions", func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "SELECT COUNT(*) FROM sessions").Scan(&n)
	})
	return n, err
}

// SessionOwner is the sigil that owns session id, "" for a session never
// begun (or recorded before owners were): one row read, for a daemon that
// needs the owner and not the turns.
func (s *Store) SessionOwner(ctx context.Context, id string) (string, error) {
	var owner string
	err := s.read(ctx, fmt.Sprintf("session %q", id), func(tx pgx.Tx) error {
		owner = ""
		err := tx.QueryRow(ctx, "SELECT sigil FROM sessions WHERE id = $1", toDB(id)).Scan(dec(&owner))
		if isNoRows(err) {
			return nil
		}
		return err
	})
	return owner, err
}

// ClaimSession makes sigil the owner of session id (creating it) unless
// it has one, and returns its owner then; a session recorded before
// owners, with turns, goes to legacy only. Claims of one session go one
// at a time (lockSession): of two sigils claiming a new session at once,
// one owns it and both are told which.
func (s *Store) ClaimSession(ctx context.Context, id, sigil, legacy string, now time.Time) (string, error) {
	var owner string
	err := s.write(ctx, fmt.Sprintf("claim session %q", id), func(tx pgx.Tx) error {
		var err error
		if _, owner, err = lockSession(ctx, tx, id, now); err != nil || owner != "" {
			return err
		}
		if sigil != legacy {
			var turns bool
			if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM turns WHERE session_id = $1)", toDB(id)).Scan(&turns); err != nil || turns {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "UPDATE sessions SET sigil = $1 WHERE id = $2", toDB(sigil), toDB(id)); err != nil {
			return err
		}
		owner = sigil
		return nil
	})
	if err != nil {
		return "", err
	}
	return owner, nil
}
