package frontdoor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// openaiChatRequest is the part of a chat completion request ctxd reads.
type openaiChatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N          *int            `json:"n"`
	Tools      []openaiTool    `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"`
	answerLimits
}

// answerLimits are the request fields that cap the answer's length.
type answerLimits struct {
	MaxTokens           *float64 `json:"max_tokens"`
	MaxCompletionTokens *float64 `json:"max_completion_tokens"` // OpenAI's newer name; it wins
}

// apply sets ask's cap from the fields and returns the one honoured (""
// if none). A cap under 1 is refused, as OpenAI refuses it.
func (l answerLimits) apply(ask *ctxd.AskRequest, m Model) (string, error) {
	field, v := "max_completion_tokens", l.MaxCompletionTokens
	if v == nil {
		field, v = "max_tokens", l.MaxTokens
	}
	if v == nil {
		return "", nil
	}
	if *v < 1 {
		return "", ctxd.Errorf(ctxd.KindInvalid, "%s: %v is below the minimum, 1", field, *v)
	}
	n, ok := answerCap(*v, m)
	if !ok {
		return "", nil
	}
	ask.MaxTokens = n
	return field, nil
}

// openaiHonoured are the request fields ctxd always acts on; the rest
// (sampling, ...) are listed in X-Ctxd-Ignored: ctxd's plan sets the
// sampling for every client alike. A cap on the answer (max_tokens,
// max_completion_tokens) is honoured under the answer reserve.
var openaiHonoured = []string{"model", "messages", "prompt", "stream", "stream_options", "n", "user", "tools", "tool_choice"}

// Usage is OpenAI's usage object. Its prompt is the client's own part of
// the prompt (see clientPrompt).
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(s *ctxd.Summary) *Usage {
	prompt, cached := clientPrompt(s)
	u := &Usage{PromptTokens: prompt, CompletionTokens: s.AnswerTokens, TotalTokens: prompt + s.AnswerTokens}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

// clientPrompt is the prompt as the doors report it to a client: its own
// part (its tools and system text, its conversation, its question: the
// summary's client_tokens), and how much of that was reused — all of it
// but what the backend evaluated (measured where the backend says, as
// llama-server does). ctxd's own share (identity, codex, environment,
// karma) is left out: an agent sizes and compacts its conversation by the
// prompt it is told of, and ctxd's share is ctxd's to shrink to make room
// for it, not the agent's to make room for. The whole prompt is in the
// summary (ctxd.prompt_tokens).
func clientPrompt(s *ctxd.Summary) (prompt, cached int) {
	return s.ClientTokens, max(0, s.ClientTokens-s.EvaluatedTokens)
}

func finishReason(s *ctxd.Summary) string {
	if s.DoneReason == ctxd.DoneLength {
		return "length"
	}
	return "stop"
}

type chatMessage struct {
	Role      string           `json:"role,omitempty"`
	Content   *string          `json:"content"` // null beside tool calls
	ToolCalls []openaiToolCall `json:"tool_calls,omitempty"`
}

// openaiToolCall is a tool call in OpenAI's shape: the arguments are a
// JSON text.
type openaiToolCall struct {
	Index    *int   `json:"index,omitempty"` // in stream chunks
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func toOpenAIToolCalls(calls []ctxd.ToolCall, stream bool) []openaiToolCall {
	out := make([]openaiToolCall, len(calls))
	for i, c := range calls {
		out[i] = openaiToolCall{ID: newID("call_"), Type: "function"}
		out[i].Function.Name, out[i].Function.Arguments = c.Name, string(c.Arguments)
		if stream {
			out[i].Index = &i
		}
	}
	return out
}

// openaiTool is a tool definition in OpenAI's shape.
type openaiTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolsOf reads a request's tool definitions (OpenAI's and Ollama's share
// a shape); tool_choice "none" offers none.
func toolsOf(defs []openaiTool, choice json.RawMessage) ([]ctxd.Tool, error) {
	if strings.TrimSpace(string(choice)) == `"none"` {
		return nil, nil
	}
	var out []ctxd.Tool
	for i, d := range defs {
		if d.Type != "" && d.Type != "function" {
			return nil, ctxd.Errorf(ctxd.KindInvalid, "tools[%d].type: %q; ctxd offers function tools", i, d.Type)
		}
		if d.Function.Name == "" {
			return nil, ctxd.Errorf(ctxd.KindInvalid, "tools[%d].function.name: required", i)
		}
		out = append(out, ctxd.Tool{Name: d.Function.Name, Description: d.Function.Description, Parameters: d.Function.Parameters})
	}
	return out, nil
}

// toolChoiceHonoured: ctxd offers the tools and the model chooses
// ("auto"), or offers none ("none"); it cannot force a call.
func toolChoiceHonoured(choice json.RawMessage) bool {
	c := strings.TrimSpace(string(choice))
	return c == "" || c == "null" || c == `"auto"` || c == `"none"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Text         *string      `json:"text,omitempty"` // completions
	FinishReason *string      `json:"finish_reason"`
	Logprobs     *struct{}    `json:"logprobs"`
}

// completion is a chat completion, a chunk of one, or a text completion.
type completion struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chatChoice  `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
	Ctxd    *ctxd.Summary `json:"ctxd,omitempty"` // ctxd's summary of the request: reuse, governor, codex
}

func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func (d *Doors) openaiChat(w http.ResponseWriter, r *http.Request) {
	var req openaiChatRequest
	sent, eng, m, release, err := d.open(w, r, &req, &req.Model)
	defer release()
	if err == nil && req.N != nil && *req.N != 1 {
		err = ctxd.Errorf(ctxd.KindInvalid, "n: %d choices asked; ctxd answers with one", *req.N)
	}
	var conv conversation
	if err == nil {
		conv, err = toConversation(req.Messages)
	}
	var tools []ctxd.Tool
	if err == nil {
		tools, err = toolsOf(req.Tools, req.ToolChoice)
	}
	var ask ctxd.AskRequest
	var sigil runcontext.Sigil
	var follow following
	if err == nil {
		ask, sigil, follow, err = d.ask(r, "oai", req.Model, conv, tools)
	}
	var capped string
	if err == nil {
		capped, err = req.apply(&ask, m)
	}
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	honoured := append(slices.Clone(openaiHonoured), capped)
	if !toolChoiceHonoured(req.ToolChoice) {
		honoured = slices.DeleteFunc(honoured, func(f string) bool { return f == "tool_choice" })
	}
	ignored := append(ignoredOf(sent, honoured...), d.notAllowed(sigil, tools)...)
	setSummaryHeaders(w, ask.Session, ignored)
	d.openaiAnswer(w, r, eng, m.ToolOpen, ask, sigil, follow, req.Model, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, "chat.completion", ignored)
}

// openaiCompletionRequest is the part of a text completion request ctxd
// reads. Each completion is a conversation of one turn.
type openaiCompletionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N *int `json:"n"`
	answerLimits
}

func (d *Doors) openaiCompletion(w http.ResponseWriter, r *http.Request) {
	var req openaiCompletionRequest
	sent, eng, m, release, err := d.open(w, r, &req, &req.Model)
	defer release()
	if err == nil && req.N != nil && *req.N != 1 {
		err = ctxd.Errorf(ctxd.KindInvalid, "n: %d choices asked; ctxd answers with one", *req.N)
	}
	var prompt string
	if err == nil {
		prompt, err = promptText(req.Prompt)
	}
	if err == nil && strings.TrimSpace(prompt) == "" {
		err = ctxd.Errorf(ctxd.KindInvalid, "prompt: must not be blank")
	}
	var ask ctxd.AskRequest
	var sigil runcontext.Sigil
	if err == nil {
		ask, sigil, _, err = d.ask(r, "oaic", req.Model, oneTurn("", prompt), nil)
	}
	var capped string
	if err == nil {
		capped, err = req.apply(&ask, m)
	}
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	ignored := ignoredOf(sent, append(slices.Clone(openaiHonoured), capped)...)
	setSummaryHeaders(w, ask.Session, ignored)
	d.openaiAnswer(w, r, eng, m.ToolOpen, ask, sigil, following{}, req.Model, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, "text_completion", ignored)
}

// openaiAnswer asks and answers in OpenAI's shape: object is
// "chat.completion" or "text_completion". A stream's headers go out when
// the request is accepted, and keep-alive comments while the prompt is
// read (see streamer). When tools are offered, text streams as it comes
// and tool calls are sent whole once recognised (see toolSniffer).
func (d *Doors) openaiAnswer(w http.ResponseWriter, r *http.Request, eng Engine, toolOpen string, ask ctxd.AskRequest, sigil runcontext.Sigil, follow following, model string, stream, includeUsage bool, object string, ignored []string) {
	chat := object == "chat.completion"
	id, created := newID("chatcmpl-"), d.now().Unix()
	if !chat {
		id = newID("cmpl-")
	}
	if len(ignored) > 0 {
		d.log.Debug("openai door: ignored request fields", "session", ask.Session, "fields", ignored)
	}
	var sb strings.Builder // the answer's text
	var s *streamer
	var sniff *toolSniffer
	chunkObject := object
	if stream {
		s = &streamer{w: w, timeout: d.cfg.WriteTimeout, sse: true}
		sniff = d.startStream(s, &ask, toolOpen, sseBeat)
		if chat {
			chunkObject = "chat.completion.chunk"
		}
	}
	newCompletion := func() completion {
		return completion{ID: id, Object: chunkObject, Created: created, Model: model}
	}
	// choice is one choice: the message (or delta) with text or tool
	// calls, and its finish reason (nil in a stream's middle chunks).
	choice := func(text string, role string, calls []ctxd.ToolCall, fr *string) chatChoice {
		if !chat {
			return chatChoice{Text: &text, FinishReason: fr}
		}
		m := &chatMessage{Role: role, Content: &text}
		if len(calls) > 0 {
			m.Content, m.ToolCalls = nil, toOpenAIToolCalls(calls, stream)
		}
		if stream {
			return chatChoice{Delta: m, FinishReason: fr}
		}
		return chatChoice{Message: m, FinishReason: fr}
	}
	first := true // no delta sent yet: the first carries the role
	role := func() string {
		if first && chat {
			first = false
			return "assistant"
		}
		return ""
	}
	sendText := func(t string) error {
		if t == "" {
			return nil
		}
		c := newCompletion()
		c.Choices = []chatChoice{choice(t, role(), nil, nil)}
		return s.send(c)
	}
	sum, err := eng.AskAs(r.Context(), sigil, ask, func(t string) error {
		sb.WriteString(t)
		if !stream {
			return nil
		}
		if sniff != nil {
			t = sniff.feed(t)
		}
		return sendText(t)
	})
	started := stream && s.release()
	if err != nil {
		d.logAskError(ask.Session, err)
		if !started {
			WriteOpenAIError(w, err)
			return
		}
		_, body := openaiErrorOf(err)
		_ = s.send(body)
		return
	}
	follow.answered(sum.Session, answerAsSent(sb.String(), sum))
	fr := finishReason(sum)
	if len(sum.ToolCalls) > 0 {
		fr = "tool_calls"
	}
	if !stream {
		c := newCompletion()
		c.Usage, c.Ctxd = usageOf(sum), sum
		c.Choices = []chatChoice{choice(sb.String(), "assistant", sum.ToolCalls, &fr)}
		writeJSON(w, http.StatusOK, c)
		return
	}
	switch {
	case len(sum.ToolCalls) > 0: // recognised at the end: the calls in one chunk
		c := newCompletion()
		c.Choices = []chatChoice{choice("", role(), sum.ToolCalls, nil)}
		if err := s.send(c); err != nil {
			return
		}
	case sniff != nil: // held as a possible call, and text after all
		if err := sendText(sniff.rest()); err != nil {
			return
		}
	}
	last := newCompletion()
	last.Choices = []chatChoice{choice("", role(), nil, &fr)}
	last.Ctxd = sum
	if err := s.send(last); err != nil {
		return
	}
	if includeUsage {
		u := newCompletion()
		u.Choices, u.Usage = []chatChoice{}, usageOf(sum)
		if err := s.send(u); err != nil {
			return
		}
	}
	_ = s.raw([]byte("[DONE]"))
}

// openaiModel is one entry of GET /v1/models.
type openaiModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// ctxd's window for the model: what a client should size prompts to.
	ContextLength int `json:"context_length,omitempty"`
}

func toOpenAIModel(m Model) openaiModel {
	return openaiModel{ID: m.Name, Object: "model", Created: m.Loaded.Unix(), OwnedBy: "ctxd", ContextLength: m.NumCtx}
}

func (d *Doors) openaiModels(w http.ResponseWriter, r *http.Request) {
	ms, err := d.models(r)
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	list := []openaiModel{}
	for _, m := range ms {
		list = append(list, toOpenAIModel(m))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": list})
}

func (d *Doors) openaiModel(w http.ResponseWriter, r *http.Request) {
	m, err := d.model(r, r.PathValue("model"))
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, toOpenAIModel(m))
}

// logAskError logs a failed ask as the native API does.
func (d *Doors) logAskError(session string, err error) {
	switch k := ctxd.KindOf(err); k {
	case ctxd.KindInternal, ctxd.KindNotRecorded:
		d.log.Error("ask failed", "session", session, "kind", k, "err", err)
	case ctxd.KindBackend, ctxd.KindUnavailable:
		d.log.Warn("ask failed", "session", session, "kind", k, "err", err)
	}
}
