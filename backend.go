package ctxd

import (
	"context"
	"time"
)

// GenerateRequest is one prompt for a backend slot.
type GenerateRequest struct {
	Prompt    string
	Tokens    []int    // the prompt's token ids, as ctxd counted them; a backend that takes ids sends these
	Slot      int      // the scheduler's slot; a backend that lets clients pick one (llama-server) uses it
	MaxTokens int      // the answer reserve: prompt + answer always fit the window
	NumKeep   int      // tokens the backend must never shift out
	Stop      []string // stop sequences
	// Session names the conversation the prompt continues, and Parent the
	// one a side request (a condensation, a one-off question) belongs to:
	// a backend in front of a cluster routes by them ("" for none).
	Session string
	Parent  string
}

// Done reasons of a generation.
const (
	DoneStop   = "stop"   // the model ended the answer or hit a stop sequence
	DoneLength = "length" // the answer reached MaxTokens
	// DoneIncomplete: the backend ended the stream without its final
	// message (Ollama aborting at its token repeat limit): the text is
	// what streamed, and the backend's measurements are missing.
	DoneIncomplete = "incomplete"
)

// Generation is a finished answer and the backend's own measurements.
type Generation struct {
	Text       string
	DoneReason string // one of the Done* reasons, or the backend's own
	Note       string // why an answer is DoneIncomplete, in words

	TTFT            time.Duration // from sending the request to the first token
	PromptEvalCount int           // prompt tokens, cached or not
	BackendCached   int           // prompt tokens the backend says it reused; -1 when it does not say
	// PromptRead is how much of the prompt the backend said its slot held
	// (reused or read) at its last report of progress, 0 if it made none.
	// After a generation stopped while the prompt was read, the slot holds
	// at least that much of it (a backend notices a stop between batches,
	// so often more).
	PromptRead         int
	PromptEvalDuration time.Duration
	EvalCount          int
	EvalDuration       time.Duration
}

// Backend generates from a raw prompt, streaming pieces to onToken. An
// error from onToken ends the generation (the backend stops) and is
// returned. Cancelling ctx stops the generation at the backend.
type Backend interface {
	Generate(ctx context.Context, req GenerateRequest, onToken func(string) error) (Generation, error)
}

// Tokenizer tokenizes exactly as the backend does. It is safe for
// concurrent use.
type Tokenizer interface {
	// Tokenize tokenizes a whole prompt: with the special tokens a prompt
	// starts with (BOS where the vocabulary asks for it).
	Tokenize(prompt string) ([]int, error)
	// TokenizeText tokenizes a piece of a prompt, without them.
	TokenizeText(text string) ([]int, error)
	// CountText counts the tokens of a piece of a prompt.
	CountText(text string) (int, error)
}

// Store keeps sessions. It is safe for concurrent use.
type Store interface {
	// Session loads a session; one never seen before is empty, not an error.
	Session(ctx context.Context, id string) (Session, error)
	// AppendTurn adds a finished turn to the session's current epoch
	// (creating the session) and returns its sequence number. summary is
	// stored as given (JSON).
	AppendTurn(ctx context.Context, id string, t Turn, summary []byte, now time.Time) (int64, error)
	// NewEpoch starts the session's next epoch with the turns keep
	// (sequence numbers) and summary, and every turn of the current epoch
	// after since (the last the caller read: turns another daemon sharing
	// the store appended meanwhile are not left out); other turns stay in
	// the record.
	NewEpoch(ctx context.Context, id string, keep []int64, since int64, summary string, now time.Time) (int, error)
	// DropExcerpts starts the session's next epoch with the same turns and
	// summary, the turns seqs without their codex excerpts from then on
	// (nil: every turn so far; the record keeps them): stale excerpts give
	// way to fresh ones.
	DropExcerpts(ctx context.Context, id string, seqs []int64, now time.Time) (int, error)
	// ReplaceTurns starts the session's next epoch (creating the session)
	// holding turns as new records, with no summary, and returns the epoch
	// and the turns' sequence numbers; earlier turns stay in the record.
	ReplaceTurns(ctx context.Context, id string, turns []Turn, now time.Time) (int, []int64, error)
	// DeleteSession removes a session; an unknown one is not an error.
	DeleteSession(ctx context.Context, id string) error
	// Sessions lists all sessions by id.
	Sessions(ctx context.Context) ([]SessionInfo, error)
	// ClaimSession makes sigil the owner of session id (creating it)
	// unless it has one, and returns the owner it has then. A session
	// recorded before owners were ("") goes to sigil only if sigil is
	// legacy (the daemon's default sigil); otherwise it stays unowned.
	ClaimSession(ctx context.Context, id, sigil, legacy string, now time.Time) (string, error)
}

// SessionCounter is a Store that counts its sessions without listing
// them, as status does. It is optional: a Store that is not one is
// counted by the length of its Sessions.
type SessionCounter interface {
	// SessionCount is how many sessions Sessions would list.
	SessionCount(ctx context.Context) (int, error)
}

// Retriever finds codex excerpts for a query (RAG).
type Retriever interface {
	Search(ctx context.Context, query string, k int) ([]Excerpt, error)
}

// Environment is the hardware situation in coarse bands, never raw
// numbers, so it changes only when a band changes: block 3's data.
type Environment struct {
	// VRAM is the pressure on the memory the model runs in (VRAM, or host
	// memory without a GPU), ctxd's own planned window counted.
	VRAM         string `json:"vram" jsonschema:"enum=unknown,enum=low,enum=moderate,enum=high,enum=critical" jsonschema_description:"pressure on the memory the model runs in (VRAM, or host memory without a GPU)"`
	GPU          string `json:"gpu" jsonschema:"enum=unknown,enum=none,enum=present"`
	Power        string `json:"power" jsonschema:"enum=unknown,enum=ac,enum=battery,enum=low_battery,enum=low_power"`
	Connectivity string `json:"connectivity" jsonschema:"enum=unknown,enum=offline,enum=online"`
}

// Sensor reads the environment's current bands. It must answer at once
// (from a recent reading) and be safe for concurrent use.
type Sensor interface {
	Environment() Environment
}
