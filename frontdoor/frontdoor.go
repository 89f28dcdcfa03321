package frontdoor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// Engine is the request path the doors send their asks to.
type Engine interface {
	// AskAs answers req as sigil (resolved and narrowed by the caller).
	AskAs(ctx context.Context, sigil runcontext.Sigil, req ctxd.AskRequest, onToken func(string) error) (*ctxd.Summary, error)
}

// Model is what the doors say about the one model ctxd serves.
type Model struct {
	Name           string    // the backend's model name, e.g. "ctxd-demo"
	Architecture   string    // e.g. "llama"
	NumCtx         int       // the window ctxd planned: what clients should size prompts to
	AnswerReserve  int       // tokens kept for each answer
	BackendKind    string    // "ollama" or "llamacpp"
	BackendVersion string    // the backend's version
	Loaded         time.Time // when the backend loaded it
	// Unloaded: a persona whose model is not loaded now (never yet, or
	// evacuated): listed among the models, not among those running.
	Unloaded   bool
	Embedding  int // embedding length
	BlockCount int // layers
	// Info is the model's metadata as Ollama's /api/show has it, when the
	// backend is Ollama; the door shows it with ctxd's window.
	Info map[string]any
	// ToolOpen is the text that opens a tool call in the model's own
	// syntax (its chat template's, e.g. "<tool_call>"); "" when it has
	// none. A streamed answer that begins with it is held as a call.
	ToolOpen string
}

// Config is what the doors need.
type Config struct {
	// Engine is the request path and the model it serves, or an error of
	// kind ctxd.KindUnavailable while the backend is starting.
	Engine func() (Engine, Model, error)
	// Persona, when set, is the request path of the persona a request's
	// model field names (made resident first), and what to call once the
	// request is done with it; an unknown name is an error of kind
	// KindNotFound. Models lists the personas the request's sigil may use,
	// the default first. nil: the one model Engine serves.
	Persona func(r *http.Request, model string) (Engine, Model, func(), error)
	Models  func(r *http.Request) []Model
	// Sigil is the sigil a request acts as, resolved and narrowed to the
	// scopes the request asks for: the one its token authenticated, else
	// the one it names (X-Ctxd-Sigil), else the default; an error refuses
	// the request. nil: every request acts as a sigil without a name or
	// scopes (the engine decides what that may do).
	Sigil        func(*http.Request) (runcontext.Sigil, error)
	MaxBodyBytes int64
	WriteTimeout time.Duration // for the client to take one chunk of a stream
	// HeaderGrace is how long a streamed answer's headers may wait for
	// the request to be accepted before they are sent anyway (default
	// 50ms); KeepAlive how often a stream with nothing else to say says it
	// is alive (default 5s). See streamer.
	HeaderGrace, KeepAlive time.Duration
	Logger                 *slog.Logger
}

// Doors serves the OpenAI- and Ollama-compatible routes.
type Doors struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	// sigils: requests act as sigils with scopes (Config.Sigil), so the
	// tools a sigil may not offer can be named.
	sigils bool
	convs  *conversations // which session each conversation is in
}

// New returns the doors.
func New(cfg Config) *Doors {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	withSigils := cfg.Sigil != nil
	if cfg.Sigil == nil {
		cfg.Sigil = func(*http.Request) (runcontext.Sigil, error) { return runcontext.Sigil{}, nil }
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.HeaderGrace <= 0 {
		cfg.HeaderGrace = 50 * time.Millisecond
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 5 * time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	return &Doors{cfg: cfg, log: cfg.Logger.With("component", "frontdoor"), now: time.Now, sigils: withSigils,
		convs: newConversations(maxConversations)}
}

// Register adds the doors' routes to mux.
func (d *Doors) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/chat/completions", d.openaiChat)
	mux.HandleFunc("POST /v1/completions", d.openaiCompletion)
	mux.HandleFunc("GET /v1/models", d.openaiModels)
	mux.HandleFunc("GET /v1/models/{model...}", d.openaiModel)
	mux.HandleFunc("POST /api/chat", d.ollamaChat)
	mux.HandleFunc("POST /api/generate", d.ollamaGenerate)
	mux.HandleFunc("GET /api/tags", d.ollamaTags)
	mux.HandleFunc("POST /api/show", d.ollamaShow)
	mux.HandleFunc("GET /api/version", d.ollamaVersion)
	mux.HandleFunc("GET /api/ps", d.ollamaPs)
	// Ollama answers HEAD / and GET / with "Ollama is running": clients
	// probe it before anything else.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "Ollama is running (ctxd's Ollama-compatible door)")
	})
	for path, allow := range map[string]string{
		"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/models": "GET", "/v1/models/{model...}": "GET",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			WriteOpenAIError(w, ctxd.Errorf(ctxd.KindMethod, "%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow))
		})
	}
	for path, allow := range map[string]string{
		"/api/chat": "POST", "/api/generate": "POST", "/api/tags": "GET", "/api/show": "POST", "/api/version": "GET", "/api/ps": "GET",
	} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			WriteOllamaError(w, ctxd.Errorf(ctxd.KindMethod, "%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow))
		})
	}
	for _, u := range openaiUnserved {
		pattern := u
		if !strings.HasSuffix(u, "/") {
			pattern += "/"
			mux.HandleFunc(u, openaiUnservedRoute)
		}
		mux.HandleFunc(pattern, openaiUnservedRoute)
	}
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		WriteOllamaError(w, ctxd.Errorf(ctxd.KindUnknownRoute, "no route %s %s on ctxd's Ollama door; it serves /api/chat, /api/generate, /api/tags, /api/show, /api/version and /api/ps", r.Method, r.URL.Path))
	})
}

// openaiUnserved are OpenAI routes clients call that the door does not
// serve: they are answered in OpenAI's shape, naming what it serves.
var openaiUnserved = []string{"/v1/responses", "/v1/embeddings", "/v1/audio/", "/v1/images/", "/v1/moderations"}

// openaiUnservedRoute answers an OpenAI route the door does not serve.
func openaiUnservedRoute(w http.ResponseWriter, r *http.Request) {
	WriteOpenAIError(w, ctxd.Errorf(ctxd.KindUnknownRoute, "ctxd's OpenAI door does not serve %s; it serves /v1/chat/completions, /v1/completions and /v1/models", r.URL.Path))
}

// IsOpenAIPath and IsOllamaPath say which door's error shape a path gets.
func IsOpenAIPath(p string) bool {
	if p == "/v1/chat/completions" || p == "/v1/completions" || p == "/v1/models" || strings.HasPrefix(p, "/v1/models/") {
		return true
	}
	for _, u := range openaiUnserved {
		if p == u || strings.HasPrefix(p, strings.TrimSuffix(u, "/")+"/") {
			return true
		}
	}
	return false
}

// IsOllamaPath is true for the Ollama door's paths.
func IsOllamaPath(p string) bool { return p == "/" || strings.HasPrefix(p, "/api/") }

// engine is the request path, or the error that says why there is none.
func (d *Doors) engine() (Engine, Model, error) { return d.cfg.Engine() }

// open is the start every asking handler shares: it decodes the body into
// req, finds the request path and checks the model *model names (read
// after decoding). It returns the fields the body sent, and the model.
func (d *Doors) open(w http.ResponseWriter, r *http.Request, req any, model *string) ([]string, Engine, Model, func(), error) {
	sent, err := d.decode(w, r, req)
	if err != nil {
		return nil, nil, Model{}, func() {}, err
	}
	if d.cfg.Persona != nil {
		if strings.TrimSpace(*model) == "" {
			return sent, nil, Model{}, func() {}, ctxd.Errorf(ctxd.KindInvalid, "model: required; name a persona of this ctxd (GET /v1/models lists them) or say \"ctxd\"")
		}
		eng, m, release, err := d.cfg.Persona(r, strings.TrimSuffix(*model, ":latest"))
		if ctxd.KindOf(err) == ctxd.KindNotFound { // in the door's words: its clients name models
			if ms, lerr := d.models(r); lerr == nil {
				err = notServed(*model, ms)
			}
		}
		if err != nil {
			return sent, nil, Model{}, func() {}, err
		}
		return sent, eng, m, release, nil
	}
	eng, m, err := d.engine()
	if err == nil {
		err = checkModel(*model, m)
	}
	return sent, eng, m, func() {}, err
}

// models are the models the doors list: the personas a request's sigil
// may use, or the one model served.
func (d *Doors) models(r *http.Request) ([]Model, error) {
	if d.cfg.Models != nil {
		return d.cfg.Models(r), nil
	}
	_, m, err := d.engine()
	if err != nil {
		return nil, err
	}
	return []Model{m}, nil
}

// model is the listed model a request names.
func (d *Doors) model(r *http.Request, name string) (Model, error) {
	ms, err := d.models(r)
	if err != nil {
		return Model{}, err
	}
	if d.cfg.Models == nil || name == "ctxd" {
		return ms[0], checkModel(name, ms[0])
	}
	for _, m := range ms {
		if sameModel(name, m.Name) {
			return m, nil
		}
	}
	return Model{}, notServed(name, ms)
}

// notServed is the error for a model the doors do not serve, naming those
// they do.
func notServed(name string, ms []Model) error {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = strconv.Quote(m.Name)
	}
	return ctxd.Errorf(ctxd.KindNotFound, "model %q not found; this ctxd serves %s (or say \"ctxd\")", name, strings.Join(names, ", "))
}

// answerCap is the cap on the answer's length a client asked for, if ctxd
// honours it: one up to the answer reserve (the window is planned with the
// reserve, so a smaller cap changes nothing the backend holds). A larger
// one has no effect, and its field is listed as ignored.
func answerCap(asked float64, m Model) (int, bool) {
	if asked >= 1 && asked == float64(int(asked)) && int(asked) <= m.AnswerReserve {
		return int(asked), true
	}
	return 0, false
}

// ask is the AskRequest of a conversation on a door: its session (see
// sessionOf), the request's sigil, and what to remember of the
// conversation once it is answered.
func (d *Doors) ask(r *http.Request, door, model string, c conversation, tools []ctxd.Tool) (ctxd.AskRequest, runcontext.Sigil, following, error) {
	sigil, err := d.cfg.Sigil(r)
	if err != nil {
		return ctxd.AskRequest{}, sigil, following{}, err
	}
	session, f, err := d.sessionOf(r, door, sigil.Name, model, c)
	if err != nil {
		return ctxd.AskRequest{}, sigil, following{}, err
	}
	parent := r.Header.Get("X-Ctxd-Parent-Session")
	if parent != "" {
		if err := ctxd.CheckSessionID(parent); err != nil {
			return ctxd.AskRequest{}, sigil, following{}, ctxd.Errorf(ctxd.KindInvalid, "header X-Ctxd-Parent-Session: %v", err)
		}
	}
	return ctxd.AskRequest{Session: session, Parent: parent, Query: c.Query, Sigil: sigil.Name, System: c.System, History: c.History, Tools: tools,
		Ephemeral: c.Ephemeral, Scopes: sigil.Scopes}, sigil, f, nil
}

// oneTurn is one question outside any conversation (a text completion,
// Ollama's generate): it is answered after the stable blocks, with no
// history, and not recorded, so a client that sends many independent
// prompts leaves no sessions behind, and one that names a session in
// X-Ctxd-Session does not disturb its conversation.
func oneTurn(system, prompt string) conversation {
	return conversation{System: system, Query: prompt, Ephemeral: true}
}

// checkModel accepts the served model's name, with or without Ollama's
// ":latest" tag, and "ctxd"; anything else is not found, naming what is.
func checkModel(asked string, m Model) error {
	if strings.TrimSpace(asked) == "" {
		return ctxd.Errorf(ctxd.KindInvalid, "model: required; this ctxd serves %q", m.Name)
	}
	if sameModel(asked, m.Name) || asked == "ctxd" {
		return nil
	}
	return ctxd.Errorf(ctxd.KindNotFound, "model %q not found; this ctxd serves %q (or say \"ctxd\")", asked, m.Name)
}

func sameModel(a, b string) bool {
	return strings.TrimSuffix(a, ":latest") == strings.TrimSuffix(b, ":latest")
}

// decode reads a JSON body into v (unknown fields allowed: clients send
// vendors' extras) and returns the names of its top-level fields. The
// content type is not checked, as OpenAI and Ollama do not check it:
// their documentation's curl examples send JSON as a form.
func (d *Doors) decode(w http.ResponseWriter, r *http.Request, v any) ([]string, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, d.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, ctxd.Errorf(ctxd.KindTooLarge, "request body is over the cap of %d bytes (daemon.max_body_bytes)", mbe.Limit)
		}
		return nil, ctxd.Errorf(ctxd.KindInvalid, "read body: %v", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "empty body: send a JSON object")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "malformed JSON body: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "malformed JSON body: %v", err)
	}
	names := make([]string, 0, len(fields))
	for k, raw := range fields {
		if string(raw) != "null" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return names, nil
}

// ignoredOf lists the fields of sent that are not in honoured.
func ignoredOf(sent []string, honoured ...string) []string {
	var out []string
	for _, f := range sent {
		if !slices.Contains(honoured, f) {
			out = append(out, f)
		}
	}
	return out
}

// notAllowed lists, as ignored fields ("tools.NAME"), the tools the
// sigil may not offer the model: where the daemon leaves them out rather
// than refusing the request (daemon.disallowed_tools), the client learns
// which.
func (d *Doors) notAllowed(sigil runcontext.Sigil, tools []ctxd.Tool) []string {
	if !d.sigils {
		return nil
	}
	out := sigils.NotAllowedTools(sigil, tools)
	for i, name := range out {
		out[i] = "tools." + name
	}
	return out
}

// summaryHeader carries the summary's headline figures on answers that
// have no room for them in their own shape.
func setSummaryHeaders(w http.ResponseWriter, session string, ignored []string) {
	w.Header().Set("X-Ctxd-Session", session)
	if len(ignored) > 0 {
		w.Header().Set("X-Ctxd-Ignored", strings.Join(ignored, ", "))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
