package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd"
)

// maxK is the most excerpts search_codex returns (the daemon's cap).
const maxK = 50

// askInput is the ask tool's arguments. Its schema is askTool's.
type askInput struct {
	Query   string `json:"query"`
	Session string `json:"session,omitempty"`
	Pin     bool   `json:"pin,omitempty"`
	Persona string `json:"persona,omitempty"` // the persona that answers ("": the default)
}

// askOutput is the ask tool's structured result: the summary's headline
// figures.
type askOutput struct {
	Session         string  `json:"session" jsonschema:"the session the turn joined: pass it again to continue the conversation"`
	Turn            int     `json:"turn" jsonschema:"the turn's number in the session"`
	Mode            string  `json:"mode" jsonschema:"how the codex entered the prompt: cag (whole), rag (retrieved) or none"`
	PromptTokens    int     `json:"prompt_tokens" jsonschema:"tokens in the prompt sent to the model"`
	CachedTokens    int     `json:"cached_tokens" jsonschema:"prompt tokens the model server could reuse from its cache"`
	EvaluatedTokens int     `json:"evaluated_tokens" jsonschema:"prompt tokens the model server had to evaluate"`
	ReusePercent    float64 `json:"reuse_percent" jsonschema:"cached_tokens as a percentage of prompt_tokens"`
	AnswerTokens    int     `json:"answer_tokens" jsonschema:"tokens in the answer"`
	Note            string  `json:"note,omitempty" jsonschema:"why the answer is incomplete, when it is"`
}

var askTool = &mcp.Tool{
	Name:  "ask",
	Title: "Ask the local model",
	Description: "Ask the local model a question about the codebase ctxd serves (its codex). " +
		"Turns of one session build on each other and reuse the model server's cache; " +
		"without a session the connection's own is used. Returns the answer, and how much of the prompt was reused.",
	InputSchema: json.RawMessage(`{
	"type": "object",
	"properties": {
		"query": {"type": "string", "minLength": 1, "description": "the question"},
		"session": {"type": "string", "pattern": ` + quote(ctxd.SessionIDPattern.String()) + `,
			"description": "the conversation to continue or start (default: one fixed for this MCP connection)"},
		"pin": {"type": "boolean", "description": "keep this turn verbatim: never compacted or condensed"},
		"persona": {"type": "string", "description": "the persona that answers, where the daemon serves several (default: its default one)"}
	},
	"required": ["query"],
	"additionalProperties": false
}`),
}

// ask sends the query to the daemon and collects the streamed answer.
func (s *Server) ask(ctx context.Context, req *mcp.CallToolRequest, in askInput) (*mcp.CallToolResult, *askOutput, error) {
	if strings.TrimSpace(in.Query) == "" {
		return nil, nil, errors.New("ask: query is required: give the question")
	}
	session := in.Session
	if session == "" {
		session = s.defaultSession(req.Session)
	} else if err := ctxd.CheckSessionID(session); err != nil {
		return nil, nil, fmt.Errorf("ask: %w", err)
	}
	var answer strings.Builder
	sum, err := s.daemon.Ask(ctx, ctxd.AskRequest{Session: session, Query: in.Query, Pin: in.Pin, Persona: in.Persona}, func(t string) { answer.WriteString(t) })
	if err != nil {
		s.log.Warn("ask failed", "session", session, "err", err)
		return nil, nil, fmt.Errorf("ask failed: %s", describe(err))
	}
	out := &askOutput{
		Session: sum.Session, Turn: sum.Turn, Mode: sum.Mode,
		PromptTokens: sum.PromptTokens, CachedTokens: sum.CachedTokens, EvaluatedTokens: sum.EvaluatedTokens,
		ReusePercent: sum.ReusePercent, AnswerTokens: sum.AnswerTokens, Note: sum.DoneNote,
	}
	text := answer.String()
	if text == "" {
		text = "(the model answered nothing)"
	}
	figures := fmt.Sprintf("[session %s turn %d · %s · %d prompt tokens, %d cached (%.1f%%), %d evaluated · %d answer tokens]",
		out.Session, out.Turn, out.Mode, out.PromptTokens, out.CachedTokens, out.ReusePercent, out.EvaluatedTokens, out.AnswerTokens)
	if out.Note != "" {
		figures += " answer incomplete: " + out.Note
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}, &mcp.TextContent{Text: figures}}}, out, nil
}

// searchInput is the search_codex tool's arguments. Its schema is
// searchTool's.
type searchInput struct {
	Query string `json:"query"`
	K     int    `json:"k,omitempty"`
}

// excerpt is one search hit (ctxd.Excerpt, whose schema tags the MCP SDK
// does not read).
type excerpt struct {
	Path  string `json:"path" jsonschema:"the file, relative to the codex root"`
	Lines string `json:"lines,omitempty" jsonschema:"the excerpt's first and last line, as first-last"`
	Text  string `json:"text" jsonschema:"the excerpt"`
}

// searchOutput is the search_codex tool's structured result.
type searchOutput struct {
	Query    string    `json:"query"`
	Excerpts []excerpt `json:"excerpts" jsonschema:"best match first"`
}

var searchTool = &mcp.Tool{
	Name:  "search_codex",
	Title: "Search the codex",
	Description: "Full-text search of the codebase ctxd serves (its codex): the excerpts that best match the query, best first, " +
		"each with its file and lines. Works when the codex is retrieved from (RAG mode); a codex loaded whole is not indexed for search.",
	InputSchema: json.RawMessage(`{
	"type": "object",
	"properties": {
		"query": {"type": "string", "minLength": 1, "description": "words to search for"},
		"k": {"type": "integer", "minimum": 1, "maximum": 50, "description": "how many excerpts (default 5)"}
	},
	"required": ["query"],
	"additionalProperties": false
}`),
}

// search asks the daemon for the excerpts that best match the query.
func (s *Server) search(ctx context.Context, _ *mcp.CallToolRequest, in searchInput) (*mcp.CallToolResult, *searchOutput, error) {
	q := strings.TrimSpace(in.Query)
	if q == "" {
		return nil, nil, errors.New("search_codex: query is required: give words to search for")
	}
	// k = 0 is "absent": the schema refuses a 0 that was sent.
	if in.K < 0 || in.K > maxK {
		return nil, nil, fmt.Errorf("search_codex: k %d must be from 1 to %d", in.K, maxK)
	}
	ex, err := s.daemon.SearchCodex(ctx, q, in.K)
	if err != nil {
		return nil, nil, fmt.Errorf("search_codex failed: %s", describe(err))
	}
	out := &searchOutput{Query: q, Excerpts: make([]excerpt, len(ex))}
	var b strings.Builder
	if len(ex) == 0 {
		fmt.Fprintf(&b, "no excerpt of the codex matches %q", q)
	}
	for i, e := range ex {
		out.Excerpts[i] = excerpt(e)
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(e.Path)
		if e.Lines != "" {
			b.WriteString(":" + e.Lines)
		}
		b.WriteString("\n" + strings.TrimRight(e.Text, "\n"))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}

var statusTool = &mcp.Tool{
	Name:        "status",
	Title:       "ctxd status",
	Description: "The ctxd daemon's state as JSON (GET /v1/status): its backend and model, the codex, slots and sessions.",
	InputSchema: json.RawMessage(`{"type": "object", "properties": {}, "additionalProperties": false}`),
}

// status is the daemon's GET /v1/status.
func (s *Server) status(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, map[string]any, error) {
	var st map[string]any
	if err := s.daemon.Status(ctx, &st); err != nil {
		return nil, nil, fmt.Errorf("status failed: %s", describe(err))
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("status: %w", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, st, nil
}

// quote is s as a JSON string.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
