package ctxd

// WebSocket message types (GET /v1/ws). A client sends asks, cancels and
// feedback; the daemon sends tokens, summaries, errors and notices.
const (
	WSAsk      = "ask"      // client: start an ask (id, session, query, ...)
	WSCancel   = "cancel"   // client: stop the running ask with this id
	WSFeedback = "feedback" // client: judge an answer's trace (karma); the daemon answers with a feedback message or an error

	WSToken   = "token"   // daemon: a piece of an ask's answer
	WSSummary = "summary" // daemon: an ask's last message when it succeeded
	WSError   = "error"   // daemon: an ask's last message when it failed, or a refused message
	WSNotice  = "notice"  // daemon: something changed that the agent may care about
)

// Notices the daemon pushes (WSMessage.Notice).
const (
	NoticeCodexReloaded = "codex_reloaded" // a new codex is in use: Codex says how it enters prompts
	NoticeEnvironment   = "environment"    // an environment band changed: Environment holds the new bands
	NoticeEpoch         = "epoch"          // an ask moved its session to a new epoch: Session, Epoch, Actions
)

// WSMessage is one JSON text message of a WebSocket session, in either
// direction; Type says which fields matter.
//
// An error message with an ID ends the ask of that ID (or answers the
// feedback of that ID); one without an ID answers a message that could not
// be tied to an ask: malformed JSON, a missing or unknown type, a missing
// ID, or the ID of an ask that is still running.
type WSMessage struct {
	Type string `json:"type"`
	ID   string `json:"id,omitempty"` // the client's name for one ask, unique among its running asks

	// Ask (client): the fields of an AskRequest.
	Session   string `json:"session,omitempty"`
	Query     string `json:"query,omitempty"`
	Pin       bool   `json:"pin,omitempty"`
	Sigil     string `json:"sigil,omitempty"`
	System    string `json:"system,omitempty"`
	History   []Turn `json:"history,omitzero"` // an empty list is sent: the session follows it
	MaxTokens int    `json:"max_tokens,omitempty"`

	// Feedback (client): judge trace Trace of the connection's sigil with
	// Action (verify, reject, pin, unpin, supersede), Note and, to
	// supersede, By. Feedback (daemon): Judged is the trace after it.
	Trace  int64  `json:"trace,omitempty"`
	Action string `json:"action,omitempty"`
	Note   string `json:"note,omitempty"`
	By     int64  `json:"by,omitempty"`
	Judged *Trace `json:"judged,omitempty"`

	// Token, summary, error (daemon).
	Text    string   `json:"text,omitempty"`
	Summary *Summary `json:"summary,omitempty"`
	Error   string   `json:"error,omitempty"`
	Kind    Kind     `json:"kind,omitempty"`
	Status  int      `json:"status,omitempty"` // the HTTP status the error has on the native API

	// Notice (daemon). Session and Epoch are also set for NoticeEpoch.
	Notice      string       `json:"notice,omitempty"`
	Codex       *CodexPlan   `json:"codex,omitempty"`
	Environment *Environment `json:"environment,omitempty"`
	Epoch       int          `json:"epoch,omitempty"`
	Actions     []string     `json:"actions,omitempty"` // the governor actions that started the epoch
	// Dropped counts the notices this connection missed before this one
	// because it did not take them fast enough.
	Dropped int `json:"dropped,omitempty"`
}

// AskRequest is the ask a message of type WSAsk carries.
func (m WSMessage) AskRequest() AskRequest {
	return AskRequest{Session: m.Session, Query: m.Query, Sigil: m.Sigil, Pin: m.Pin, System: m.System, History: m.History, MaxTokens: m.MaxTokens}
}

// WSAskMessage is the message that sends req as the ask id.
func WSAskMessage(id string, req AskRequest) WSMessage {
	return WSMessage{Type: WSAsk, ID: id, Session: req.Session, Query: req.Query, Sigil: req.Sigil, Pin: req.Pin, System: req.System, History: req.History, MaxTokens: req.MaxTokens}
}
