package frontdoor

import (
	"encoding/json"

	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/toolcall"
)

// message is one chat message as OpenAI and Ollama clients send it.
type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"` // a string, OpenAI's list of parts, or null
	Name       string          `json:"name,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Images     []string        `json:"images,omitempty"` // Ollama
}

// conversation is a chat request as ctxd asks it.
type conversation struct {
	System  string      // the leading system (or developer) messages, joined
	History []ctxd.Turn // the earlier exchanges
	Query   string      // the last user message (with any tool results or system notes after the last answer)
	// Ephemeral: one question outside any conversation, not recorded.
	Ephemeral bool
}

// continueQuery stands for the user's part of a turn whose assistant
// message came first: a turn's query is never empty.
const continueQuery = "(the conversation starts with the assistant)"

// toConversation maps chat messages onto a session's turns: leading system
// messages are the client's system text; then each run of user messages
// (and tool results, and later system messages, marked as such) is a
// turn's query and the assistant messages that follow it are its answer.
// The run after the last assistant message is the query: the last
// message must be the user's (or a tool result).
func toConversation(msgs []message) (conversation, error) {
	var c conversation
	if len(msgs) == 0 {
		return c, ctxd.Errorf(ctxd.KindInvalid, "messages: required: send at least one user message")
	}
	i := 0
	var system []string
	for ; i < len(msgs) && (msgs[i].Role == "system" || msgs[i].Role == "developer"); i++ {
		text, err := contentText(msgs[i], i)
		if err != nil {
			return c, err
		}
		if strings.TrimSpace(text) != "" {
			system = append(system, strings.TrimSpace(text))
		}
	}
	c.System = strings.Join(system, "\n\n")
	var pending []string // the user side of the turn being built
	answered := false    // the turn being built has an answer
	var cur ctxd.Turn
	flush := func() {
		if answered {
			c.History = append(c.History, cur)
		}
		cur, answered = ctxd.Turn{}, false
	}
	for ; i < len(msgs); i++ {
		m := msgs[i]
		text, err := contentText(m, i)
		if err != nil {
			return c, err
		}
		switch m.Role {
		case "user", "tool", "function", "system", "developer":
			if answered {
				flush()
			}
			switch m.Role {
			case "user":
			case "tool", "function":
				label := "[tool result"
				if m.Name != "" {
					label += " " + m.Name
				}
				text = label + "]\n" + text
			default:
				text = "[system]\n" + text
			}
			pending = append(pending, text)
		case "assistant":
			if !answered {
				if len(pending) == 0 {
					pending = []string{continueQuery}
				}
				cur = ctxd.Turn{Query: strings.Join(pending, "\n\n")}
				pending, answered = nil, true
			} else if cur.Answer != "" && text != "" {
				cur.Answer += "\n\n"
			}
			cur.Answer += text
			calls, err := toolCallsOf(m.ToolCalls, i)
			if err != nil {
				return c, err
			}
			if len(calls) > 0 {
				if cur.Answer != "" {
					cur.Answer += "\n"
				}
				cur.Answer += toolcall.Render(calls)
			}
		default:
			return c, ctxd.Errorf(ctxd.KindInvalid, "messages[%d].role: %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
	}
	if answered || len(pending) == 0 {
		return c, ctxd.Errorf(ctxd.KindInvalid, "messages: the last message must be the user's (or a tool result): ctxd answers the user; it does not continue an assistant message")
	}
	c.Query = strings.Join(pending, "\n\n")
	if strings.TrimSpace(c.Query) == "" {
		return c, ctxd.Errorf(ctxd.KindInvalid, "messages[%d].content: the last user message is empty", len(msgs)-1)
	}
	if c.History == nil {
		c.History = []ctxd.Turn{}
	}
	for k, t := range c.History {
		if strings.TrimSpace(t.Query) == "" {
			c.History[k].Query = continueQuery
		}
	}
	return c, nil
}

// toolCallsOf reads an assistant message's tool calls, in OpenAI's shape
// (arguments a JSON text) or Ollama's (arguments an object). They render
// as the session recorded them (toolcall.Render), so a client that sends
// back the calls it got extends the session's prefix.
func toolCallsOf(raw json.RawMessage, i int) ([]ctxd.ToolCall, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var wire []struct {
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &wire); err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "messages[%d].tool_calls: %v", i, err)
	}
	calls := make([]ctxd.ToolCall, len(wire))
	for k, w := range wire {
		args := w.Function.Arguments
		var text string
		if json.Unmarshal(args, &text) == nil { // OpenAI: a JSON text
			args = json.RawMessage(text)
		}
		if w.Function.Name == "" || (len(strings.TrimSpace(string(args))) > 0 && !json.Valid(args)) {
			return nil, ctxd.Errorf(ctxd.KindInvalid, "messages[%d].tool_calls[%d]: a function name and JSON arguments are required", i, k)
		}
		calls[k] = ctxd.ToolCall{Name: w.Function.Name, Arguments: args}
	}
	return calls, nil
}

// contentText is a message's text: its content string, or the text parts
// of OpenAI's list of parts. Images and other parts are refused: ctxd's
// doors take text.
func contentText(m message, i int) (string, error) {
	if len(m.Images) > 0 {
		return "", ctxd.Errorf(ctxd.KindUnsupported, "messages[%d].images: ctxd's doors take text only", i)
	}
	raw := strings.TrimSpace(string(m.Content))
	if raw == "" || raw == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(m.Content, &s); err != nil {
			return "", ctxd.Errorf(ctxd.KindInvalid, "messages[%d].content: %v", i, err)
		}
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", ctxd.Errorf(ctxd.KindInvalid, "messages[%d].content: a string or a list of text parts: %v", i, err)
	}
	var sb strings.Builder
	for j, p := range parts {
		if p.Type != "text" && p.Type != "input_text" {
			return "", ctxd.Errorf(ctxd.KindUnsupported, "messages[%d].content[%d]: type %q: ctxd's doors take text parts only", i, j, p.Type)
		}
		sb.WriteString(p.Text)
	}
	return sb.String(), nil
}

// promptText is /v1/completions' prompt: a string, or a list of one.
func promptText(raw json.RawMessage) (string, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return "", ctxd.Errorf(ctxd.KindInvalid, "prompt: required")
	}
	if s[0] == '"' {
		var p string
		if err := json.Unmarshal(raw, &p); err != nil {
			return "", ctxd.Errorf(ctxd.KindInvalid, "prompt: %v", err)
		}
		return p, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", ctxd.Errorf(ctxd.KindInvalid, "prompt: a string or a list of one string (token ids are not taken): %v", err)
	}
	if len(list) != 1 {
		return "", ctxd.Errorf(ctxd.KindInvalid, "prompt: a list of %d prompts; ctxd answers one prompt per request", len(list))
	}
	return list[0], nil
}
