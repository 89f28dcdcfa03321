package bringup

import (
	"context"
	"log/slog"
	"net"
	"net/url"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
)

// Model is a backend brought up for one model load: what requests run on.
type Model struct {
	Backend     ctxd.Backend
	Tokenizer   ctxd.Tokenizer
	TokenizerID string // names the vocabulary (the model file), for the codex's count cache
	Info        BackendInfo
	Window      governor.WindowPlan
	Facts       governor.ModelFacts
	Format      runcontext.Format // how prompts are rendered; nil: the plain format
	ModelInfo   map[string]any    // the model's metadata as Ollama's /api/show has it (Ollama only); the Ollama door shows it
	// ChoosesSlots: the backend runs each request on the slot ctxd names
	// (llama-server), rather than choosing one itself (Ollama).
	ChoosesSlots bool
	// Warm turns warm restarts on: saved slots (llama-server); nil: none.
	Warm     *orchestrator.WarmConfig
	Restarts func() int   // how often a supervised backend was restarted; nil if not supervised
	Loads    func() int   // how often the backend loaded the model (from its log; -1 unreadable); nil if unknown
	Close    func() error // stops what Open started; called once, after the last request
	// Suspend stops the model's server, keeping what restarts it, and
	// Resume starts it again (its KV cache empty): a persona evacuated to
	// make room for another. nil where ctxd does not run the server.
	Suspend func(ctx context.Context) error
	Resume  func(ctx context.Context) error
	// Server is the model server this load runs on, for other personas'
	// models to run on it too (Ollama); nil where each model has its own.
	Server *Server
	// Planned is what this load holds as planned (PlannedBytes: weights,
	// KV windows, host prompt cache, the server's own); 0 where ctxd did not
	// plan it (an external server).
	Planned int64
	// PID is the model server's process id now (0 while it is stopped),
	// for its resident memory; nil where ctxd does not run the server.
	PID func() int
}

// Server is a running model server other loads may share: its base URL
// and the dialer that reaches only it (nil: any).
type Server struct {
	Base *url.URL
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Opener brings the backend up: start or reach the model server, load the
// model with the window planned for it, open its tokenizer. It calls
// onRestart whenever the backend restarted and lost its KV cache. An error
// of kind ctxd.KindInvalid (a configuration that cannot work, such as an
// explicit num_ctx that does not fit) ends the daemon; any other is
// retried until it succeeds.
type Opener func(ctx context.Context, onRestart func()) (*Model, error)

// BackendInfo describes the backend once it is ready.
type BackendInfo struct {
	Kind         string `json:"kind"` // ollama, llamacpp or openai
	Mode         string `json:"mode"`
	URL          string `json:"url"`
	Version      string `json:"version"`
	Model        string `json:"model"`
	Architecture string `json:"architecture"`
	TrainedCtx   int    `json:"trained_context_length"`
	NumCtx       int    `json:"num_ctx"`
	Slots        int    `json:"slots"`
	Restarts     int    `json:"restarts,omitempty"`
	// ModelLoads is how often the managed backend loaded the model (its
	// log says so); one load since start means no client made it reload.
	ModelLoads  *int       `json:"model_loads,omitempty"`
	KVCacheType string     `json:"kv_cache_type"`
	Format      FormatInfo `json:"format"`
}

// FormatInfo says how prompts are rendered, and why.
type FormatInfo struct {
	Name       string `json:"name"`        // "template" (the model's chat template) or "plain" (ctxd's own)
	AppendOnly bool   `json:"append_only"` // turn n+1's prompt extends turn n's and its answer
	Note       string `json:"note,omitempty"`
	Reason     string `json:"reason"`
	// Tools says what the model's template does with tools (see
	// chattemplate.Check.Tools); "" when it does nothing with them.
	Tools string `json:"tools,omitempty"`
}

// Facts is what a model file says about itself, whichever server serves
// it: what the window plan and the prompt format are chosen from.
type Facts struct {
	Architecture  string
	ContextLength int            // the window the model was trained for
	GGUFPath      string         // the model file
	Info          map[string]any // the GGUF's metadata, keyed as Ollama's /api/show keys it
	Template      string         // the chat template as a Go template ("" for none)
	Stop          []string       // the template's stop sequences
}

// Memory is the hardware probe as bring-up uses it: what memory there is,
// and what the plan expects to hold.
type Memory interface {
	Read() hostenv.Reading
	SetPlan(plannedBytes uint64, resident bool)
}

// Config is what bring-up needs: the backend's and the limits' settings,
// where the managed server keeps its files, and the machine.
type Config struct {
	Backend  config.Backend
	Limits   config.Limits
	StateDir string   // the daemon's state directory: a managed server's files go under it
	Env      []string // the environment (KEY=VALUE) a managed server inherits
	Memory   Memory
	// Critical reports whether VRAM pressure is critical now: the plan
	// then leaves the most room.
	Critical func() bool
	// Formats are the prompt formats registered besides the core's, which
	// backend.format may name; nil: none.
	Formats *formatters.Registry
	Logger  *slog.Logger
	// Shared is an Ollama server already running (the default persona's)
	// that this load runs on instead of starting its own: its model is
	// imported there and loaded beside the others. nil: its own server.
	Shared *Server
	// MaxLoaded is how many models a managed Ollama keeps loaded at once
	// (OLLAMA_MAX_LOADED_MODELS; 0: 1): one per persona.
	MaxLoaded int
}

// Open is the Opener the configuration names (backend.kind).
func Open(cfg Config) Opener {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Critical == nil {
		cfg.Critical = func() bool { return false }
	}
	switch cfg.Backend.Kind {
	case "llamacpp":
		return cfg.openLlamaCpp
	case "openai":
		return cfg.openOpenAI
	}
	return cfg.openOllama
}

// closers stops what a bring-up started, last first.
type closers []func() error

func (c *closers) add(f func() error) { *c = append(*c, f) }

func (c *closers) close() error {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	return nil
}
