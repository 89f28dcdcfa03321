package karma

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ctxd/ctxd"
)

// Defaults of Options' zero fields.
const (
	DefaultTopK          = 5
	DefaultMaxChars      = 4000
	DefaultMaxEntryChars = 1200
	DefaultHalfLife      = 7 * 24 * time.Hour
)

// Options says how Select chooses. A zero field takes its default.
type Options struct {
	TopK          int           // unpinned entries at most (pinned ones are not counted); 0: DefaultTopK
	MaxChars      int           // the block's entry text at most, in characters (runes); 0: DefaultMaxChars
	MaxEntryChars int           // one entry's text at most; a longer one is skipped, never cut; 0: DefaultMaxEntryChars
	HalfLife      time.Duration // the age at which recency halves; 0: DefaultHalfLife
	Codex         string        // fingerprint of the current codex ("" for none)
	Now           time.Time     // the time ages are measured to
}

// Validate names the first field that is out of range.
func (o Options) Validate() error {
	switch {
	case o.TopK < 0:
		return fmt.Errorf("karma: TopK is %d, must not be negative", o.TopK)
	case o.MaxChars < 0:
		return fmt.Errorf("karma: MaxChars is %d, must not be negative", o.MaxChars)
	case o.MaxEntryChars < 0:
		return fmt.Errorf("karma: MaxEntryChars is %d, must not be negative", o.MaxEntryChars)
	case o.HalfLife < 0:
		return fmt.Errorf("karma: HalfLife is %s, must not be negative", o.HalfLife)
	case o.Now.IsZero():
		return fmt.Errorf("karma: Now is not set")
	}
	return nil
}

// withDefaults fills the fields that are not positive.
func (o Options) withDefaults() Options {
	if o.TopK <= 0 {
		o.TopK = DefaultTopK
	}
	if o.MaxChars <= 0 {
		o.MaxChars = DefaultMaxChars
	}
	if o.MaxEntryChars <= 0 {
		o.MaxEntryChars = DefaultMaxEntryChars
	}
	if o.HalfLife <= 0 {
		o.HalfLife = DefaultHalfLife
	}
	return o
}

// Score is t's score under o (see the package doc).
func Score(t ctxd.Trace, o Options) float64 {
	o = o.withDefaults()
	var s float64
	if t.Pinned {
		s += 4
	}
	if t.Status == ctxd.TraceVerified {
		s += 2
	}
	age := max(o.Now.Sub(t.CreatedAt), 0)
	s += math.Exp2(-float64(age) / float64(o.HalfLife))
	if t.Codex != "" && t.Codex == o.Codex {
		s++
	}
	return s
}

// Text is t as a karma entry shows it (see the package doc).
func Text(t ctxd.Trace) string {
	s := "Q: " + strings.TrimSpace(t.Query) + "\nA: " + strings.TrimSpace(t.Answer)
	if note := strings.TrimSpace(t.Note); note != "" {
		s += "\nnote: " + note
	}
	return s
}

// Skip is a trace Select left out although it could have been chosen: its
// text is too long for an entry or does not fit in the block.
type Skip struct {
	Trace  int64
	Reason string
}

// Select chooses the karma block's entries from a sigil's eligible traces
// (see the package doc) and reports the traces it skipped, both by trace
// id. It depends on
// nothing but its arguments: the same traces, in any order, and options
// give the same entries. Traces that are not Eligible are skipped; a trace
// listed twice counts once. Fields of o that are not positive take their
// defaults.
func Select(eligible []ctxd.Trace, o Options) (entries []ctxd.KarmaEntry, skipped []Skip) {
	o = o.withDefaults()
	type candidate struct {
		entry ctxd.KarmaEntry
		chars int
	}
	cands := make([]candidate, 0, len(eligible))
	seen := make(map[int64]bool, len(eligible))
	for _, t := range eligible {
		if seen[t.ID] {
			continue
		}
		seen[t.ID] = true
		if !Eligible(t) {
			skipped = append(skipped, Skip{Trace: t.ID, Reason: fmt.Sprintf("not eligible (status %s, superseded by %d)", t.Status, t.SupersededBy)})
			continue
		}
		text := Text(t)
		cands = append(cands, candidate{
			entry: ctxd.KarmaEntry{Trace: t.ID, Text: text, Pinned: t.Pinned, Score: Score(t, o), Verified: t.Status == ctxd.TraceVerified},
			chars: utf8.RuneCountInString(text),
		})
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		if a.entry.Pinned != b.entry.Pinned {
			if a.entry.Pinned {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(b.entry.Score, a.entry.Score); c != 0 {
			return c
		}
		return cmp.Compare(b.entry.Trace, a.entry.Trace)
	})
	total, unpinned := 0, 0
	for _, c := range cands {
		if !c.entry.Pinned && unpinned >= o.TopK {
			break
		}
		switch {
		case c.chars > o.MaxEntryChars:
			skipped = append(skipped, Skip{Trace: c.entry.Trace, Reason: fmt.Sprintf("entry is %d characters, over the %d an entry may have", c.chars, o.MaxEntryChars)})
		case total+c.chars > o.MaxChars:
			skipped = append(skipped, Skip{Trace: c.entry.Trace, Reason: fmt.Sprintf("entry is %d characters, %d are left of the block's %d", c.chars, o.MaxChars-total, o.MaxChars)})
		default:
			total += c.chars
			if !c.entry.Pinned {
				unpinned++
			}
			entries = append(entries, c.entry)
		}
	}
	slices.SortFunc(entries, func(a, b ctxd.KarmaEntry) int { return cmp.Compare(a.Trace, b.Trace) })
	slices.SortFunc(skipped, func(a, b Skip) int { return cmp.Compare(a.Trace, b.Trace) })
	return entries, skipped
}

// DropLowest removes the lowest-scoring entry that is not pinned (of equal
// scores, the lower trace id: the one Select prefers least) and returns
// the others in their order, and the one removed. It is false, and entries
// are returned as they are, when every entry is pinned. entries is not
// modified.
func DropLowest(entries []ctxd.KarmaEntry) ([]ctxd.KarmaEntry, ctxd.KarmaEntry, bool) {
	low := -1
	for i, e := range entries {
		if e.Pinned {
			continue
		}
		if low < 0 || e.Score < entries[low].Score || e.Score == entries[low].Score && e.Trace < entries[low].Trace {
			low = i
		}
	}
	if low < 0 {
		return entries, ctxd.KarmaEntry{}, false
	}
	rest := make([]ctxd.KarmaEntry, 0, len(entries)-1)
	rest = append(rest, entries[:low]...)
	rest = append(rest, entries[low+1:]...)
	return rest, entries[low], true
}

// Eligible reports whether t may enter the karma block: verified or
// pinned, not rejected, not superseded.
func Eligible(t ctxd.Trace) bool {
	return t.Status != ctxd.TraceRejected && t.SupersededBy == 0 && (t.Status == ctxd.TraceVerified || t.Pinned)
}

// Apply returns t after ev, an event of t (ev.Trace is t.ID) or a
// supersede event naming t as the replacing trace (ev.Other is t.ID). It
// checks what t alone can tell:
//
//   - verify and reject set the status, the note (the event's, empty
//     included) and JudgedAt;
//   - pin and unpin set Pinned and leave the status alone;
//   - supersede sets ValidUntil and SupersededBy of the trace it replaces,
//     which must not be superseded already, and Supersedes of the
//     replacing trace, which must neither be superseded nor supersede
//     another already.
//
// An event without a time, with an unknown action, or naming an Other
// when it is not a supersede is KindInvalid; one the trace's state
// forbids is KindConflict. Stores use Judge for new
// events, which also checks the replacing trace against the replaced one.
func Apply(t ctxd.Trace, ev ctxd.KarmaEvent) (ctxd.Trace, error) {
	if ev.At.IsZero() {
		return t, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d: no time", ev.Trace)
	}
	if ev.Action == ctxd.KarmaSupersede && ev.Other == t.ID && ev.Trace != t.ID {
		switch {
		case t.SupersededBy != 0:
			return t, ctxd.Errorf(ctxd.KindConflict, "trace %d cannot supersede trace %d: it is itself superseded by trace %d", t.ID, ev.Trace, t.SupersededBy)
		case t.Supersedes != 0 && t.Supersedes != ev.Trace:
			return t, ctxd.Errorf(ctxd.KindConflict, "trace %d cannot supersede trace %d: it already supersedes trace %d", t.ID, ev.Trace, t.Supersedes)
		}
		t.Supersedes = ev.Trace
		return t, nil
	}
	if ev.Trace != t.ID {
		return t, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d applied to trace %d", ev.Trace, t.ID)
	}
	if ev.Other != 0 && ev.Action != ctxd.KarmaSupersede {
		return t, ctxd.Errorf(ctxd.KindInvalid, "karma event %s on trace %d names another trace (%d): only supersede does", ev.Action, t.ID, ev.Other)
	}
	switch ev.Action {
	case ctxd.KarmaVerify, ctxd.KarmaReject:
		t.Status = ctxd.TraceVerified
		if ev.Action == ctxd.KarmaReject {
			t.Status = ctxd.TraceRejected
		}
		t.Note = ev.Note
		at := ev.At
		t.JudgedAt = &at
		if ev.Binding != nil && ev.Action == ctxd.KarmaVerify {
			b := *ev.Binding
			t.Rebound = &b // verified against this code: it holds for it
		}
	case ctxd.KarmaPin:
		t.Pinned = true
	case ctxd.KarmaUnpin:
		t.Pinned = false
	case ctxd.KarmaSupersede:
		switch {
		case ev.Other == 0:
			return t, ctxd.Errorf(ctxd.KindInvalid, "supersede trace %d: no replacing trace (other)", t.ID)
		case ev.Other == t.ID:
			return t, ctxd.Errorf(ctxd.KindInvalid, "supersede trace %d: a trace cannot supersede itself", t.ID)
		case t.SupersededBy != 0:
			return t, ctxd.Errorf(ctxd.KindConflict, "trace %d cannot be superseded by trace %d: it is already superseded by trace %d", t.ID, ev.Other, t.SupersededBy)
		}
		at := ev.At
		t.ValidUntil = &at
		t.SupersededBy = ev.Other
	default:
		return t, ctxd.Errorf(ctxd.KindInvalid, "karma event on trace %d: unknown action %q", t.ID, ev.Action)
	}
	return t, nil
}

// Stale says why t no longer holds for the codex whose version is
// version and whose files' hashes are files (by path), or "" if it holds:
// a file it depends on (Bound) changed or is gone, or, for a trace
// answered from the whole codex (Whole), the codex is another version.
// A trace bound to no codex never goes stale; nor does any trace when no
// codex is loaded (version "").
func Stale(t ctxd.Trace, version string, files map[string]string) string {
	b := t.Bound()
	if version == "" || b.Codex == "" && len(b.Files) == 0 {
		return ""
	}
	var changed, gone []string
	for _, f := range b.Files {
		switch sum, ok := files[f.Path]; {
		case !ok:
			gone = append(gone, f.Path)
		case sum != f.SHA256:
			changed = append(changed, f.Path)
		}
	}
	var parts []string
	if len(changed) > 0 {
		parts = append(parts, "changed: "+list(changed))
	}
	if len(gone) > 0 {
		parts = append(parts, "gone: "+list(gone))
	}
	if len(parts) > 0 {
		return "files it depends on " + strings.Join(parts, "; ")
	}
	if b.Whole && b.Codex != "" && b.Codex != version {
		return "it was answered from the whole codex, which has changed since"
	}
	return ""
}

// list is paths in a line, at most five named.
func list(paths []string) string {
	s := strings.Join(paths[:min(5, len(paths))], ", ")
	if len(paths) > 5 {
		s += fmt.Sprintf(" and %d more", len(paths)-5)
	}
	return s
}

// Judge checks a new event against the current state of its trace t and,
// for a supersede, of the replacing trace other (nil when no trace has the
// id ev.Other), and returns both after it; other is returned unchanged
// (zero when nil) for every other action. Besides what Apply checks, the
// replacing trace must exist (else KindInvalid) and belong to t's sigil
// (else KindInvalid).
func Judge(t ctxd.Trace, other *ctxd.Trace, ev ctxd.KarmaEvent) (ctxd.Trace, ctxd.Trace, error) {
	var o ctxd.Trace
	if other != nil {
		o = *other
	}
	nt, err := Apply(t, ev)
	if err != nil || ev.Action != ctxd.KarmaSupersede {
		return nt, o, err
	}
	if other == nil {
		return t, o, ctxd.Errorf(ctxd.KindInvalid, "supersede trace %d: the replacing trace %d does not exist", t.ID, ev.Other)
	}
	if other.Sigil != t.Sigil {
		return t, o, ctxd.Errorf(ctxd.KindInvalid, "supersede trace %d (sigil %q) by trace %d: it belongs to sigil %q", t.ID, t.Sigil, other.ID, other.Sigil)
	}
	no, err := Apply(o, ev)
	if err != nil {
		return t, o, err
	}
	return nt, no, nil
}

// Fold returns t as it stood at time at (zero: after every event): its
// derived fields recomputed from events, those of t and the supersede
// events naming t as the replacing trace, applied in the order given (the
// order they were stored) and skipping those after at. Events of other
// traces are ignored.
func Fold(t ctxd.Trace, events []ctxd.KarmaEvent, at time.Time) (ctxd.Trace, error) {
	t.Status, t.Pinned, t.Note = ctxd.TraceRecorded, false, ""
	t.JudgedAt, t.ValidUntil, t.SupersededBy, t.Supersedes, t.Rebound = nil, nil, 0, 0, nil
	for _, ev := range events {
		if !at.IsZero() && ev.At.After(at) {
			continue
		}
		if ev.Trace != t.ID && (ev.Action != ctxd.KarmaSupersede || ev.Other != t.ID) {
			continue
		}
		var err error
		if t, err = Apply(t, ev); err != nil {
			return t, err
		}
	}
	return t, nil
}

// CheckSnapshot is nil for a snapshot a store may save: it names its
// session, counts its epoch from 1 and says when it was chosen. Whether
// the epoch is after the session's latest is the store's to check.
func CheckSnapshot(s ctxd.KarmaSnapshot) error {
	switch {
	case s.Session == "":
		return ctxd.Errorf(ctxd.KindInvalid, "karma snapshot: no session")
	case s.KarmaEpoch < 1:
		return ctxd.Errorf(ctxd.KindInvalid, "karma snapshot of session %q: epoch %d, they count from 1", s.Session, s.KarmaEpoch)
	case s.At.IsZero():
		return ctxd.Errorf(ctxd.KindInvalid, "karma snapshot of session %q: no time", s.Session)
	}
	return nil
}
