package frontdoor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// ollamaAPIVersion is the Ollama API this door speaks, reported by
// /api/version when the backend is not Ollama (which reports its own).
const ollamaAPIVersion = "0.6.5"

// ollamaChatRequest is the part of an /api/chat request ctxd reads.
type ollamaChatRequest struct {
	Model    string          `json:"model"`
	Messages []message       `json:"messages"`
	Tools    []openaiTool    `json:"tools"`
	Stream   *bool           `json:"stream"` // Ollama streams unless told not to
	Format   json.RawMessage `json:"format"`
	Options  map[string]any  `json:"options"`
}

// ollamaGenerateRequest is the part of an /api/generate request ctxd reads.
type ollamaGenerateRequest struct {
	Model    string          `json:"model"`
	Prompt   string          `json:"prompt"`
	System   string          `json:"system"`
	Stream   *bool           `json:"stream"`
	Format   json.RawMessage `json:"format"`
	Options  map[string]any  `json:"options"`
	Raw      bool            `json:"raw"`
	Template string          `json:"template"`
	Suffix   string          `json:"suffix"`
	Images   []string        `json:"images"`
}

// ollamaTemplate is the template /api/show reports. ctxd renders the
// prompt itself; the template says what a request's prompt holds, and
// names .Tools because clients read the template to learn whether the
// model takes tools (LiteLLM does) and every model here does.
const ollamaTemplate = "{{ if .System }}{{ .System }}{{ end }}{{ if .Tools }}{{ .Tools }}{{ end }}{{ .Prompt }}"

// ollamaHonoured are the fields ctxd acts on. Options are never forwarded:
// num_ctx, num_batch and the like would make Ollama reload the model, and
// sampling is the daemon's plan for every client; each one sent is listed
// as ignored.
var ollamaHonoured = []string{"model", "messages", "prompt", "system", "stream", "options", "raw", "template", "suffix", "images", "format", "tools"}

// ollamaIgnored lists the fields and options a request sent that ctxd did
// not act on, options as "options.NAME".
// capped says whether options.num_predict was honoured (ollamaCap).
func ollamaIgnored(sent []string, options map[string]any, capped bool) []string {
	out := ignoredOf(sent, ollamaHonoured...)
	for k := range options {
		if k != "num_predict" || !capped {
			out = append(out, "options."+k)
		}
	}
	slices.Sort(out)
	return out
}

// ollamaCap sets ask's cap on the answer from options.num_predict where
// ctxd honours it (see answerCap), and says whether it did; -1 and -2
// (Ollama's "until done" and "fill the window") and larger caps are
// ignored.
func ollamaCap(options map[string]any, ask *ctxd.AskRequest, m Model) bool {
	v, ok := options["num_predict"].(float64)
	if !ok {
		return false
	}
	ask.MaxTokens, ok = answerCap(v, m)
	return ok
}

// refuseUnsupported names what an Ollama request asks that ctxd cannot do:
// structured output, raw prompts and templates (ctxd renders the prompt),
// images, suffixes.
func refuseUnsupported(format json.RawMessage, raw bool, template, suffix string, images []string) error {
	switch f := strings.TrimSpace(string(format)); {
	case f != "" && f != "null" && f != `""`:
		return ctxd.Errorf(ctxd.KindInvalid, "format: structured output is not supported by ctxd's door")
	case raw:
		return ctxd.Errorf(ctxd.KindInvalid, "raw: ctxd renders the prompt itself (the RunContext in cache order); send the text as prompt without raw")
	case template != "":
		return ctxd.Errorf(ctxd.KindInvalid, "template: ctxd renders the prompt in the model's own template; a request's template is not taken")
	case suffix != "":
		return ctxd.Errorf(ctxd.KindInvalid, "suffix: fill-in-the-middle is not supported by ctxd's door")
	case len(images) > 0:
		return ctxd.Errorf(ctxd.KindUnsupported, "images: ctxd's doors take text only")
	}
	return nil
}

// ollamaMessage is a message in Ollama's answers.
type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
}

// ollamaToolCall is a tool call in Ollama's shape: the arguments are an
// object.
type ollamaToolCall struct {
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

func toOllamaToolCalls(calls []ctxd.ToolCall) []ollamaToolCall {
	out := make([]ollamaToolCall, len(calls))
	for i, c := range calls {
		out[i].Function.Name, out[i].Function.Arguments = c.Name, c.Arguments
	}
	return out
}

// ollamaCtxd is ctxd's own part of a final answer.
type ollamaCtxd struct {
	Session string        `json:"session"`
	Ignored []string      `json:"ignored,omitempty"` // fields and options not acted on (never forwarded to the backend)
	Summary *ctxd.Summary `json:"summary,omitempty"`
}

// ollamaChunk is one line of an /api/chat or /api/generate answer.
type ollamaChunk struct {
	Model              string         `json:"model"`
	CreatedAt          time.Time      `json:"created_at"`
	Message            *ollamaMessage `json:"message,omitempty"`
	Response           *string        `json:"response,omitempty"`
	Done               bool           `json:"done"`
	DoneReason         string         `json:"done_reason,omitempty"`
	TotalDuration      int64          `json:"total_duration,omitempty"`
	LoadDuration       int64          `json:"load_duration,omitempty"`
	PromptEvalCount    int            `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64          `json:"prompt_eval_duration,omitempty"`
	EvalCount          int            `json:"eval_count,omitempty"`
	EvalDuration       int64          `json:"eval_duration,omitempty"`
	Ctxd               *ollamaCtxd    `json:"ctxd,omitempty"`
}

func (d *Doors) ollamaChat(w http.ResponseWriter, r *http.Request) {
	var req ollamaChatRequest
	sent, eng, m, release, err := d.open(w, r, &req, &req.Model)
	defer release()
	if err == nil {
		err = refuseUnsupported(req.Format, false, "", "", nil)
	}
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	if len(req.Messages) == 0 { // Ollama's way to load a model: it is loaded
		d.ollamaLoaded(w, req.Model, true, ollamaIgnored(sent, req.Options, false))
		return
	}
	conv, err := toConversation(req.Messages)
	var tools []ctxd.Tool
	if err == nil {
		tools, err = toolsOf(req.Tools, nil)
	}
	var ask ctxd.AskRequest
	var sigil runcontext.Sigil
	var follow following
	if err == nil {
		ask, sigil, follow, err = d.ask(r, "oll", req.Model, conv, tools)
	}
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	ignored := append(ollamaIgnored(sent, req.Options, ollamaCap(req.Options, &ask, m)), d.notAllowed(sigil, tools)...)
	setSummaryHeaders(w, ask.Session, ignored)
	d.ollamaAnswer(w, r, eng, m.ToolOpen, ask, sigil, follow, req.Model, req.Stream == nil || *req.Stream, true, ignored)
}

func (d *Doors) ollamaGenerate(w http.ResponseWriter, r *http.Request) {
	var req ollamaGenerateRequest
	sent, eng, m, release, err := d.open(w, r, &req, &req.Model)
	defer release()
	if err == nil {
		err = refuseUnsupported(req.Format, req.Raw, req.Template, req.Suffix, req.Images)
	}
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	if strings.TrimSpace(req.Prompt) == "" { // Ollama's way to load a model
		d.ollamaLoaded(w, req.Model, false, ollamaIgnored(sent, req.Options, false))
		return
	}
	ask, sigil, _, err := d.ask(r, "ollg", req.Model, oneTurn(req.System, req.Prompt), nil)
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	ignored := ollamaIgnored(sent, req.Options, ollamaCap(req.Options, &ask, m))
	setSummaryHeaders(w, ask.Session, ignored)
	d.ollamaAnswer(w, r, eng, m.ToolOpen, ask, sigil, following{}, req.Model, req.Stream == nil || *req.Stream, false, ignored)
}

// ollamaLoaded answers a request with nothing to generate, as Ollama does
// once the model is loaded (ctxd keeps it loaded with its own window).
func (d *Doors) ollamaLoaded(w http.ResponseWriter, model string, chat bool, ignored []string) {
	c := ollamaChunk{Model: model, CreatedAt: d.now().UTC(), Done: true, DoneReason: "load", Ctxd: &ollamaCtxd{Ignored: ignored}}
	if chat {
		c.Message = &ollamaMessage{Role: "assistant"}
	} else {
		empty := ""
		c.Response = &empty
	}
	writeJSON(w, http.StatusOK, c)
}

// ollamaAnswer asks and answers in Ollama's shape, streaming NDJSON unless
// the client said stream: false. A stream's headers go out when the
// request is accepted, and empty chunks keep it alive while the prompt is
// read (see streamer). When tools are offered, text streams as it comes
// and tool calls are sent whole once recognised (see toolSniffer).
func (d *Doors) ollamaAnswer(w http.ResponseWriter, r *http.Request, eng Engine, toolOpen string, ask ctxd.AskRequest, sigil runcontext.Sigil, follow following, model string, stream, chat bool, ignored []string) {
	if len(ignored) > 0 {
		d.log.Info("ollama door: ignored fields and options (never forwarded)", "session", ask.Session, "ignored", ignored)
	}
	piece := func(text string, calls []ctxd.ToolCall) ollamaChunk {
		c := ollamaChunk{Model: model, CreatedAt: d.now().UTC()}
		if chat {
			c.Message = &ollamaMessage{Role: "assistant", Content: text}
			if len(calls) > 0 {
				c.Message.Content, c.Message.ToolCalls = "", toOllamaToolCalls(calls)
			}
		} else {
			c.Response = &text
		}
		return c
	}
	final := func(text string, s *ctxd.Summary) ollamaChunk {
		c := piece(text, s.ToolCalls)
		c.Done, c.DoneReason = true, s.DoneReason
		if s.DoneReason == ctxd.DoneIncomplete {
			c.DoneReason = ctxd.DoneStop
		}
		c.TotalDuration = int64(s.TotalMillis * 1e6)
		prompt, _ := clientPrompt(s)
		c.PromptEvalCount, c.PromptEvalDuration = prompt, int64(s.PromptEvalMs*1e6)
		c.EvalCount = s.AnswerTokens
		c.EvalDuration = max(0, int64((s.TotalMillis-s.TTFTMillis)*1e6)) // ttft_ms counts from arrival: queue and governor included
		c.Ctxd = &ollamaCtxd{Session: s.Session, Ignored: ignored, Summary: s}
		return c
	}
	var sb strings.Builder // the answer's text
	s := &streamer{w: w, timeout: d.cfg.WriteTimeout}
	var sniff *toolSniffer
	if stream {
		sniff = d.startStream(s, &ask, toolOpen, func() []byte {
			b, _ := json.Marshal(piece("", nil))
			return b
		})
	}
	sum, err := eng.AskAs(r.Context(), sigil, ask, func(t string) error {
		sb.WriteString(t)
		if !stream {
			return nil
		}
		if sniff != nil {
			if t = sniff.feed(t); t == "" {
				return nil
			}
		}
		return s.send(piece(t, nil))
	})
	if started := s.release(); err != nil {
		d.logAskError(ask.Session, err)
		if !started {
			WriteOllamaError(w, err)
			return
		}
		_ = s.send(map[string]string{"error": err.Error()})
		return
	}
	follow.answered(sum.Session, answerAsSent(sb.String(), sum))
	if !stream {
		writeJSON(w, http.StatusOK, final(sb.String(), sum))
		return
	}
	if sniff != nil && len(sum.ToolCalls) == 0 && sniff.rest() != "" { // held as a possible call, and text after all
		if err := s.send(piece(sniff.rest(), nil)); err != nil {
			return
		}
	}
	_ = s.send(final("", sum))
}

// ollamaDetails is a model's details in Ollama's lists.
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// digestOf stands for the model's digest: clients show its first 12
// characters. It names the model and its window as ctxd serves them.
func digestOf(m Model) string {
	h := sha256.Sum256([]byte(m.Name + "\x00" + m.BackendKind + "\x00" + itoa(m.NumCtx)))
	return hex.EncodeToString(h[:])
}

func detailsOf(m Model) ollamaDetails {
	return ollamaDetails{Format: "gguf", Family: m.Architecture, Families: []string{m.Architecture}}
}

// tagged is the model's name as Ollama lists it, with its tag.
func tagged(name string) string {
	if strings.Contains(name, ":") {
		return name
	}
	return name + ":latest"
}

func (d *Doors) ollamaTags(w http.ResponseWriter, r *http.Request) {
	ms, err := d.models(r)
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	list := []map[string]any{}
	for _, m := range ms {
		list = append(list, map[string]any{
			"name": tagged(m.Name), "model": tagged(m.Name), "modified_at": m.Loaded.UTC(), "size": 0, "digest": digestOf(m),
			"details": detailsOf(m),
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": list})
}

func (d *Doors) ollamaPs(w http.ResponseWriter, r *http.Request) {
	ms, err := d.models(r)
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	list := []map[string]any{}
	for _, m := range ms {
		if m.Unloaded {
			continue
		}
		list = append(list, map[string]any{
			"name": tagged(m.Name), "model": tagged(m.Name), "size": 0, "digest": digestOf(m), "details": detailsOf(m),
			"expires_at": time.Date(2318, 1, 1, 0, 0, 0, 0, time.UTC), "size_vram": 0, "context_length": m.NumCtx,
		})
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": list})
}

func (d *Doors) ollamaShow(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"` // older clients
	}
	if _, err := d.decode(w, r, &req); err != nil {
		WriteOllamaError(w, err)
		return
	}
	if req.Model == "" {
		req.Model = req.Name
	}
	m, err := d.model(r, req.Model)
	if err != nil {
		WriteOllamaError(w, err)
		return
	}
	// The model's own metadata, but the context length shown is ctxd's
	// window, not the trained one: it is what a client should size its
	// prompts to. Clients read the general keys without checking them.
	info := maps.Clone(m.Info)
	if info == nil {
		info = map[string]any{}
	}
	info["general.architecture"] = m.Architecture
	if _, ok := info["general.parameter_count"]; !ok {
		info["general.parameter_count"] = 0
	}
	if m.Architecture != "" {
		info[m.Architecture+".context_length"] = m.NumCtx
		if _, ok := info[m.Architecture+".embedding_length"]; !ok {
			info[m.Architecture+".embedding_length"] = m.Embedding
		}
		if _, ok := info[m.Architecture+".block_count"]; !ok && m.BlockCount > 0 {
			info[m.Architecture+".block_count"] = m.BlockCount
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"license": "", "modelfile": "# served by ctxd; the prompt is ctxd's RunContext\nFROM " + m.Name + "\n",
		"parameters": "num_ctx " + itoa(m.NumCtx), "template": ollamaTemplate,
		"details": detailsOf(m), "model_info": info, "modified_at": m.Loaded.UTC(),
		// Tools pass through for every model: ctxd offers them in the sigil
		// block with its own protocol (as far as the sigil's scopes allow).
		"capabilities": []string{"completion", "tools"},
	})
}

func (d *Doors) ollamaVersion(w http.ResponseWriter, r *http.Request) {
	v := ollamaAPIVersion
	if _, m, err := d.engine(); err == nil && m.BackendKind == "ollama" && m.BackendVersion != "" {
		v = m.BackendVersion
	}
	writeJSON(w, http.StatusOK, map[string]string{"version": v})
}
