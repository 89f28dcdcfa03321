package frontdoor

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/ctxd/ctxd"
)

// openaiChatRequest is the part of a chat completion request ctxd reads.
type openaiChatRequest struct {
	Model         string    `json:"model"`
	Messages      []message `json:"messages"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N *int `json:"n"`
}

// openaiHonoured are the request fields ctxd acts on; the rest (sampling,
// max_tokens, tools, ...) are listed in X-Ctxd-Ignored: ctxd's plan sets
// the sampling and the answer reserve for every client alike.
var openaiHonoured = []string{"model", "messages", "prompt", "stream", "stream_options", "n", "user"}

// Usage is OpenAI's usage object, with the cached tokens ctxd's prefix
// saved.
type Usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func usageOf(s *ctxd.Summary) *Usage {
	u := &Usage{PromptTokens: s.PromptTokens, CompletionTokens: s.AnswerTokens, TotalTokens: s.PromptTokens + s.AnswerTokens}
	u.PromptTokensDetails.CachedTokens = s.CachedTokens
	return u
}

func finishReason(s *ctxd.Summary) string {
	if s.DoneReason == ctxd.DoneLength {
		return "length"
	}
	return "stop"
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
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
	sent, err := d.decode(w, r, &req)
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	eng, model, err := d.engine()
	if err == nil {
		err = checkModel(req.Model, model)
	}
	if err == nil && req.N != nil && *req.N != 1 {
		err = ctxd.Errorf(ctxd.KindInvalid, "n: %d choices asked; ctxd answers with one", *req.N)
	}
	var conv conversation
	if err == nil {
		conv, err = toConversation(req.Messages)
	}
	var session string
	if err == nil {
		session, err = sessionOf(r, "oai", req.Model, conv.System, conv.First)
	}
	var sigil string
	if err == nil {
		sigil, err = d.cfg.Sigil(r)
	}
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	ignored := ignoredOf(sent, openaiHonoured...)
	setSummaryHeaders(w, session, ignored)
	ask := ctxd.AskRequest{Session: session, Query: conv.Query, Sigil: sigil, System: conv.System, History: conv.History}
	d.openaiAnswer(w, r, eng, ask, req.Model, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, "chat.completion", ignored)
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
}

func (d *Doors) openaiCompletion(w http.ResponseWriter, r *http.Request) {
	var req openaiCompletionRequest
	sent, err := d.decode(w, r, &req)
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	eng, model, err := d.engine()
	if err == nil {
		err = checkModel(req.Model, model)
	}
	if err == nil && req.N != nil && *req.N != 1 {
		err = ctxd.Errorf(ctxd.KindInvalid, "n: %d choices asked; ctxd answers with one", *req.N)
	}
	var prompt, session string
	if err == nil {
		prompt, err = promptText(req.Prompt)
	}
	if err == nil && strings.TrimSpace(prompt) == "" {
		err = ctxd.Errorf(ctxd.KindInvalid, "prompt: must not be blank")
	}
	if err == nil {
		session, err = sessionOf(r, "oaic", req.Model, "", prompt)
	}
	var sigil string
	if err == nil {
		sigil, err = d.cfg.Sigil(r)
	}
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	ignored := ignoredOf(sent, openaiHonoured...)
	setSummaryHeaders(w, session, ignored)
	ask := ctxd.AskRequest{Session: session, Query: prompt, Sigil: sigil, History: []ctxd.Turn{}}
	d.openaiAnswer(w, r, eng, ask, req.Model, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, "text_completion", ignored)
}

// openaiAnswer asks and answers in OpenAI's shape: object is
// "chat.completion" or "text_completion".
func (d *Doors) openaiAnswer(w http.ResponseWriter, r *http.Request, eng Engine, ask ctxd.AskRequest, model string, stream, includeUsage bool, object string, ignored []string) {
	chat := object == "chat.completion"
	id, created := newID("chatcmpl-"), d.now().Unix()
	if !chat {
		id = newID("cmpl-")
	}
	if len(ignored) > 0 {
		d.log.Debug("openai door: ignored request fields", "session", ask.Session, "fields", ignored)
	}
	if !stream {
		var sb strings.Builder
		sum, err := eng.Ask(r.Context(), ask, func(t string) error { sb.WriteString(t); return nil })
		if err != nil {
			d.logAskError(ask.Session, err)
			WriteOpenAIError(w, err)
			return
		}
		fr := finishReason(sum)
		c := completion{ID: id, Object: object, Created: created, Model: model, Usage: usageOf(sum), Ctxd: sum}
		text := sb.String()
		if chat {
			c.Choices = []chatChoice{{Message: &chatMessage{Role: "assistant", Content: text}, FinishReason: &fr}}
		} else {
			c.Choices = []chatChoice{{Text: &text, FinishReason: &fr}}
		}
		writeJSON(w, http.StatusOK, c)
		return
	}
	s := &streamer{w: w, timeout: d.cfg.WriteTimeout, sse: true}
	chunkObject := "chat.completion.chunk"
	if !chat {
		chunkObject = "text_completion"
	}
	chunk := func(text string, role string, fr *string) completion {
		c := completion{ID: id, Object: chunkObject, Created: created, Model: model}
		if chat {
			c.Choices = []chatChoice{{Delta: &chatMessage{Role: role, Content: text}, FinishReason: fr}}
		} else {
			c.Choices = []chatChoice{{Text: &text, FinishReason: fr}}
		}
		return c
	}
	first := true
	sum, err := eng.Ask(r.Context(), ask, func(t string) error {
		role := ""
		if first && chat {
			role = "assistant"
		}
		first = false
		return s.send(chunk(t, role, nil))
	})
	if err != nil {
		d.logAskError(ask.Session, err)
		if !s.started {
			WriteOpenAIError(w, err)
			return
		}
		_, body := openaiErrorOf(err)
		_ = s.send(body)
		return
	}
	fr := finishReason(sum)
	last := chunk("", "", &fr)
	if first && chat {
		last.Choices[0].Delta.Role = "assistant"
	}
	last.Ctxd = sum
	if err := s.send(last); err != nil {
		return
	}
	if includeUsage {
		if err := s.send(completion{ID: id, Object: chunkObject, Created: created, Model: model, Choices: []chatChoice{}, Usage: usageOf(sum)}); err != nil {
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
	_, m, err := d.engine()
	if err != nil {
		WriteOpenAIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []openaiModel{toOpenAIModel(m)}})
}

func (d *Doors) openaiModel(w http.ResponseWriter, r *http.Request) {
	_, m, err := d.engine()
	if err == nil {
		err = checkModel(r.PathValue("model"), m)
	}
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
