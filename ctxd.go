// Package ctxd is the domain of the ctxd daemon: the types every side
// shares — the request an agent sends, the events and summary it gets back,
// sessions and turns, codex statistics and progress, error kinds with the
// HTTP status each maps to — and the small interfaces the core consumes
// (store, backend, tokenizer, environment).
//
// It depends on the standard library only, so the client and every front
// door can import it without linking llama.cpp, SQLite or NVML. It holds no
// behaviour beyond what the types need: the work is done in the packages
// named for it (runcontext, governor, scheduler, orchestrator, the adapters).
package ctxd

import (
	"encoding/json"
	"regexp"
	"time"
)

// AskRequest is one query of one session: the body of POST /v1/ask.
type AskRequest struct {
	Session string `json:"session"`
	// Parent is the session this one is a side request of (a sub-agent's
	// session, asked on behalf of its parent's conversation), "" for none:
	// a backend in front of a cluster routes it with its parent (the doors
	// take it from the X-Ctxd-Parent-Session header). Nothing else reads it.
	Parent string `json:"parent,omitempty"`
	Query  string `json:"query"`
	Sigil  string `json:"sigil,omitempty"`
	Pin    bool   `json:"pin,omitempty"` // keep this turn verbatim: never compacted or condensed
	// Persona names the persona that answers ("": the default one; see
	// the configuration's [[persona]]).
	Persona string `json:"persona,omitempty"`

	// System is the client's own system message: it ends the sigil block,
	// after the identity, codex and environment every request shares.
	System string `json:"system,omitempty"`
	// History is the conversation as the client holds it, oldest first,
	// for clients that resend it with every request (the OpenAI and
	// Ollama doors). When it is set (an empty list included) the session
	// follows it: if it does not end with the session's turns (the client
	// edited, dropped or regenerated one), the session starts a new epoch
	// holding the client's turns; the old ones stay in the record.
	History []Turn `json:"history,omitzero"` // omitzero: an empty list is sent, nil is not
	// Tools are the client's tools (an OpenAI or Ollama client's function
	// definitions). Those the sigil's scopes allow (tool:NAME, or tools
	// for all) are offered to the model in the sigil block; the others are
	// listed in the summary's tools_refused.
	Tools []Tool `json:"tools,omitempty"`
	// Ephemeral asks one question outside any conversation (a door's text
	// completion, Ollama's generate): no history is read or followed and
	// nothing is recorded, so a client that sends a thousand independent
	// prompts leaves no thousand sessions behind. Session still names the
	// ask (its queue, its summary). Set by the doors, not by the native API.
	Ephemeral bool `json:"-"`
	// MaxTokens caps this answer's length below the daemon's answer
	// reserve (limits.answer_reserve): 0 (or more than the reserve) is the
	// reserve. The window is planned with the reserve, so a smaller cap
	// changes nothing the backend holds.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Scopes narrows the sigil's scopes for this request (each must be
	// one the sigil holds); none: the sigil's own. The doors take them
	// from the X-Ctxd-Scopes header.
	Scopes []string `json:"scopes,omitempty"`
	// RefreshKarma starts a new karma epoch for the session: the karma
	// block is chosen again (taking in new verifications), which breaks
	// the cached prefix from the karma block on.
	RefreshKarma bool `json:"refresh_karma,omitempty"`
	// Accepted, if set, is called once the request is accepted: its
	// prompt fits (the governor made it fit) and only the backend is left
	// to wait for. A door commits its stream's headers there, so a refusal
	// keeps its HTTP status and a long wait is never silent. Not part of
	// the wire format.
	Accepted func() `json:"-"`
}

// Tool is a function a client offers the model.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"` // a JSON Schema
}

// ToolCall is the model asking for a tool.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"` // a JSON object
}

// SessionIDPattern is what a session id must look like.
var SessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckSessionID is nil for a well-formed session id, else an error of
// kind KindInvalid that names the pattern.
func CheckSessionID(id string) error {
	if !SessionIDPattern.MatchString(id) {
		return Errorf(KindInvalid, "session %q must match %s", id, SessionIDPattern)
	}
	return nil
}

// Event types of an answer stream.
const (
	EventToken   = "token"
	EventSummary = "summary"
	EventError   = "error"
	// EventProgress says what the request waits for before it is
	// answered: a persona loaded, evacuated to make room, or restored.
	EventProgress = "progress"
)

// Event is one line of an answer stream (NDJSON).
type Event struct {
	Type    string   `json:"type"` // EventToken, EventSummary, EventError or EventProgress
	Text    string   `json:"text,omitempty"`
	Summary *Summary `json:"summary,omitempty"`
	Error   string   `json:"error,omitempty"`
	Status  int      `json:"status,omitempty"` // the HTTP status the error would have had before the stream
	Kind    Kind     `json:"kind,omitempty"`
}

// Summary ends every answer: what was sent, what the backend should have
// reused, what it did, how long the request waited, and what the governor
// measured.
type Summary struct {
	// RequestID names the request in the daemon's log (and in the
	// response's X-Request-Id header): the client's id when it sent a
	// valid one, else the daemon's.
	RequestID    string `json:"request_id,omitempty"`
	Session      string `json:"session"`
	Turn         int    `json:"turn"`
	Mode         string `json:"mode"`
	Format       string `json:"format"` // "template" (the model's chat template) or "plain" (ctxd's own)
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"` // prefix the backend slot is expected to hold
	// BackendCachedTokens is what the backend says it reused (llama-server's
	// cache_n), when it says; ReuseNote explains a difference from CachedTokens.
	BackendCachedTokens *int    `json:"backend_cached_tokens,omitempty"`
	ReuseNote           string  `json:"reuse_note,omitempty"`
	EvaluatedTokens     int     `json:"evaluated_tokens"` // prompt tokens the backend evaluated: measured where it reports it, else expected
	ReusePercent        float64 `json:"reuse_percent"`
	// ClientTokens is the client's own part of the prompt: its tools and
	// system text, its conversation and its question (the sigil, state and
	// query blocks, less the codex excerpts ctxd put in the question). The
	// doors report it as the prompt's size: it is what an agent manages
	// (and compacts), while ctxd's share (identity, codex, environment,
	// karma) is ctxd's to shrink to make room for it.
	ClientTokens int `json:"client_tokens"`
	AnswerTokens int `json:"answer_tokens"`
	// TTFTMillis is the time to first token as the client sees it: from
	// the request's arrival at ctxd to the answer's first token. Timing
	// splits it into its parts.
	TTFTMillis     float64 `json:"ttft_ms"`
	Timing         Timing  `json:"timing"`
	PromptEvalMs   float64 `json:"backend_prompt_eval_ms"`
	BackendPromptN int     `json:"backend_prompt_eval_count"`
	TotalMillis    float64 `json:"total_ms"`
	QueueWaitMs    float64 `json:"queue_wait_ms"` // waiting for the session's earlier request and for a slot
	QueueAhead     int     `json:"queue_ahead"`   // requests ahead of this one when it joined the slot queue
	Slot           int     `json:"slot"`          // the backend slot that served it
	DoneReason     string  `json:"done_reason"`
	DoneNote       string  `json:"done_note,omitempty"` // why an answer is incomplete
	// ToolCalls are the calls the answer makes to tools offered to it;
	// the answer's text is then their canonical rendering.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolsRefused names the client's tools the sigil may not use (not
	// offered), and the tools the answer called that were not offered
	// (refused: the answer stays text); ToolNote says which was which.
	ToolsRefused []string     `json:"tools_refused,omitempty"`
	ToolNote     string       `json:"tool_note,omitempty"`
	PrefixBreak  *PrefixBreak `json:"prefix_break,omitempty"`
	PrefixNote   string       `json:"prefix_note,omitempty"`
	// SlotNote says that the backend slot last served another session, so
	// this conversation's own tokens were evaluated again: who went
	// between its turns (an agent's side request, another agent), and the
	// cost is evaluated_tokens.
	SlotNote   string      `json:"slot_note,omitempty"`
	Codex      CodexPlan   `json:"codex"`
	Excerpts   int         `json:"excerpts"`              // codex excerpts retrieved for this query (RAG)
	WorkingSet *WorkingSet `json:"working_set,omitempty"` // RAG with a working set
	Epoch      int         `json:"epoch"`
	Karma      *KarmaInfo  `json:"karma,omitempty"` // the karma block, when the sigil may read karma
	// Trace is the id of the trace this answer was recorded as (0: none,
	// as for an ephemeral ask); karma verify|reject|pin take it.
	Trace    int64    `json:"trace,omitempty"`
	Governor []Action `json:"governor,omitempty"` // what the governor did to make it fit
	Budget   Budget   `json:"budget"`
}

// Timing splits a request's time to first token into its parts; they add
// up to the summary's ttft_ms.
type Timing struct {
	// QueueWaitMs waited for the session's earlier request, then for a
	// backend slot.
	QueueWaitMs float64 `json:"queue_wait_ms"`
	// GovernorMs built and measured the prompt and made it fit: rendering,
	// token counting, retrieval, karma, compaction and condensation.
	GovernorMs float64 `json:"governor_ms"`
	// CondenseMs is the part of GovernorMs spent condensing old turns (a
	// generation of the governor's own on the backend).
	CondenseMs float64 `json:"condense_ms,omitempty"`
	// RestoreMs restored a saved slot (llama-server's warm restarts).
	RestoreMs float64 `json:"restore_ms,omitempty"`
	// BackendTTFTMs is from sending the prompt to the backend to its
	// first token: prompt evaluation, mostly.
	BackendTTFTMs float64 `json:"backend_ttft_ms"`
	// OtherMs is the rest: taking the session, following a client's
	// history, checks.
	OtherMs float64 `json:"other_ms"`
}

// PrefixBreak says where a prompt stopped extending the session's previous
// prompt plus its answer.
type PrefixBreak struct {
	Block  string `json:"block"`  // first block whose bytes changed
	Reason string `json:"reason"` // human-readable cause
}

// CodexPlan says how the codex enters the prompt, and why.
type CodexPlan struct {
	Mode         string  `json:"mode"`          // "cag", "rag" or "none"
	StableTokens int     `json:"stable_tokens"` // identity + codex + environment + sigil + karma, whole; -1 when not rendered
	Threshold    int     `json:"threshold_tokens"`
	Ratio        float64 `json:"cag_ratio"`
	// ClientRoom is the prompt budget kept for the clients' own prompts
	// (their system text, tools and conversation), as the largest one that
	// did not fit measured it; 0 until one did not.
	ClientRoom int    `json:"client_room,omitempty"`
	Reason     string `json:"reason"`
}

// BlockUsage is one block's share of the prompt.
type BlockUsage struct {
	Block  string `json:"block"`
	Chars  int    `json:"chars"`
	Tokens int    `json:"tokens"` // counted block by block, so the sum can differ from the prompt's count by a token or two
}

// Budget is what the governor measured for one request.
type Budget struct {
	Chars         int          `json:"chars"`
	MaxChars      int          `json:"max_chars,omitempty"`
	PromptTokens  int          `json:"prompt_tokens"`
	AnswerReserve int          `json:"answer_reserve"`
	NumCtx        int          `json:"num_ctx"`
	KVBytes       int64        `json:"kv_bytes"`        // KV cache the prompt plus the answer reserve occupy
	KVBudgetBytes int64        `json:"kv_budget_bytes"` // KV cache allocated for num_ctx at load
	Blocks        []BlockUsage `json:"blocks"`
}

// Governor action kinds.
const (
	ActionCompact  = "compact"        // history past max_depth cut in one step (a new epoch)
	ActionCondense = "condense"       // prunable turns summarized by the backend
	ActionPrune    = "prune"          // turns left out of the summarizing prompt
	ActionExcerpts = "excerpts"       // lowest-ranked codex excerpts left out
	ActionStale    = "stale_excerpts" // earlier turns' excerpts left out (a new epoch) to make room for fresh ones
	ActionKarma    = "karma"          // the lowest-scoring unpinned karma entry left out (a new karma epoch)
	ActionLowPower = "low_power"      // the answer capped below the reserve: the machine is on low power
)

// KarmaInfo says which karma the prompt held: the session's karma epoch,
// the traces of its entries in rendering order, and, when the epoch began
// with this request, why.
type KarmaInfo struct {
	Epoch  int     `json:"epoch"`
	Traces []int64 `json:"traces"`
	Began  string  `json:"began,omitempty"`
}

// WorkingSet is what a RAG turn found in the codex block's working set:
// the files most relevant to recent questions, kept in the cached prefix.
type WorkingSet struct {
	Generation int    `json:"generation"`      // counts the working set's moves since the codex loaded
	Files      int    `json:"files"`           // files it holds, whole or in part
	Tokens     int    `json:"tokens"`          // of the codex block with it
	Moved      string `json:"moved,omitempty"` // it moved on this turn (a new codex block), and why
	// Added and Dropped are the pieces (files whole, or chunks) the move
	// added at the working set's end, and dropped from its end first to
	// make room: the block is the same bytes before them.
	Added   int `json:"added,omitempty"`
	Dropped int `json:"dropped,omitempty"`
	// Of this question's top-k excerpts: how many the working set held
	// (nothing added), how many were in the prompt already (an earlier
	// turn's, not repeated), and how many joined the query, with their
	// tokens.
	Hits             int `json:"hits"`
	ExcerptsPresent  int `json:"excerpts_present"`
	ExcerptsNew      int `json:"excerpts_new"`
	ExcerptTokensNew int `json:"excerpt_tokens_new"`
	// Held are the paths of the files it holds, whole or in part (for the
	// trace's binding; not reported).
	Held []string `json:"-"`
}

// Action is one thing the governor did to make a request fit.
type Action struct {
	Kind          string `json:"kind"` // one of the Action* kinds
	Reason        string `json:"reason"`
	TurnsDropped  int    `json:"turns_dropped"`
	TokensDropped int    `json:"tokens_dropped"`
	Epoch         int    `json:"epoch"` // the epoch the session is in afterwards
}

// SigilInfo is GET /v1/sigil: the sigil a request acts as.
type SigilInfo struct {
	Name          string   `json:"name"`
	Scopes        []string `json:"scopes"`
	Authenticated bool     `json:"authenticated"` // by a token; otherwise trusted as the socket's peer (uid)
	Description   string   `json:"description,omitempty"`
}

// DashboardToken is the answer of POST /v1/dashboard/token: a short-lived
// token that opens the dashboard, and only the dashboard, as Sigil.
type DashboardToken struct {
	Sigil string `json:"sigil"`
	Token string `json:"token"`
	// Path opens the dashboard with the token on a TCP listener.
	Path string `json:"path"`
	// Expires is when the token expires if no page uses it; an open page
	// keeps it alive, up to MaxUntil.
	Expires  time.Time `json:"expires"`
	MaxUntil time.Time `json:"max_until"`
	// The listeners that serve the page to a browser: the dashboard's own
	// and the TCP listener ("" for none).
	Dashboard string `json:"dashboard_listen,omitempty"`
	TCP       string `json:"tcp_listen,omitempty"`
}
