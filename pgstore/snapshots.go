package pgstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// snapshotLock is the class of the advisory locks that make one session's
// snapshot saves go one at a time (the second key is the session's hash).
const snapshotLock int32 = 0x6b61726d // "karm"

// KarmaSnapshot is the session's latest snapshot (of the highest epoch).
func (s *Store) KarmaSnapshot(ctx context.Context, session string) (ctxd.KarmaSnapshot, bool, error) {
	snaps, err := s.snapshots(ctx, "ORDER BY karma_epoch DESC LIMIT 1", session)
	if err != nil || len(snaps) == 0 {
		return ctxd.KarmaSnapshot{}, false, err
	}
	return snaps[0], true, nil
}

// KarmaSnapshots lists a session's snapshots by epoch.
func (s *Store) KarmaSnapshots(ctx context.Context, session string) ([]ctxd.KarmaSnapshot, error) {
	return s.snapshots(ctx, "ORDER BY karma_epoch", session)
}

// SaveKarmaSnapshot stores a new snapshot. Its epoch must be after the
// session's latest (KindConflict otherwise): snapshots are never replaced.
func (s *Store) SaveKarmaSnapshot(ctx context.Context, snap ctxd.KarmaSnapshot) error {
	if err := karma.CheckSnapshot(snap); err != nil {
		return err
	}
	entries, err := json.Marshal(snap.Entries)
	if err != nil {
		return fmt.Errorf("pgstore: karma snapshot: %w", err)
	}
	return s.write(ctx, "karma snapshot", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext($2))", snapshotLock, toDB(snap.Session)); err != nil {
			return err
		}
		var latest int
		if err := tx.QueryRow(ctx,
			"SELECT COALESCE(MAX(karma_epoch), 0) FROM karma_snapshots WHERE session = $1", toDB(snap.Session)).Scan(&latest); err != nil {
			return err
		}
		if snap.KarmaEpoch <= latest {
			return ctxd.Errorf(ctxd.KindConflict, "karma snapshot of session %q: epoch %d is not after the saved epoch %d", snap.Session, snap.KarmaEpoch, latest)
		}
		_, err := tx.Exec(ctx, `
			INSERT INTO karma_snapshots (session, karma_epoch, sigil, session_epoch, reason, entries, at_unix_nano)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			toDB(snap.Session), snap.KarmaEpoch, toDB(snap.Sigil), snap.SessionEpoch, toDB(snap.Reason), toDB(string(entries)), snap.At.UnixNano())
		return err
	})
}

// snapshots are the session's snapshots in the order tail says.
func (s *Store) snapshots(ctx context.Context, tail, session string) ([]ctxd.KarmaSnapshot, error) {
	var out []ctxd.KarmaSnapshot
	err := s.read(ctx, "karma snapshots", func(tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx,
			"SELECT session, karma_epoch, sigil, session_epoch, reason, entries, at_unix_nano FROM karma_snapshots WHERE session = $1 "+tail,
			toDB(session))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var snap ctxd.KarmaSnapshot
			var entries string
			var at int64
			if err := rows.Scan(dec(&snap.Session), &snap.KarmaEpoch, dec(&snap.Sigil), &snap.SessionEpoch, dec(&snap.Reason), dec(&entries), &at); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(entries), &snap.Entries); err != nil {
				return fmt.Errorf("karma snapshot %d of session %q: %w", snap.KarmaEpoch, snap.Session, err)
			}
			snap.At = fromNano(at)
			out = append(out, snap)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
