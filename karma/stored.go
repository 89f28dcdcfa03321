package karma

import (
	"encoding/json"
	"fmt"

	"github.com/ctxd/ctxd"
)

// What every store keeps alike (package sqlite, package pgstore): how a
// binding is stored, which events write a trace's note, and how a page of
// traces read as of a past time is folded and filtered.

// StoredEvent is an event as a store reads it, with its row id: its place
// in the order of events, and the id of the text document a judging event
// writes.
type StoredEvent struct {
	ID int64
	ctxd.KarmaEvent
}

// Judges reports whether an action judges a trace (verify, reject): the
// events that write its note.
func Judges(action string) bool { return action == ctxd.KarmaVerify || action == ctxd.KarmaReject }

// BindingJSON is a binding as stored ("" for none).
func BindingJSON(b *ctxd.TraceBinding) string {
	if b == nil {
		return ""
	}
	data, _ := json.Marshal(b) // strings and bools: cannot fail
	return string(data)
}

// ParseBinding reads a stored binding (nil for "").
func ParseBinding(s string) (*ctxd.TraceBinding, error) {
	if s == "" {
		return nil, nil
	}
	var b ctxd.TraceBinding
	if err := json.Unmarshal([]byte(s), &b); err != nil {
		return nil, fmt.Errorf("binding: %w", err)
	}
	return &b, nil
}

// FoldPage folds each trace of page (newest first) with its events among
// evs as they stood at f.At, and appends to out those f's status and
// pinned filters take and, where a text filter applies (text), whose text
// document (-id for the one written with the trace, else the id of its
// latest judging event) is among matched. It stops at limit traces in
// out, and says whether it reached it.
func FoldPage(out, page []ctxd.Trace, evs []StoredEvent, f ctxd.TraceFilter, text bool, matched map[int64]bool, limit int) ([]ctxd.Trace, bool, error) {
	for _, t := range page {
		doc := -t.ID
		mine := make([]ctxd.KarmaEvent, 0, 4)
		for _, e := range evs {
			if e.Trace == t.ID || e.Other == t.ID {
				mine = append(mine, e.KarmaEvent)
				if e.Trace == t.ID && Judges(e.Action) {
					doc = e.ID
				}
			}
		}
		t, err := Fold(t, mine, f.At)
		if err != nil {
			return out, false, fmt.Errorf("trace %d as of %s: %w", t.ID, f.At, err)
		}
		if f.Status != "" && t.Status != f.Status || f.Pinned && !t.Pinned || text && !matched[doc] {
			continue
		}
		out = append(out, t)
		if len(out) == limit {
			return out, true, nil
		}
	}
	return out, false, nil
}

// TextDocs are the text documents of the traces ids and the judging
// events among evs: the documents a text filter over them may match.
func TextDocs(ids []int64, evs []StoredEvent) []int64 {
	docs := make([]int64, 0, len(ids)+len(evs))
	for _, id := range ids {
		docs = append(docs, -id)
	}
	for _, e := range evs {
		if Judges(e.Action) {
			docs = append(docs, e.ID)
		}
	}
	return docs
}

// PageSize is how many traces TracesAt folds at a time.
const PageSize = 200

// Pager is how a store reads what TracesAt folds.
type Pager struct {
	// Page reads the next PageSize traces created by f.At that f's sigil
	// and session filters take, newest first (created, then id), after
	// the trace created at afterCreated with id afterID (none on the first
	// page: after is false).
	Page func(after bool, afterCreated, afterID int64) ([]ctxd.Trace, error)
	// Events reads the events of the traces ids up to f.At, in order.
	Events func(ids []int64) ([]StoredEvent, error)
	// Matching reads which of the text documents docs match the text
	// filter; called only when there is one.
	Matching func(docs []int64) (map[int64]bool, error)
}

// TracesAt lists the traces as they stood at f.At (those created by then,
// folded from their events up to then), a page at a time, until limit
// pass f's filters; text says whether a text filter applies.
func TracesAt(f ctxd.TraceFilter, text bool, limit int, p Pager) ([]ctxd.Trace, error) {
	var out []ctxd.Trace
	afterCreated, afterID := int64(0), int64(0)
	for after := false; ; after = true {
		page, err := p.Page(after, afterCreated, afterID)
		if err != nil || len(page) == 0 {
			return out, err
		}
		last := page[len(page)-1]
		afterCreated, afterID = last.CreatedAt.UnixNano(), last.ID
		ids := make([]int64, len(page))
		for i, t := range page {
			ids[i] = t.ID
		}
		evs, err := p.Events(ids)
		if err != nil {
			return nil, err
		}
		var matched map[int64]bool
		if text {
			if matched, err = p.Matching(TextDocs(ids, evs)); err != nil {
				return nil, err
			}
		}
		var full bool
		if out, full, err = FoldPage(out, page, evs, f, text, matched, limit); err != nil || full {
			return out, err
		}
		if len(page) < PageSize {
			return out, nil
		}
	}
}

// DefaultTraceLimit is how many traces a listing holds when its filter
// says 0.
const DefaultTraceLimit = 100

// FilterLimit checks a listing's filter (a known status, a limit not
// negative) and returns how many traces it may hold.
func FilterLimit(f ctxd.TraceFilter) (int, error) {
	switch f.Status {
	case "", ctxd.TraceRecorded, ctxd.TraceVerified, ctxd.TraceRejected:
	default:
		return 0, ctxd.Errorf(ctxd.KindInvalid, "traces: unknown status %q", f.Status)
	}
	if f.Limit < 0 {
		return 0, ctxd.Errorf(ctxd.KindInvalid, "traces: limit %d is negative", f.Limit)
	}
	if f.Limit == 0 {
		return DefaultTraceLimit, nil
	}
	return f.Limit, nil
}
