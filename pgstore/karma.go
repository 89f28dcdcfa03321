package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

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
	var id int64
	err := s.write(ctx, "record trace", func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `
			INSERT INTO traces (session, sigil, query, answer, model, fingerprint, codex, created_unix_nano, binding)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id`,
			toDB(t.Session), toDB(t.Sigil), toDB(t.Query), toDB(t.Answer), toDB(t.Model), toDB(t.Fingerprint), toDB(t.Codex),
			t.CreatedAt.UnixNano(), toDB(karma.BindingJSON(&t.Binding))).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO trace_text (rowid, words) VALUES ($1, array_to_tsvector($2::text[]))", -id, docWords(t.Query, t.Answer))
		return err
	})
	if err != nil {
		return 0, err
	}
	return id, nil
}

// KarmaEvent appends ev and updates its trace (and, for a supersede, the
// replacing trace) in the same transaction; the rules are karma.Judge's.
// An unknown trace is KindNotFound. The traces it changes are locked
// first (in id order), so the events of a trace apply one at a time, in
// the order of their ids, whichever daemon writes them.
func (s *Store) KarmaEvent(ctx context.Context, ev ctxd.KarmaEvent) (ctxd.Trace, error) {
	if ev.At.IsZero() {
		return ctxd.Trace{}, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d: no time", ev.Trace)
	}
	ev.At = fromNano(ev.At.UnixNano())
	var nt ctxd.Trace
	err := s.write(ctx, "karma event", func(tx pgx.Tx) error {
		locks := []int64{ev.Trace}
		supersedes := ev.Action == ctxd.KarmaSupersede && ev.Other != 0 && ev.Other != ev.Trace
		if supersedes {
			locks = append(locks, ev.Other)
		}
		if _, err := tx.Exec(ctx, "SELECT id FROM traces WHERE id = ANY($1) ORDER BY id FOR UPDATE", locks); err != nil {
			return err
		}
		t, err := traceTx(ctx, tx, ev.Trace)
		if err != nil {
			return err
		}
		var other *ctxd.Trace
		if supersedes {
			o, err := traceTx(ctx, tx, ev.Other)
			switch {
			case err == nil:
				other = &o
			case ctxd.KindOf(err) != ctxd.KindNotFound:
				return err
			}
		}
		var no ctxd.Trace
		if nt, no, err = karma.Judge(t, other, ev); err != nil {
			return err
		}
		var eid int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO karma_events (trace, action, sigil, note, other, at_unix_nano, binding)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
			ev.Trace, toDB(ev.Action), toDB(ev.Sigil), toDB(ev.Note), ev.Other, ev.At.UnixNano(), toDB(karma.BindingJSON(ev.Binding))).Scan(&eid); err != nil {
			return err
		}
		if err := writeDerived(ctx, tx, nt); err != nil {
			return err
		}
		if ev.Action == ctxd.KarmaSupersede {
			if err := writeDerived(ctx, tx, no); err != nil {
				return err
			}
		}
		if karma.Judges(ev.Action) {
			if _, err := tx.Exec(ctx, "INSERT INTO trace_text (rowid, words) VALUES ($1, array_to_tsvector($2::text[]))",
				eid, docWords(t.Query, t.Answer, ev.Note)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE traces SET text_doc = $1 WHERE id = $2", eid, t.ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ctxd.Trace{}, err
	}
	return nt, nil
}

func writeDerived(ctx context.Context, tx pgx.Tx, t ctxd.Trace) error {
	if _, err := tx.Exec(ctx, `
		UPDATE traces SET status = $1, pinned = $2, note = $3, judged_unix_nano = $4, valid_until_unix_nano = $5,
			superseded_by = $6, supersedes = $7, rebound = $8 WHERE id = $9`,
		t.Status, t.Pinned, toDB(t.Note), nullNano(t.JudgedAt), nullNano(t.ValidUntil), t.SupersededBy, t.Supersedes,
		toDB(karma.BindingJSON(t.Rebound)), t.ID); err != nil {
		return fmt.Errorf("trace %d: %w", t.ID, err)
	}
	return nil
}

// Trace returns one trace and its events, oldest first: those on it and
// the supersede events that name it as the replacing trace, so that
// karma.Fold of the trace with them is the trace.
func (s *Store) Trace(ctx context.Context, id int64) (ctxd.Trace, []ctxd.KarmaEvent, error) {
	var t ctxd.Trace
	var out []ctxd.KarmaEvent
	err := s.read(ctx, fmt.Sprintf("trace %d", id), func(tx pgx.Tx) error {
		var err error
		if t, err = traceTx(ctx, tx, id); err != nil {
			return err
		}
		evs, err := eventsTx(ctx, tx, []int64{id}, time.Time{})
		if err != nil {
			return err
		}
		out = make([]ctxd.KarmaEvent, len(evs))
		for i, e := range evs {
			out[i] = e.KarmaEvent
		}
		return nil
	})
	if err != nil {
		return ctxd.Trace{}, nil, err
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
		if match = tsQuery(f.Text); match == "" {
			return nil, nil
		}
	}
	var out []ctxd.Trace
	err = s.read(ctx, "traces", func(tx pgx.Tx) error {
		var err error
		if f.At.IsZero() {
			out, err = tracesNowTx(ctx, tx, f, match, limit)
		} else {
			out, err = tracesAtTx(ctx, tx, f, match, limit)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// query builds a statement's WHERE clause and its numbered arguments.
type query struct {
	where []string
	args  []any
}

// arg adds v to the arguments and returns its placeholder.
func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

// and adds a condition.
func (q *query) and(cond string) { q.where = append(q.where, cond) }

// sql is "SELECT traceColumns FROM traces" with q's conditions and tail.
func (q *query) sql(tail string) string {
	s := "SELECT " + traceColumns + " FROM traces"
	if len(q.where) > 0 {
		s += " WHERE " + strings.Join(q.where, " AND ")
	}
	return s + " " + tail
}

// tracesNowTx lists the traces as they stand: the derived columns filter.
func tracesNowTx(ctx context.Context, tx pgx.Tx, f ctxd.TraceFilter, match string, limit int) ([]ctxd.Trace, error) {
	var q query
	if f.Sigil != "" {
		q.and("sigil = " + q.arg(toDB(f.Sigil)))
	}
	if f.Session != "" {
		q.and("session = " + q.arg(toDB(f.Session)))
	}
	if f.Status != "" {
		q.and("status = " + q.arg(f.Status))
	}
	if f.Pinned {
		q.and("pinned")
	}
	if match != "" {
		q.and("(CASE text_doc WHEN 0 THEN -id ELSE text_doc END) IN (SELECT rowid FROM trace_text WHERE words @@ " + q.arg(match) + "::tsquery)")
	}
	return queryTraces(ctx, tx, q.sql("ORDER BY created_unix_nano DESC, id DESC LIMIT "+q.arg(limit)), q.args...)
}

// tracesAtTx lists the traces as they stood at f.At (karma.TracesAt).
func tracesAtTx(ctx context.Context, tx pgx.Tx, f ctxd.TraceFilter, match string, limit int) ([]ctxd.Trace, error) {
	return karma.TracesAt(f, match != "", limit, karma.Pager{
		Page: func(after bool, afterCreated, afterID int64) ([]ctxd.Trace, error) {
			var q query
			q.and("created_unix_nano <= " + q.arg(f.At.UnixNano()))
			if f.Sigil != "" {
				q.and("sigil = " + q.arg(toDB(f.Sigil)))
			}
			if f.Session != "" {
				q.and("session = " + q.arg(toDB(f.Session)))
			}
			if after {
				c := q.arg(afterCreated)
				q.and("(created_unix_nano < " + c + " OR created_unix_nano = " + c + " AND id < " + q.arg(afterID) + ")")
			}
			return queryTraces(ctx, tx, q.sql("ORDER BY created_unix_nano DESC, id DESC LIMIT "+q.arg(karma.PageSize)), q.args...)
		},
		Events: func(ids []int64) ([]karma.StoredEvent, error) { return eventsTx(ctx, tx, ids, f.At) },
		Matching: func(docs []int64) (map[int64]bool, error) {
			rows, err := tx.Query(ctx, "SELECT rowid FROM trace_text WHERE words @@ $1::tsquery AND rowid = ANY($2)", match, docs)
			if err != nil {
				return nil, err
			}
			defer rows.Close()
			out := map[int64]bool{}
			for rows.Next() {
				var d int64
				if err := rows.Scan(&d); err != nil {
					return nil, err
				}
				out[d] = true
			}
			return out, rows.Err()
		},
	})
}

// Eligible is every trace of sigil that may enter the karma block now
// (karma.Eligible), by id.
func (s *Store) Eligible(ctx context.Context, sigil string) ([]ctxd.Trace, error) {
	var out []ctxd.Trace
	err := s.read(ctx, "eligible traces", func(tx pgx.Tx) error {
		var err error
		out, err = queryTraces(ctx, tx, "SELECT "+traceColumns+` FROM traces
			WHERE sigil = $1 AND superseded_by = 0 AND status <> 'rejected' AND (status = 'verified' OR pinned)
			ORDER BY id`, toDB(sigil))
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
