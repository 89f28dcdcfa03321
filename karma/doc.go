// Package karma decides what the karma block of a prompt holds: which of a
// sigil's eligible traces (verified past answers) the model is shown, in
// what order and as what text. It also folds karma events into traces, so
// every store judges traces by the same rules.
//
// It is pure logic: it reads no clock (Options.Now is given), touches no
// database and renders no prompt. Storing traces is the KarmaStore's job
// (packages sqlite and pgstore; internal/fake for tests), which store
// bindings and fold past events alike through this package (stored.go);
// rendering the block and deciding when a new karma epoch begins belong
// to the packages that use this one.
//
// # Staleness
//
// Stale says whether a trace still holds for the codex loaded now: it
// does not when a file its binding depends on changed or is gone, or,
// for a trace answered from the whole codex, when the codex is another
// version. The orchestrator leaves stale traces out of the block it
// chooses at a karma epoch; a verification that names the current code
// (the event's Binding) binds the trace to it again.
//
// # Score
//
// Each eligible trace is scored
//
//	score = 4·pinned + 2·verified + recency + codex
//
// where pinned and verified are 1 or 0, recency = 2^(−age/HalfLife) with
// age the time from the trace's CreatedAt to Options.Now (a trace from the
// future counts as new: recency 1), and codex is 1 when the trace was
// answered from the codex that is current now (its Codex fingerprint
// equals Options.Codex, both non-empty) and 0 otherwise. Recency is in
// (0, 1] and codex at most 1, so the weights order pinned before verified
// before merely recorded; among the unpinned traces (eligible only when
// verified) a match with the current codex weighs as much as being new.
//
// # Selection
//
// Select chooses every pinned trace first (pinned is verbatim: even beyond
// TopK), then the highest-scoring others up to TopK, ties broken by the
// higher trace id. An entry is never truncated: one longer than
// MaxEntryChars, or one that does not fit in what is left of MaxChars, is
// skipped and reported. Entries are returned in ascending trace id, so the
// block renders the same whatever the scores were.
//
// # Entry text
//
// An entry's text is
//
//	Q: <query>
//	A: <answer>
//	note: <note>
//
// with each part trimmed of surrounding whitespace and the note line left
// out when the trace has no note.
package karma
