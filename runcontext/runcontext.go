package runcontext

import "github.com/ctxd/ctxd"

// RunContext is everything the model sees for one request, in block order.
type RunContext struct {
	Identity    Identity    `json:"identity"`
	Codex       Codex       `json:"codex"`
	Environment Environment `json:"environment"`
	Sigil       Sigil       `json:"sigil"`
	Karma       Karma       `json:"karma"`
	State       State       `json:"state"`
	Query       Query       `json:"query"`
	// Artifacts are texts that formatters (package formatters) inject into
	// the blocks: a stable artifact at the end of its block's content, a
	// volatile one in the query block. They are not a block of their own:
	// each joins the block it names, after that block's own fields.
	Artifacts []Artifact `json:"artifacts,omitempty" jsonschema_description:"texts formatters inject into the blocks"`
}

// Artifact is one text a formatter injects into a block: a tool manifest,
// a project's conventions, a memory summary. Rendering places it; the
// formatter decides only what it says, which block it joins and whether it
// is stable.
//
// A stable artifact joins the cached prefix: it renders at the end of its
// block's content (identity to karma; in the sigil block, before the
// client's instructions), so it must change only
// when what it is derived from does. A volatile artifact joins the tail:
// it renders in the query block, after the query's excerpts and before its
// text, and never changes a byte of the blocks before the query. The
// conversation does not keep volatile artifacts: the next turn's state
// renders this turn's query without them, so the backend's cache is reused
// up to this turn's query, not past it (Compare says so).
//
// Artifacts of one block render sorted by formatter name, then in the
// order given. The text is free text, escaped like any other (a line that
// would read as a marker gets a backslash, see Escape; special token texts
// are broken) and placed on lines of its own: a newline is added when it does not end
// with one. It is placed as it is otherwise: a formatter writes its own
// heading.
type Artifact struct {
	Formatter string `json:"formatter" jsonschema:"pattern=^[a-z][a-z0-9_.-]{0\\,63}$" jsonschema_description:"the formatter that injected it"`
	Block     int    `json:"block" jsonschema:"minimum=0,maximum=6" jsonschema_description:"the block it joins: 0 identity, 1 codex, 2 environment, 3 sigil, 4 karma (stable); 6 query (volatile)"`
	Stable    bool   `json:"stable,omitempty" jsonschema_description:"joins the cached prefix (blocks 0-4); else the query block (6)"`
	Text      string `json:"text" jsonschema:"minLength=1"`
}

// Identity is the persona: the system prompt. Block 1.
type Identity struct {
	Name    string `json:"name" jsonschema:"minLength=1,maxLength=64" jsonschema_description:"persona name"`
	Persona string `json:"persona" jsonschema:"minLength=1" jsonschema_description:"system prompt"`
}

// Codex modes.
const (
	ModeNone = "none" // no codex loaded
	ModeCAG  = "cag"  // whole codex in the prompt
	ModeRAG  = "rag"  // a codex map here, excerpts next to the query
)

// Codex is the loaded tree. Block 2. Body is rendered once when the codex
// is loaded (see package codex), never per request.
type Codex struct {
	Name  string     `json:"name" jsonschema_description:"display name of the codex root; never an absolute path"`
	Mode  string     `json:"mode" jsonschema:"enum=none,enum=cag,enum=rag"`
	Files []CodexRef `json:"files" jsonschema_description:"files in rendering order"`
	Body  string     `json:"body" jsonschema_description:"the rendered files (CAG) or codex map (RAG)"`

	block     string // the rendered block, set by Prerender; never serialized
	bodyValid bool   // Prerender found the block valid: Validate need not scan it again
}

// Prerender renders the codex block once, so that rendering a RunContext
// that holds this codex copies nothing of it, and checks the body once, so
// validating one scans nothing of it: requests share the work. Call it
// again after changing any field.
//
// sp is the model's special token texts: the block is escaped against them
// here, once.
func (c *Codex) Prerender(sp Specials) {
	c.block, c.bodyValid = "", false
	c.block = sp.Escape(renderCodex(*c))
	var v validator
	v.codex(*c)
	c.bodyValid = len(v.errs) == 0
}

// Prerendered reports whether Prerender has rendered the block.
func (c *Codex) Prerendered() bool { return c.block != "" }

// CodexRef names one file of the codex.
type CodexRef struct {
	Path   string `json:"path" jsonschema_description:"slash-separated path relative to the codex root"`
	Bytes  int64  `json:"bytes" jsonschema:"minimum=0"`
	SHA256 string `json:"sha256" jsonschema:"pattern=^[0-9a-f]{64}$"`
}

// Environment is the hardware situation in coarse bands, never raw numbers,
// so it changes only when a band changes. Block 3.
type Environment = ctxd.Environment

// Sigil is the active agent identity and its permission scopes. Block 4.
type Sigil struct {
	Name   string   `json:"name" jsonschema:"pattern=^[a-z0-9][a-z0-9._-]{0\\,63}$"`
	Scopes []string `json:"scopes" jsonschema_description:"sorted, unique permission scopes"`
	Tools  []string `json:"tools,omitempty" jsonschema_description:"tools offered to this sigil, by its scopes"`
	// ClientTools are the tools the client offers the model, as far as
	// the sigil's scopes allow them.
	ClientTools []ClientTool `json:"client_tools,omitempty" jsonschema_description:"the client's tools the sigil's scopes allow"`
	// Instructions is the client's own system message (an OpenAI or
	// Ollama client's). It renders last in the sigil block, after the
	// tools: past ctxd's identity, the codex and the environment, the
	// prefix every agent and every side request shares.
	Instructions string `json:"instructions,omitempty" jsonschema_description:"the client's system message"`
	// ToolFormat says who offers the model the client's tools: "" is
	// ctxd's tool manifest, in this block, with ctxd's protocol for a
	// call; ToolFormatTemplate is the model's own chat template, which
	// renders them (ahead of the conversation) and the calls in its own
	// syntax, and the manifest leaves them out.
	ToolFormat string `json:"tool_format,omitempty" jsonschema:"enum=,enum=template" jsonschema_description:"who offers the client's tools: ctxd's manifest (empty) or the model's chat template"`
}

// ToolFormatTemplate is Sigil.ToolFormat when the model's chat template
// offers the client's tools.
const ToolFormatTemplate = "template"

// ClientTool is a function the client offers the model.
type ClientTool struct {
	Name        string `json:"name" jsonschema:"pattern=^[A-Za-z0-9_.-]{1\\,64}$"`
	Description string `json:"description,omitempty"`
	Parameters  string `json:"parameters,omitempty" jsonschema_description:"JSON Schema of the arguments, compact"`
}

// Karma is the set of verified past traces chosen for this epoch. Block 5.
type Karma struct {
	Epoch   int          `json:"epoch" jsonschema:"minimum=0"`
	Entries []KarmaEntry `json:"entries"`
}

// KarmaEntry is one verified trace or piece of feedback.
type KarmaEntry struct {
	ID       string `json:"id" jsonschema:"minLength=1"`
	Text     string `json:"text" jsonschema:"minLength=1"`
	Verbatim bool   `json:"verbatim,omitempty" jsonschema_description:"consecrated: never pruned or rewritten"`
}

// State is the conversation so far, append-only within an epoch. Block 6.
type State struct {
	Epoch   int    `json:"epoch" jsonschema:"minimum=0"`
	Summary string `json:"summary,omitempty" jsonschema_description:"condensed earlier turns, stored once per epoch"`
	Turns   []Turn `json:"turns"`
}

// Turn is one finished exchange.
type Turn = ctxd.Turn

// Query is this request: the volatile tail. Block 7.
type Query struct {
	Text     string    `json:"text" jsonschema:"minLength=1"`
	Excerpts []Excerpt `json:"excerpts,omitempty" jsonschema_description:"retrieved codex excerpts for this query (RAG)"`
}

// Excerpt is a piece of the codex retrieved for one query.
type Excerpt = ctxd.Excerpt
