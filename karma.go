package ctxd

import (
	"context"
	"time"
)

// Trace statuses.
const (
	TraceRecorded = "recorded" // answered, not yet judged
	TraceVerified = "verified" // marked correct: eligible for the karma block
	TraceRejected = "rejected" // marked wrong: never shown
)

// Trace actions: what a karma event does to a trace.
const (
	KarmaVerify    = "verify"
	KarmaReject    = "reject"
	KarmaPin       = "pin"
	KarmaUnpin     = "unpin"
	KarmaSupersede = "supersede" // the trace is replaced by another (Other)
)

// Trace is one recorded answer: what was asked, what was answered, and
// what the model was shown (the prompt's stable prefix fingerprint). Its
// text never changes; judgements arrive as events, and a correction is a
// new trace that supersedes it, so history is never rewritten.
type Trace struct {
	ID          int64     `json:"id"`
	Session     string    `json:"session"`
	Sigil       string    `json:"sigil"`
	Query       string    `json:"query"`
	Answer      string    `json:"answer"`
	Model       string    `json:"model"`
	Fingerprint string    `json:"prompt_fingerprint"` // SHA-256 (hex) of the prompt's stable blocks
	Codex       string    `json:"codex,omitempty"`    // fingerprint of the codex it was answered from ("" for none; CodexVersion)
	CreatedAt   time.Time `json:"created_at"`
	// Binding is the code it was answered from, recorded with it.
	Binding TraceBinding `json:"binding"`

	// Derived from the trace's events (kept current by the store).
	Status       string     `json:"status"` // TraceRecorded, TraceVerified or TraceRejected
	Pinned       bool       `json:"pinned"`
	Note         string     `json:"note,omitempty"`        // the latest verify or reject note
	JudgedAt     *time.Time `json:"judged_at,omitempty"`   // when it was last verified or rejected
	ValidUntil   *time.Time `json:"valid_until,omitempty"` // when a correction superseded it
	SupersededBy int64      `json:"superseded_by,omitempty"`
	Supersedes   int64      `json:"supersedes,omitempty"`
	// Rebound is the code the latest verification that named one was
	// made against: it replaces Binding (Bound).
	Rebound *TraceBinding `json:"rebound,omitempty"`

	// Stale, where a codex is loaded, says why the trace no longer holds
	// for it (a file it depends on changed); computed when it is read,
	// never stored. A stale trace leaves the karma block at the next karma
	// epoch; verifying it again against the current code restores it.
	Stale string `json:"stale,omitempty"`
}

// Bound is the code t holds for: its latest verification's, or the one it
// was answered from.
func (t Trace) Bound() TraceBinding {
	if t.Rebound != nil {
		return *t.Rebound
	}
	return t.Binding
}

// TraceBinding is the code a trace holds for: the codex version it was
// answered (or verified) against and the files it depends on, with the
// content each had.
type TraceBinding struct {
	Codex string `json:"codex,omitempty"` // the codex's version (CodexVersion)
	// Whole says the prompt held the whole codex (CAG): any change of the
	// codex makes the trace stale. Otherwise (RAG) only Files count.
	Whole bool        `json:"whole,omitempty"`
	Files []TraceFile `json:"files,omitempty"`
}

// TraceFile is a codex file a trace depends on: one its prompt held (the
// working set's, an excerpt's) or its answer names (Cited).
type TraceFile struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Cited  bool   `json:"cited,omitempty"`
}

// ValidFrom is when the trace became part of the record.
func (t Trace) ValidFrom() time.Time { return t.CreatedAt }

// KarmaEvent is one judgement of a trace. Events are append-only: the
// status of every trace at any past time is the fold of its events up to
// then.
type KarmaEvent struct {
	Trace  int64     `json:"trace"`
	Action string    `json:"action"` // one of the Karma* actions
	Sigil  string    `json:"sigil"`  // who judged
	Note   string    `json:"note,omitempty"`
	Other  int64     `json:"other,omitempty"` // KarmaSupersede: the trace that replaces this one
	At     time.Time `json:"at"`
	// Binding (verify) is the code the trace was verified against: it
	// becomes the trace's Rebound.
	Binding *TraceBinding `json:"binding,omitempty"`
}

// TraceFilter selects traces to list. Zero fields do not filter.
type TraceFilter struct {
	Sigil   string    // only this sigil's traces ("" for every sigil's)
	Session string    // only this session's
	Status  string    // only this status
	Pinned  bool      // only pinned traces
	Text    string    // full-text match over query, answer and note
	At      time.Time // traces as they stood at this time (events after it ignored); zero: now
	Limit   int       // at most this many, newest first; 0: 100
}

// KarmaSnapshot is the karma a session was shown during one karma epoch:
// chosen once, stored, and rendered the same until the next epoch.
type KarmaSnapshot struct {
	Session      string       `json:"session"`
	Sigil        string       `json:"sigil"`         // the sigil it was chosen for
	KarmaEpoch   int          `json:"karma_epoch"`   // counts the session's selections, from 1
	SessionEpoch int          `json:"session_epoch"` // the session's epoch when it was chosen
	Reason       string       `json:"reason"`        // why a new epoch began
	Entries      []KarmaEntry `json:"entries"`       // in rendering order
	At           time.Time    `json:"at"`
}

// KarmaEntry is one trace as the karma block renders it.
type KarmaEntry struct {
	Trace    int64   `json:"trace"`
	Text     string  `json:"text"`
	Pinned   bool    `json:"pinned,omitempty"` // verbatim: never pruned by the governor
	Score    float64 `json:"score"`
	Verified bool    `json:"verified"`
}

// TraceHistory is GET /v1/karma/{id}: a trace and its events.
type TraceHistory struct {
	Trace  Trace        `json:"trace"`
	Events []KarmaEvent `json:"events"`
}

// KarmaJudgement is the body of POST /v1/karma/{id}/{action}.
type KarmaJudgement struct {
	Note string `json:"note,omitempty"`
	By   int64  `json:"by,omitempty"` // supersede: the trace that replaces this one
}

// KarmaStore keeps traces, their events and the karma each session was
// shown. Acknowledged writes are durable: a write that returned nil
// survives a crash.
type KarmaStore interface {
	// RecordTrace stores a new trace (status recorded) and returns its id.
	RecordTrace(ctx context.Context, t Trace) (int64, error)
	// KarmaEvent applies an event to its trace and returns the trace
	// after it. A supersede event also marks Other as superseding.
	KarmaEvent(ctx context.Context, ev KarmaEvent) (Trace, error)
	// Trace returns one trace and its events, oldest first; an unknown id
	// is an error of kind KindNotFound.
	Trace(ctx context.Context, id int64) (Trace, []KarmaEvent, error)
	// Traces lists traces as TraceFilter says, newest first.
	Traces(ctx context.Context, f TraceFilter) ([]Trace, error)
	// Eligible is every trace of sigil that may enter the karma block now:
	// verified or pinned, not rejected, not superseded.
	Eligible(ctx context.Context, sigil string) ([]Trace, error)
	// KarmaSnapshot is the session's latest snapshot; false if none.
	KarmaSnapshot(ctx context.Context, session string) (KarmaSnapshot, bool, error)
	// SaveKarmaSnapshot stores a new snapshot; earlier ones are kept.
	SaveKarmaSnapshot(ctx context.Context, s KarmaSnapshot) error
	// KarmaSnapshots lists a session's snapshots, oldest first.
	KarmaSnapshots(ctx context.Context, session string) ([]KarmaSnapshot, error)
}
