package config

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/sigils"
)

// Config is the whole daemon configuration.
type Config struct {
	Daemon   Daemon           `toml:"daemon"`
	Backend  Backend          `toml:"backend"`
	Identity Identity         `toml:"identity"`
	Codex    Codex            `toml:"codex"`
	Limits   Limits           `toml:"limits"`
	Karma    Karma            `toml:"karma"`
	Env      Environment      `toml:"environment"`
	Store    Store            `toml:"store"`
	Sigils   map[string]Sigil `toml:"sigils"`
	// Personas are served besides the default one (the top-level
	// [backend] model with [identity] and [codex]); a request names one by
	// its name (the model field at the OpenAI and Ollama doors).
	Personas []Persona `toml:"persona"`
}

// Persona is one more persona: its own identity and model, window and
// slots, and its codex or the shared one, under the one memory budget
// (limits.memory_budget_mb). Every field left out is the default
// persona's.
type Persona struct {
	Name    string `toml:"name"`    // what requests name it by (the model field at the doors)
	Persona string `toml:"persona"` // its system prompt; "": identity.persona
	GGUF    string `toml:"gguf"`    // its model file; "": backend.gguf
	Codex   string `toml:"codex"`   // its codex directory; "": codex.path (shared)
	NumCtx  int    `toml:"num_ctx"` // its window per slot; 0: planned as backend.num_ctx is
	Slots   int    `toml:"slots"`   // 0: backend.slots
	// Sigils are the sigils that may use it; empty: every sigil.
	Sigils []string `toml:"sigils"`
	// Pinned: never evacuated to make room for another persona.
	Pinned bool `toml:"pinned"`
}

// PersonaConfig is the whole configuration as persona n of Personas sees
// it: its backend, identity and codex in place of the default's, and its
// own state directory (state_dir/personas/NAME) for its server's files and
// its codex's caches.
func (c Config) PersonaConfig(n int) Config {
	ps := c.Personas[n]
	out := c
	out.Personas = nil
	out.Backend.Model = ps.Name
	if ps.GGUF != "" {
		out.Backend.GGUF = ps.GGUF
	}
	if ps.Persona != "" {
		out.Identity.Persona = ps.Persona
	}
	out.Identity.Name = ps.Name
	if ps.Codex != "" {
		out.Codex.Path = ps.Codex
	}
	if ps.NumCtx > 0 {
		out.Backend.NumCtx = ps.NumCtx
	}
	if ps.Slots > 0 {
		out.Backend.Slots = ps.Slots
	}
	out.Backend.Listen = "" // a socket of its own, in its own directory
	out.Daemon.StateDir = filepath.Join(c.Daemon.StateDir, "personas", ps.Name)
	return out
}

// Environment is how the hardware probe reads and bands the environment
// block: VRAM pressure (fractions of the memory the model runs in) and the
// battery (percent). A band is entered at its enter value and left only
// below its leave value, and a change must hold for hold first.
type Environment struct {
	Interval          Duration `toml:"interval"`      // between readings
	Hold              Duration `toml:"hold"`          // a band change must last this long to show
	CheckBackend      bool     `toml:"check_backend"` // connectivity counts the backend answering (default true)
	VRAMModerateEnter float64  `toml:"vram_moderate_enter"`
	VRAMModerateLeave float64  `toml:"vram_moderate_leave"`
	VRAMHighEnter     float64  `toml:"vram_high_enter"`
	VRAMHighLeave     float64  `toml:"vram_high_leave"`
	VRAMCriticalEnter float64  `toml:"vram_critical_enter"`
	VRAMCriticalLeave float64  `toml:"vram_critical_leave"`
	LowBatteryEnter   float64  `toml:"low_battery_enter"`
	LowBatteryLeave   float64  `toml:"low_battery_leave"`
}

// Thresholds are the environment's thresholds as the probe takes them.
func (e Environment) Thresholds() hostenv.Thresholds {
	return hostenv.Thresholds{
		VRAMModerateEnter: e.VRAMModerateEnter, VRAMModerateLeave: e.VRAMModerateLeave,
		VRAMHighEnter: e.VRAMHighEnter, VRAMHighLeave: e.VRAMHighLeave,
		VRAMCriticalEnter: e.VRAMCriticalEnter, VRAMCriticalLeave: e.VRAMCriticalLeave,
		LowBatteryEnter: e.LowBatteryEnter, LowBatteryLeave: e.LowBatteryLeave,
		Hold: e.Hold.Duration,
	}
}

// Karma is how answers are recorded as traces and chosen for the karma
// block.
type Karma struct {
	Enabled       bool     `toml:"enabled"`         // record traces and render karma (default true)
	TopK          int      `toml:"top_k"`           // unpinned entries per karma epoch
	MaxChars      int      `toml:"max_chars"`       // the block's entry text at most
	MaxEntryChars int      `toml:"max_entry_chars"` // one entry at most; a longer trace is left out, never cut
	HalfLife      Duration `toml:"half_life"`       // the age at which a trace's recency score halves
	// MaxNoteBytes bounds a judgement's note; MaxJudgements the
	// judgements (events) one trace may have.
	MaxNoteBytes  int `toml:"max_note_bytes"`
	MaxJudgements int `toml:"max_judgements"`
}

// Daemon is the daemon process itself.
type Daemon struct {
	Socket   string `toml:"socket"`    // Unix socket path
	StateDir string `toml:"state_dir"` // database, managed backend files
	LogLevel string `toml:"log_level"` // debug, info, warn, error
	// LogFormat is the log's form: "json", "text", or "auto" (JSON when
	// stderr is systemd's journal, text otherwise).
	LogFormat string `toml:"log_format"`
	// MetricsListen is an optional loopback TCP address (host:port) that
	// serves GET /metrics only, without a token, for a Prometheus scraper;
	// off when "". /metrics is on the socket (and tcp_listen) regardless.
	MetricsListen string `toml:"metrics_listen"`
	MaxBodyBytes  int64  `toml:"max_body_bytes"` // request body cap
	DefaultSigil  string `toml:"default_sigil"`  // sigil of requests that name none
	// ShutdownGrace is how long running requests may finish after a stop
	// signal before they are stopped (with an error event saying so).
	ShutdownGrace Duration `toml:"shutdown_grace"`
	// WriteTimeout is how long a client may take to read one event of a
	// stream; one that stops reading is treated as gone.
	WriteTimeout Duration `toml:"write_timeout"`
	// TCPListen is an optional TCP address (host:port) for clients that
	// cannot speak Unix sockets; off when "". Every request on it must
	// carry a sigil's token. It must be a loopback address unless
	// TCPAllowRemote says otherwise.
	TCPListen      string `toml:"tcp_listen"`
	TCPAllowRemote bool   `toml:"tcp_allow_remote"`
	// MaxConnections caps the connections each listener holds at once;
	// past it new ones wait until one closes.
	MaxConnections int `toml:"max_connections"`
	// MaxWebSocketsPerSigil caps the WebSocket sessions one sigil holds
	// open; MaxMCPSessionsPerSigil its MCP sessions, and MaxMCPSessions
	// all sigils' together. Past a bound the next is refused (429, naming
	// the key): one sigil cannot hold what every other needs.
	MaxWebSocketsPerSigil int `toml:"max_websockets_per_sigil"`
	// DashboardListen is an optional loopback TCP address (host:port)
	// that serves the dashboard alone, every request with a token (a
	// sigil's, or a short-lived one `ctxd dashboard` asks for); off when
	// "". The dashboard is on the socket (and tcp_listen) regardless.
	DashboardListen string `toml:"dashboard_listen"`
	// MaxDashboardsPerSigil caps the dashboard pages one sigil holds open.
	MaxDashboardsPerSigil int `toml:"max_dashboards_per_sigil"`
	// MaxUnauthenticated caps the connections of each listener none of
	// whose requests has yet passed authentication: past it the oldest is
	// closed. HeaderTimeout is how long a client may take to send a
	// request's headers.
	MaxUnauthenticated     int      `toml:"max_unauthenticated"`
	HeaderTimeout          Duration `toml:"header_timeout"`
	MaxMCPSessionsPerSigil int      `toml:"max_mcp_sessions_per_sigil"`
	MaxMCPSessions         int      `toml:"max_mcp_sessions"`
	// MaxAsksPerSigil bounds the requests one sigil has in flight (queued
	// or answering, on every door); MaxSessionsPerSigil the sessions it
	// holds. Past either, a request is refused (429, naming the key).
	MaxAsksPerSigil     int `toml:"max_asks_per_sigil"`
	MaxSessionsPerSigil int `toml:"max_sessions_per_sigil"`
	// BodyTimeout is how long a client may take to send a request's body;
	// IdleTimeout how long a kept-alive connection may sit between
	// requests. Streams (answers, WebSocket, MCP) are not bound by them.
	BodyTimeout Duration `toml:"body_timeout"`
	IdleTimeout Duration `toml:"idle_timeout"`
	// StoreTimeout bounds each session-store call on a request's path
	// (reading the session, recording the answer): a store that hangs
	// fails that request, with an error saying so, instead of holding its
	// session for ever.
	StoreTimeout Duration `toml:"store_timeout"`
	// DisallowedTools is what a request that offers tools its sigil may
	// not offer gets: "refuse" (403, naming them and the scope) or
	// "leave_out" (answered without them; X-Ctxd-Ignored and the summary
	// list them).
	DisallowedTools string `toml:"disallowed_tools"`
}

// Backend is the model server.
type Backend struct {
	Kind   string `toml:"kind"`   // "ollama", "llamacpp" (llama.cpp's llama-server) or "openai" (any server of the OpenAI completions API; external only)
	Mode   string `toml:"mode"`   // "managed": ctxd runs the server; "external": ctxd connects to URL
	URL    string `toml:"url"`    // external: the server's base URL (llamacpp: or a .sock path)
	Binary string `toml:"binary"` // managed: the server binary; "": ollama, or $CTXD_LLAMA_SERVER else llama-server, by kind
	// Listen is where a managed backend listens: a loopback host:port
	// (port 0 picks one), or for llamacpp a .sock path. "" (the default):
	// llamacpp on a Unix socket in the state directory, which only ctxd's
	// uid can reach; ollama (which has no Unix socket) on 127.0.0.1:0.
	Listen    string   `toml:"listen"`
	Model     string   `toml:"model"`       // model name on the server
	GGUF      string   `toml:"gguf"`        // managed: the model file (Ollama imports it as Model; "": an existing model); external llamacpp: the server's model as ctxd sees it ("": /props' path, else count with /tokenize)
	NumCtx    int      `toml:"num_ctx"`     // context window; 0: the model's trained length, capped at MaxNumCtx
	MaxNumCtx int      `toml:"max_num_ctx"` // upper bound when NumCtx is 0
	NumBatch  int      `toml:"num_batch"`
	NumThread int      `toml:"num_thread"` // 0: the backend's default
	Slots     int      `toml:"slots"`      // sequences the backend serves at once (managed: OLLAMA_NUM_PARALLEL)
	KeepAlive Duration `toml:"keep_alive"` // how long the model stays loaded; negative: forever
	Format    string   `toml:"format"`     // auto (the model's chat template if it has one), template, or plain
	// SlotSavePath: llamacpp, external: the server's --slot-save-path as
	// ctxd sees it, for warm restarts ("": none). Managed: state_dir/llamacpp/slots.
	SlotSavePath string `toml:"slot_save_path"`
	APIKey       string `toml:"api_key"` // llamacpp, openai: sent as a bearer token (llama-server's --api-key), if the server wants one
	// CAFile: openai: PEM certificates an https server's certificate must
	// chain to ("": the system's roots).
	CAFile string `toml:"ca_file"`
	// Retries: openai: how often a request that cannot have reached a
	// model (a refused connection; 429 or 503 before any answer) is sent
	// again. Nothing the server accepted is ever sent twice.
	Retries int `toml:"retries"`
	// IdleTimeout: openai: a generation whose server sends nothing for
	// this long is closed and fails (0: 10 minutes).
	IdleTimeout Duration `toml:"idle_timeout"`
	// Prompt: openai: how the prompt is sent: "tokens" (the ids ctxd
	// counted), "text", or "auto" (the default: ids when the server takes
	// them, which bring-up tries once).
	Prompt string `toml:"prompt"`
	// Routing: openai: the headers and body fields each request names its
	// session in, for the engine's or router's session affinity; nil: the
	// defaults (openai.DefaultRouting).
	Routing *Routing `toml:"routing"`
	// CacheRAMMB: llamacpp, managed: the server's host-memory prompt cache
	// (--cache-ram), counted in the memory plan beside the KV cache; 0 (the
	// default) turns it off: ctxd keeps prefixes warm in the slots and in
	// saved slot files instead.
	CacheRAMMB int `toml:"cache_ram_mb"`
	// CacheReuse: llamacpp: the smallest chunk, in tokens, that
	// llama-server shifts from its cache past a change (--cache-reuse;
	// managed: passed on; external: the server's own setting), and the
	// codex then puts the files an edit changed at its end so the ones
	// after them can be shifted. 0 (the default) turns it off: shifted
	// keys and values were computed with the old text in view.
	CacheReuse  int     `toml:"cache_reuse"`
	Temperature float64 `toml:"temperature"`
	Seed        int     `toml:"seed"`
}

// Store is [store]: where sessions, turns and the karma record are kept.
type Store struct {
	// Kind is "sqlite" (the default: one embedded database in the state
	// directory, this daemon's alone) or "postgres" (a PostgreSQL server
	// several daemons share: a session continued on another daemon picks
	// up its turns, and a verification on one reaches the others' karma).
	Kind string `toml:"kind"`
	// URL: postgres: the connection URL or key=value string
	// (postgres://ctxd@db.internal:5432/ctxd?sslmode=verify-full). A
	// password is best left out of it: PGPASSWORD or a ~/.pgpass file
	// give one, as they do to libpq.
	URL string `toml:"url"`
	// MaxConns: postgres: the connections this daemon's pool holds at most
	// (0: 8).
	MaxConns int `toml:"max_conns"`
}

// Shared reports whether the store is shared with other daemons.
func (s Store) Shared() bool { return s.Kind == "postgres" }

// Routing is [backend.routing]: values are templates of {session} (the
// session's opaque routing key) and {parent} (a side request's session's).
type Routing struct {
	Headers map[string]string `toml:"headers"`
	Fields  map[string]string `toml:"fields"`
}

// ServerBinary is the managed server's binary: Binary, or the kind's own
// name looked up on PATH.
func (b Backend) ServerBinary() string {
	switch {
	case b.Binary != "":
		return b.Binary
	case b.Kind == "llamacpp":
		return "llama-server"
	}
	return "ollama"
}

// Identity is the persona.
type Identity struct {
	Name    string `toml:"name"`
	Persona string `toml:"persona"`
}

// Codex is the tree loaded as the codex block.
type Codex struct {
	Path          string   `toml:"path"` // "" for no codex
	MaxFileBytes  int64    `toml:"max_file_bytes"`
	MaxTotalBytes int64    `toml:"max_total_bytes"`
	Include       []string `toml:"include"`   // gitignore-style patterns; only matching files load
	Exclude       []string `toml:"exclude"`   // gitignore-style patterns to leave out
	Redact        bool     `toml:"redact"`    // replace credentials with markers (default true)
	CAGRatio      float64  `toml:"cag_ratio"` // share of the prompt budget the codex may fill whole
	TopK          int      `toml:"top_k"`     // excerpts per query in RAG mode
	Watch         bool     `toml:"watch"`     // reload when files change
	// LoadRoots are the directories under which POST /v1/codex/load may
	// load a codex; the configured path is always allowed. Empty: only it.
	LoadRoots []string `toml:"load_roots"`
	// AllowCodexRedactOff lets a codex's own .ctxd.toml turn redaction
	// off (redact = false); otherwise such a codex is refused.
	AllowCodexRedactOff bool `toml:"allow_codex_redact_off"`
	// AllowSecretFiles are gitignore-style patterns naming secret files
	// (.env, keys, credentials; see docs/security.md) that may load. A
	// codex's own .ctxd.toml cannot bring them back.
	AllowSecretFiles []string `toml:"allow_secret_files"`
	// AllowHardLinks loads files with more than one link (skipped
	// otherwise: another link may be a file outside the codex).
	AllowHardLinks bool `toml:"allow_hard_links"`
	// Order is the order the codex's files render in: "stability" (the
	// files that change least first, from the tree's git history or
	// modification times; an edit then re-evaluates only the files from
	// it on) or "path".
	Order string `toml:"order"`
}

// Limits feed the governor.
type Limits struct {
	MaxChars         int    `toml:"max_chars"`          // 0: no character cap
	AnswerReserve    int    `toml:"answer_reserve"`     // tokens kept for the answer (and the most it may have)
	MaxDepth         int    `toml:"max_depth"`          // turns of history in the prompt; 0: no limit
	CompactTo        int    `toml:"compact_to"`         // turns left after a compaction; 0: max_depth/2
	KVCacheType      string `toml:"kv_cache_type"`      // f16, q8_0 or q4_0
	MemoryHeadroomMB int    `toml:"memory_headroom_mb"` // memory kept free besides weights and KV
	// MemoryBudgetMB is what every persona's weights, KV windows and host
	// prompt cache may plan together; 0: the memory free when the daemon
	// starts, less memory_headroom_mb.
	MemoryBudgetMB int `toml:"memory_budget_mb"`
	// DefaultPinned keeps the default persona resident whatever others
	// need.
	DefaultPinned bool `toml:"pin_default_persona"`
	// LowPowerAnswerReserve caps answers while the power band is
	// low_battery or low_power; 0: no cap.
	LowPowerAnswerReserve int `toml:"low_power_answer_reserve"`
}

// Sigil is one configured agent identity.
type Sigil struct {
	Description string   `toml:"description"`
	Scopes      []string `toml:"scopes"` // ask, search_codex, tools, tool:NAME, karma:read, karma:write
	// TokenSHA256 is the SHA-256 (hex) of the sigil's token; "" for none.
	// `ctxd sigil add` and `ctxd sigil token` make a token and print the
	// line to put here; the token itself is never stored.
	TokenSHA256 string `toml:"token_sha256"`
	// RevokedSHA256 are the hashes of its former tokens (`ctxd sigil
	// revoke` prints the line): one presented is refused as revoked.
	RevokedSHA256 []string `toml:"revoked_sha256"`
	// UIDs and GIDs restrict which Unix socket peers may act as the
	// sigil (SO_PEERCRED); empty: any peer that can open the socket.
	UIDs []int `toml:"uids"`
	GIDs []int `toml:"gids"`
	// Revoked refuses every request that acts as the sigil.
	Revoked bool `toml:"revoked"`
}

// Duration is a time.Duration written as "5m" or "-1s" in TOML.
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText writes a Go duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Env is what the defaults depend on; main fills it from the process.
type Env struct {
	UID           int
	XDGRuntimeDir string
	XDGStateHome  string
	Home          string
	// LlamaServer ($CTXD_LLAMA_SERVER) is llama-server's binary where a
	// llamacpp backend's binary is not set.
	LlamaServer string
}

// DefaultSocket is where the daemon listens and clients dial by default.
func DefaultSocket(env Env) string {
	if env.XDGRuntimeDir != "" {
		return filepath.Join(env.XDGRuntimeDir, "ctxd", "ctxd.sock")
	}
	return filepath.Join(os.TempDir(), "ctxd-"+strconv.Itoa(env.UID), "ctxd.sock")
}

// Default is the configuration without a file.
func Default(env Env) Config {
	state := filepath.Join(env.Home, ".local", "state", "ctxd")
	if env.XDGStateHome != "" {
		state = filepath.Join(env.XDGStateHome, "ctxd")
	}
	return Config{
		Daemon: Daemon{
			Socket: DefaultSocket(env), StateDir: state, LogLevel: "info", LogFormat: "auto",
			MaxBodyBytes: 1 << 20, DefaultSigil: "default", ShutdownGrace: Duration{10 * time.Second},
			WriteTimeout:   Duration{30 * time.Second},
			MaxConnections: 1024, BodyTimeout: Duration{30 * time.Second}, IdleTimeout: Duration{2 * time.Minute},
			MaxWebSocketsPerSigil: 64, MaxDashboardsPerSigil: 8, MaxMCPSessionsPerSigil: 64, MaxMCPSessions: 512,
			MaxUnauthenticated: 64, HeaderTimeout: Duration{5 * time.Second},
			MaxAsksPerSigil: 256, MaxSessionsPerSigil: 100000,
			StoreTimeout: Duration{10 * time.Second}, DisallowedTools: "refuse",
		},
		Backend: Backend{
			Kind: "ollama", Mode: "managed", URL: "http://127.0.0.1:11434",
			Model: "ctxd-demo", MaxNumCtx: 32768, NumBatch: 512, Slots: 1, Format: "auto",
			KeepAlive: Duration{-1}, Retries: 2, Prompt: "auto",
		},
		Identity: Identity{
			Name:    "ctxd",
			Persona: "You are a precise assistant for the codebase below. Answer from the codex; say so when it does not hold the answer.",
		},
		Codex: Codex{MaxFileBytes: 1 << 20, MaxTotalBytes: 512 << 20, Redact: true,
			CAGRatio: 0.7, TopK: 5, Watch: true, Order: ctxd.OrderStability},
		Limits: Limits{AnswerReserve: 256, MaxDepth: 32, KVCacheType: "f16", MemoryHeadroomMB: 512},
		Karma: Karma{Enabled: true, TopK: 5, MaxChars: 4000, MaxEntryChars: 1200, HalfLife: Duration{7 * 24 * time.Hour},
			MaxNoteBytes: 4096, MaxJudgements: 64},
		Env:    defaultEnvironment(),
		Store:  Store{Kind: "sqlite"},
		Sigils: map[string]Sigil{"default": {Scopes: slices.Clone(sigils.All)}},
	}
}

func defaultEnvironment() Environment {
	t := hostenv.DefaultThresholds()
	return Environment{
		Interval: Duration{time.Second}, Hold: Duration{t.Hold}, CheckBackend: true,
		VRAMModerateEnter: t.VRAMModerateEnter, VRAMModerateLeave: t.VRAMModerateLeave,
		VRAMHighEnter: t.VRAMHighEnter, VRAMHighLeave: t.VRAMHighLeave,
		VRAMCriticalEnter: t.VRAMCriticalEnter, VRAMCriticalLeave: t.VRAMCriticalLeave,
		LowBatteryEnter: t.LowBatteryEnter, LowBatteryLeave: t.LowBatteryLeave,
	}
}

// Load reads a TOML file over the defaults. Relative paths in the file are
// resolved against the file's directory.
func Load(path string, env Env) (Config, error) {
	c := Default(env)
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config: %w", err)
	}
	// A file that sets [sigils] replaces the default set rather than merging.
	c.Sigils = nil
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		return c, fmt.Errorf("config: %s: %w", path, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return c, fmt.Errorf("config: %s: unknown key %s", path, strings.Join(keys, ", "))
	}
	if c.Sigils == nil {
		c.Sigils = Default(env).Sigils
	}
	// Defaults are absolute, so a relative path came from the file.
	dir := filepath.Dir(path)
	paths := []*string{&c.Daemon.Socket, &c.Daemon.StateDir, &c.Codex.Path, &c.Backend.GGUF, &c.Backend.Binary}
	for i := range c.Codex.LoadRoots {
		paths = append(paths, &c.Codex.LoadRoots[i])
	}
	for i := range c.Personas {
		paths = append(paths, &c.Personas[i].GGUF, &c.Personas[i].Codex)
	}
	for _, p := range paths {
		if rest, ok := strings.CutPrefix(*p, "~/"); ok && env.Home != "" {
			*p = filepath.Join(env.Home, rest)
		}
		// A binary named without a slash is looked up on PATH, as a shell does.
		if p == &c.Backend.Binary && !strings.Contains(*p, "/") {
			continue
		}
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	// $CTXD_LLAMA_SERVER came from the shell, not the file: a relative path
	// in it is relative to the working directory, as the shell meant it.
	if c.Backend.Kind == "llamacpp" && c.Backend.Binary == "" && env.LlamaServer != "" {
		c.Backend.Binary = env.LlamaServer
		if strings.Contains(env.LlamaServer, "/") {
			abs, err := filepath.Abs(env.LlamaServer)
			if err != nil {
				return c, fmt.Errorf("config: CTXD_LLAMA_SERVER: %w", err)
			}
			c.Backend.Binary = abs
		}
	}
	return c, nil
}
