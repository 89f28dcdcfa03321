package ctxd

import "strings"

// Session is a conversation as stored.
type Session struct {
	ID      string
	Epoch   int
	Summary string  // condensed turns of earlier epochs, if any
	Turns   []Turn  // the turns of the current epoch, oldest first
	Seqs    []int64 // the turns' sequence numbers, parallel to Turns
	Count   int     // turns in all epochs
	Owner   string  // the sigil that owns it ("" before ownership was recorded)
}

// Turn is one finished exchange.
type Turn struct {
	Query    string    `json:"query"`
	Excerpts []Excerpt `json:"excerpts,omitempty"`
	Answer   string    `json:"answer"`
	Verbatim bool      `json:"verbatim,omitempty" jsonschema_description:"pinned: never pruned or rewritten"`
}

// Excerpt is a piece of the codex retrieved for one query.
type Excerpt struct {
	Path  string `json:"path"`
	Lines string `json:"lines,omitempty" jsonschema:"pattern=^[0-9]+-[0-9]+$"`
	Text  string `json:"text"`
}

// SessionInfo is one line of the session list.
type SessionInfo struct {
	ID    string `json:"id"`
	Epoch int    `json:"epoch"`
	Turns int    `json:"turns"`
	Sigil string `json:"sigil"` // its owner ("" before ownership was recorded)
}

// SessionTurns is GET /v1/sessions/{id}: the current epoch's turns.
type SessionTurns struct {
	Session string `json:"session"`
	Epoch   int    `json:"epoch"`
	Turns   []Turn `json:"turns"`
}

// PromptBlock is where one block sits in a rendered prompt, in bytes.
type PromptBlock struct {
	Name   string `json:"name"`
	Offset int    `json:"offset"`
	Bytes  int    `json:"bytes"`
}

// LastPrompt is GET /v1/sessions/{id}/prompt: the exact text the session's
// last request sent to the backend, and where each block starts in it.
type LastPrompt struct {
	Session string        `json:"session"`
	Prompt  string        `json:"prompt"`
	Stop    []string      `json:"stop"` // the stop sequences sent with it
	Blocks  []PromptBlock `json:"blocks"`
}

// SharedStart is how many bytes a and b begin with alike: how the doors
// and the sessions tell a message an agent rewrote (a reminder taken off
// its end) from another.
func SharedStart(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// SessionScope joins a client's session id and its sigil's name into the
// id of that sigil's own session ('@' is in no client's id).
const SessionScope = "@"

// ScopedSessionID is the session that sigil's session id names, given
// the owner of the session stored under id ("" for none, or one made
// before owners were recorded) and the default sigil's name. Session ids
// are per sigil: the same id named by two sigils names two sessions, so
// no sigil can learn whether another's exists nor take it. An id the
// sigil owns already (every id of the default sigil's, and sessions made
// before ids were per sigil) names itself; any other is the id and the
// sigil's name, joined by SessionScope.
func ScopedSessionID(owner, sigil, defaultSigil, id string) string {
	if owner == sigil || owner == "" && sigil == defaultSigil {
		return id
	}
	return id + SessionScope + sigil
}

// ClientSessionID is the id a client named, of a session id
// ScopedSessionID gave.
func ClientSessionID(id string) string {
	client, _, _ := strings.Cut(id, SessionScope)
	return client
}
