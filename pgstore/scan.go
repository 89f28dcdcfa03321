package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// eventsTx returns the events of the traces ids (on them, or supersede
// events naming them as the replacing trace) up to at (zero: all), in the
// order they were stored.
func eventsTx(ctx context.Context, tx pgx.Tx, ids []int64, at time.Time) ([]karma.StoredEvent, error) {
	until := int64(1<<63 - 1)
	if !at.IsZero() {
		until = at.UnixNano()
	}
	rows, err := tx.Query(ctx, `
		SELECT id, trace, action, sigil, note, other, at_unix_nano, binding FROM karma_events
		WHERE (trace = ANY($1) OR other = ANY($1) AND action = 'supersede') AND at_unix_nano <= $2
		ORDER BY id`, ids, until)
	if err != nil {
		return nil, fmt.Errorf("karma events: %w", err)
	}
	defer rows.Close()
	var out []karma.StoredEvent
	for rows.Next() {
		var e karma.StoredEvent
		var at int64
		var binding string
		if err := rows.Scan(&e.ID, &e.Trace, dec(&e.Action), dec(&e.Sigil), dec(&e.Note), &e.Other, &at, dec(&binding)); err != nil {
			return nil, fmt.Errorf("karma events: %w", err)
		}
		e.At = fromNano(at)
		if e.Binding, err = karma.ParseBinding(binding); err != nil {
			return nil, fmt.Errorf("karma event %d: %w", e.ID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("karma events: %w", err)
	}
	return out, nil
}

func queryTraces(ctx context.Context, tx pgx.Tx, query string, args ...any) ([]ctxd.Trace, error) {
	rows, err := tx.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("traces: %w", err)
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
		return nil, fmt.Errorf("traces: %w", err)
	}
	return out, nil
}

// traceTx loads one trace; an unknown id is KindNotFound.
func traceTx(ctx context.Context, tx pgx.Tx, id int64) (ctxd.Trace, error) {
	t, err := scanTrace(tx.QueryRow(ctx, "SELECT "+traceColumns+" FROM traces WHERE id = $1", id))
	if isNoRows(err) {
		return t, ctxd.Errorf(ctxd.KindNotFound, "no trace %d", id)
	}
	return t, err
}

func scanTrace(r pgx.Row) (ctxd.Trace, error) {
	var t ctxd.Trace
	var created int64
	var judged, until *int64
	var binding, rebound string
	if err := r.Scan(&t.ID, dec(&t.Session), dec(&t.Sigil), dec(&t.Query), dec(&t.Answer), dec(&t.Model), dec(&t.Fingerprint), dec(&t.Codex), &created,
		&t.Status, &t.Pinned, dec(&t.Note), &judged, &until, &t.SupersededBy, &t.Supersedes, dec(&binding), dec(&rebound)); err != nil {
		if isNoRows(err) {
			return t, err
		}
		return t, fmt.Errorf("trace: %w", err)
	}
	b, err := karma.ParseBinding(binding)
	if err != nil {
		return t, fmt.Errorf("trace %d: %w", t.ID, err)
	}
	if b != nil {
		t.Binding = *b
	} else {
		t.Binding = ctxd.TraceBinding{Codex: t.Codex} // recorded before bindings: its codex alone
	}
	if t.Rebound, err = karma.ParseBinding(rebound); err != nil {
		return t, fmt.Errorf("trace %d: %w", t.ID, err)
	}
	t.CreatedAt = fromNano(created)
	if judged != nil {
		at := fromNano(*judged)
		t.JudgedAt = &at
	}
	if until != nil {
		at := fromNano(*until)
		t.ValidUntil = &at
	}
	return t, nil
}

// fromNano is the time of a stored Unix nanosecond count, in UTC.
func fromNano(n int64) time.Time { return time.Unix(0, n).UTC() }

// nullNano is t as a nullable column stores it.
func nullNano(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	n := t.UnixNano()
	return &n
}
