package fake

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/karma"
)

// Karma is an in-memory karma store with the rules of the real one
// (package sqlite): events are folded by karma.Judge and karma.Fold,
// times are kept to the nanosecond in UTC, and Text matches the words of
// a trace's query, answer and note as the real store's full-text index
// does (case-insensitive; diacritics count).
type Karma struct {
	mu        sync.Mutex                      // guards the fields below
	traces    []ctxd.Trace                    // by id − 1, as they stand
	events    []ctxd.KarmaEvent               // every event, in the order applied
	snapshots map[string][]ctxd.KarmaSnapshot // by session, oldest first
	failNext  error                           // the next write fails with it
}

var _ ctxd.KarmaStore = (*Karma)(nil)

// NewKarma returns an empty karma store.
func NewKarma() *Karma { return &Karma{snapshots: map[string][]ctxd.KarmaSnapshot{}} }

// FailNextWrite makes the next RecordTrace, KarmaEvent or
// SaveKarmaSnapshot fail with err, storing nothing.
func (k *Karma) FailNextWrite(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.failNext = err
}

func (k *Karma) writeErrLocked() error {
	err := k.failNext
	k.failNext = nil
	return err
}

func (k *Karma) RecordTrace(_ context.Context, t ctxd.Trace) (int64, error) {
	switch {
	case t.Sigil == "":
		return 0, ctxd.Errorf(ctxd.KindInvalid, "record trace: no sigil")
	case t.CreatedAt.IsZero():
		return 0, ctxd.Errorf(ctxd.KindInvalid, "record trace: no time")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.writeErrLocked(); err != nil {
		return 0, err
	}
	t.ID = int64(len(k.traces)) + 1
	t.CreatedAt = utc(t.CreatedAt)
	t.Binding = cloneBinding(t.Binding)
	t, _ = karma.Fold(t, nil, time.Time{}) // recorded, unpinned
	k.traces = append(k.traces, t)
	return t.ID, nil
}

func (k *Karma) KarmaEvent(_ context.Context, ev ctxd.KarmaEvent) (ctxd.Trace, error) {
	if ev.At.IsZero() {
		return ctxd.Trace{}, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d: no time", ev.Trace)
	}
	ev.At = utc(ev.At)
	if ev.Binding != nil {
		b := cloneBinding(*ev.Binding)
		ev.Binding = &b
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	t, ok := k.traceLocked(ev.Trace)
	if !ok {
		return ctxd.Trace{}, ctxd.Errorf(ctxd.KindNotFound, "no trace %d", ev.Trace)
	}
	var other *ctxd.Trace
	if ev.Action == ctxd.KarmaSupersede && ev.Other != ev.Trace {
		if o, ok := k.traceLocked(ev.Other); ok {
			other = &o
		}
	}
	nt, no, err := karma.Judge(t, other, ev)
	if err != nil {
		return ctxd.Trace{}, err
	}
	if err := k.writeErrLocked(); err != nil {
		return ctxd.Trace{}, err
	}
	k.events = append(k.events, ev)
	k.traces[nt.ID-1] = nt
	if ev.Action == ctxd.KarmaSupersede {
		k.traces[no.ID-1] = no
	}
	return clone(nt), nil
}

func (k *Karma) traceLocked(id int64) (ctxd.Trace, bool) {
	if id < 1 || id > int64(len(k.traces)) {
		return ctxd.Trace{}, false
	}
	return clone(k.traces[id-1]), true
}

// eventsLocked are the events of trace id (on it, or supersedes naming
// it as the replacing trace), oldest first.
func (k *Karma) eventsLocked(id int64) []ctxd.KarmaEvent {
	var out []ctxd.KarmaEvent
	for _, ev := range k.events {
		if ev.Trace == id || ev.Action == ctxd.KarmaSupersede && ev.Other == id {
			out = append(out, ev)
		}
	}
	return out
}

func (k *Karma) Trace(_ context.Context, id int64) (ctxd.Trace, []ctxd.KarmaEvent, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	t, ok := k.traceLocked(id)
	if !ok {
		return ctxd.Trace{}, nil, ctxd.Errorf(ctxd.KindNotFound, "no trace %d", id)
	}
	return t, k.eventsLocked(id), nil
}

func (k *Karma) Traces(_ context.Context, f ctxd.TraceFilter) ([]ctxd.Trace, error) {
	switch f.Status {
	case "", ctxd.TraceRecorded, ctxd.TraceVerified, ctxd.TraceRejected:
	default:
		return nil, ctxd.Errorf(ctxd.KindInvalid, "traces: unknown status %q", f.Status)
	}
	if f.Limit < 0 {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "traces: limit %d is negative", f.Limit)
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	want := words(f.Text)
	if f.Text != "" && len(want) == 0 {
		return nil, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []ctxd.Trace
	for _, t := range k.traces {
		if !f.At.IsZero() {
			if t.CreatedAt.After(f.At) {
				continue
			}
			var err error
			if t, err = karma.Fold(t, k.eventsLocked(t.ID), f.At); err != nil {
				return nil, err
			}
		}
		if f.Sigil != "" && t.Sigil != f.Sigil || f.Session != "" && t.Session != f.Session ||
			f.Status != "" && t.Status != f.Status || f.Pinned && !t.Pinned || !hasWords(t, want) {
			continue
		}
		out = append(out, clone(t))
	}
	slices.SortFunc(out, func(a, b ctxd.Trace) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.ID, a.ID)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// words are the lowercased runs of letters and digits of s.
func words(s string) []string {
	ws := strings.FieldsFunc(s, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	for i, w := range ws {
		ws[i] = strings.ToLower(w)
	}
	return ws
}

// hasWords reports whether t's query, answer and note hold every word of want.
func hasWords(t ctxd.Trace, want []string) bool {
	if len(want) == 0 {
		return true
	}
	have := words(t.Query + " " + t.Answer + " " + t.Note)
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func (k *Karma) Eligible(_ context.Context, sigil string) ([]ctxd.Trace, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []ctxd.Trace
	for _, t := range k.traces {
		if t.Sigil == sigil && karma.Eligible(t) {
			out = append(out, clone(t))
		}
	}
	return out, nil
}

func (k *Karma) KarmaSnapshot(_ context.Context, session string) (ctxd.KarmaSnapshot, bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	snaps := k.snapshots[session]
	if len(snaps) == 0 {
		return ctxd.KarmaSnapshot{}, false, nil
	}
	s := snaps[len(snaps)-1]
	s.Entries = slices.Clone(s.Entries)
	return s, true, nil
}

func (k *Karma) SaveKarmaSnapshot(_ context.Context, s ctxd.KarmaSnapshot) error {
	if err := karma.CheckSnapshot(s); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	snaps := k.snapshots[s.Session]
	if n := len(snaps); n > 0 && s.KarmaEpoch <= snaps[n-1].KarmaEpoch {
		return ctxd.Errorf(ctxd.KindConflict, "karma snapshot of session %q: epoch %d is not after the saved epoch %d", s.Session, s.KarmaEpoch, snaps[n-1].KarmaEpoch)
	}
	if err := k.writeErrLocked(); err != nil {
		return err
	}
	s.At = utc(s.At)
	s.Entries = slices.Clone(s.Entries)
	k.snapshots[s.Session] = append(snaps, s)
	return nil
}

func (k *Karma) KarmaSnapshots(_ context.Context, session string) ([]ctxd.KarmaSnapshot, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []ctxd.KarmaSnapshot
	for _, s := range k.snapshots[session] {
		s.Entries = slices.Clone(s.Entries)
		out = append(out, s)
	}
	return out, nil
}

// utc is t as the real store gives it back: to the nanosecond, in UTC,
// without a monotonic reading.
func utc(t time.Time) time.Time { return time.Unix(0, t.UnixNano()).UTC() }

// clone copies t's time pointers, so callers cannot change what is stored.
func clone(t ctxd.Trace) ctxd.Trace {
	if t.JudgedAt != nil {
		at := *t.JudgedAt
		t.JudgedAt = &at
	}
	if t.ValidUntil != nil {
		at := *t.ValidUntil
		t.ValidUntil = &at
	}
	t.Binding = cloneBinding(t.Binding)
	if t.Rebound != nil {
		b := cloneBinding(*t.Rebound)
		t.Rebound = &b
	}
	return t
}

func cloneBinding(b ctxd.TraceBinding) ctxd.TraceBinding {
	b.Files = slices.Clone(b.Files)
	return b
}
