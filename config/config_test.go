package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var env = Env{UID: 1000, Home: "/home/u"}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ctxd.toml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaults(t *testing.T) {
	c := Default(env)
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.Daemon.Socket != filepath.Join(os.TempDir(), "ctxd-1000", "ctxd.sock") {
		t.Errorf("socket without XDG_RUNTIME_DIR = %s", c.Daemon.Socket)
	}
	if got := DefaultSocket(Env{XDGRuntimeDir: "/run/user/7"}); got != "/run/user/7/ctxd/ctxd.sock" {
		t.Errorf("socket with XDG_RUNTIME_DIR = %s", got)
	}
}

func TestLoad(t *testing.T) {
	path := writeConfig(t, `
[daemon]
state_dir = "var/state"
[backend]
binary = "bin/ollama"
gguf = "var/models/demo.gguf"
keep_alive = "10m"
[codex]
path = "."
[sigils.coder]
scopes = ["ask", "search_codex"]
[daemon.x]
`)
	_, err := Load(path, env)
	if err == nil || !strings.Contains(err.Error(), "daemon.x") {
		t.Fatalf("unknown table: %v", err)
	}
	path = writeConfig(t, `
[daemon]
state_dir = "var/state"
default_sigil = "coder"
[backend]
binary = "bin/ollama"
gguf = "var/models/demo.gguf"
keep_alive = "10m"
[codex]
path = "~/src/proj"
[sigils.coder]
scopes = ["ask", "search_codex"]
`)
	c, err := Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	if c.Daemon.StateDir != filepath.Join(dir, "var/state") || c.Backend.Binary != filepath.Join(dir, "bin/ollama") || c.Codex.Path != "/home/u/src/proj" {
		t.Errorf("relative paths not resolved against the file: %+v %+v", c.Daemon, c.Codex)
	}
	if c.Backend.KeepAlive.Duration != 10*time.Minute {
		t.Errorf("keep_alive = %v", c.Backend.KeepAlive)
	}
	if _, ok := c.Sigils["default"]; ok {
		t.Error("a file's [sigils] should replace the default set")
	}
	if err := c.Validate(); err != nil {
		t.Errorf("loaded config invalid: %v", err)
	}
}

// TestLlamaServerBinary: a llamacpp backend without a binary takes
// $CTXD_LLAMA_SERVER, else llama-server on PATH; a binary in the file wins.
func TestLlamaServerBinary(t *testing.T) {
	e := env
	e.LlamaServer = "/opt/llama/llama-server"
	for _, c := range []struct{ file, want string }{
		{"[backend]\nkind = \"llamacpp\"\ngguf = \"/m.gguf\"\n", "/opt/llama/llama-server"},
		{"[backend]\nkind = \"llamacpp\"\nbinary = \"/usr/bin/llama-server\"\n", "/usr/bin/llama-server"},
		{"[backend]\nkind = \"ollama\"\n", "ollama"},
	} {
		cfg, err := Load(writeConfig(t, c.file), e)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Backend.ServerBinary(); got != c.want {
			t.Errorf("%q: binary %q, want %q", c.file, got, c.want)
		}
	}
	cfg, err := Load(writeConfig(t, "[backend]\nkind = \"llamacpp\"\n"), env)
	if err != nil || cfg.Backend.ServerBinary() != "llama-server" {
		t.Errorf("without CTXD_LLAMA_SERVER: %q, %v", cfg.Backend.ServerBinary(), err)
	}
	// A relative CTXD_LLAMA_SERVER is the shell's: relative to the working
	// directory, not to the config file's.
	e.LlamaServer = "bin/llama-server"
	cfg, err = Load(writeConfig(t, "[backend]\nkind = \"llamacpp\"\n"), e)
	wd, _ := os.Getwd()
	if want := filepath.Join(wd, "bin", "llama-server"); err != nil || cfg.Backend.ServerBinary() != want {
		t.Errorf("relative CTXD_LLAMA_SERVER: %q, %v; want %q", cfg.Backend.ServerBinary(), err, want)
	}
}

func TestLoadErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"typo":       "[backend]\nmodle = \"x\"\n",
		"bad type":   "[backend]\nnum_ctx = \"big\"\n",
		"bad syntax": "[backend\n",
		"duration":   "[backend]\nkeep_alive = \"forever\"\n",
	}
	for name, body := range cases {
		if _, err := Load(writeConfig(t, body), env); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name == "typo" && !strings.Contains(err.Error(), "backend.modle") {
			t.Errorf("typo: %v does not name the key", err)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml"), env); err == nil {
		t.Error("missing file accepted")
	}
}

func TestValidateNamesField(t *testing.T) {
	cases := map[string]func(*Config){
		"backend.mode":                func(c *Config) { c.Backend.Mode = "cloud" },
		"backend.listen":              func(c *Config) { c.Backend.Listen = "0.0.0.0:11434" },
		"backend.url":                 func(c *Config) { c.Backend.Mode = "external"; c.Backend.URL = "localhost:11434" },
		"daemon.log_level":            func(c *Config) { c.Daemon.LogLevel = "loud" },
		"daemon.default_sigil":        func(c *Config) { c.Daemon.DefaultSigil = "nobody" },
		"limits.answer_reserve":       func(c *Config) { c.Limits.AnswerReserve = 0 },
		"identity.persona":            func(c *Config) { c.Identity.Persona = "" },
		"daemon.socket":               func(c *Config) { c.Daemon.Socket = "/" + strings.Repeat("s", 120) },
		"daemon.max_body_bytes":       func(c *Config) { c.Daemon.MaxBodyBytes = 10 },
		"backend.model":               func(c *Config) { c.Backend.Model = "" },
		"backend.cache_ram_mb":        func(c *Config) { c.Backend.CacheRAMMB = 512 }, // Ollama has no such cache
		"backend.cache_ram_mb ":       func(c *Config) { c.Backend.Kind, c.Backend.CacheRAMMB = "llamacpp", -1 },
		"backend.cache_reuse":         func(c *Config) { c.Backend.CacheReuse = 64 },                                                          // Ollama shifts nothing
		"backend.mode ":               func(c *Config) { c.Backend.Kind = "openai" },                                                          // ctxd runs no OpenAI server
		"backend.ca_file":             func(c *Config) { c.Backend.Kind, c.Backend.Mode, c.Backend.CAFile = "openai", "external", "/ca.pem" }, // http URL
		"backend.ca_file ":            func(c *Config) { c.Backend.CAFile = "/ca.pem" },                                                       // not openai
		"backend.retries":             func(c *Config) { c.Backend.Retries = -1 },
		"backend.prompt":              func(c *Config) { c.Backend.Prompt = "ids" },
		"store.kind":                  func(c *Config) { c.Store.Kind = "mysql" },
		"store.url":                   func(c *Config) { c.Store.Kind = "postgres" },
		"store.url ":                  func(c *Config) { c.Store.URL = "postgres://db/ctxd" }, // sqlite takes none
		"store.max_conns":             func(c *Config) { c.Store.Kind, c.Store.URL, c.Store.MaxConns = "postgres", "postgres://db/ctxd", -1 },
		"backend.idle_timeout":        func(c *Config) { c.Backend.IdleTimeout = Duration{-time.Second} },
		"backend.routing":             func(c *Config) { c.Backend.Routing = &Routing{} }, // not openai
		"backend.routing.headers":     func(c *Config) { openAIRouting(c).Headers["Bad Name"] = "{session}" },
		"backend.routing.headers.X-A": func(c *Config) { openAIRouting(c).Headers["X-A"] = "{sigil}" },
		"backend.routing.fields":      func(c *Config) { openAIRouting(c).Fields["prompt"] = "{session}" },
		"backend.routing.fields.sid":  func(c *Config) { openAIRouting(c).Fields["sid"] = "a\r\nb" },
		"backend.routing.headers ":    func(c *Config) { openAIRouting(c).Headers["authorization"] = "{session}" },
		"backend.routing.headers.X-B": func(c *Config) { openAIRouting(c).Headers["X-B"] = "é{session}" },
		"backend.idle_timeout ":       func(c *Config) { c.Backend.IdleTimeout = Duration{time.Millisecond} },
		"backend.cache_reuse ":        func(c *Config) { c.Backend.Kind, c.Backend.CacheReuse = "llamacpp", -1 },
		"backend.cache_reuse  ":       func(c *Config) { c.Backend.Kind, c.Backend.CacheReuse, c.Codex.Order = "llamacpp", 64, "path" },
		"sigils.default.token_sha256": func(c *Config) { c.Sigils["default"] = Sigil{Scopes: []string{"ask"}, TokenSHA256: "xyz"} },
		"daemon.log_format":           func(c *Config) { c.Daemon.LogFormat = "xml" },
		"daemon.metrics_listen":       func(c *Config) { c.Daemon.MetricsListen = "0.0.0.0:9464" },
		"daemon.metrics_listen ":      func(c *Config) { c.Daemon.MetricsListen = "9464" },
		"daemon.tcp_listen":           func(c *Config) { c.Daemon.TCPListen = "127.0.0.1:11435" }, // no sigil has a token
		"daemon.tcp_listen ": func(c *Config) {
			c.Daemon.TCPListen = "0.0.0.0:11435"
			c.Sigils["default"] = Sigil{Scopes: []string{"ask"}, TokenSHA256: strings.Repeat("a", 64)}
		},
		"daemon.tcp_listen  ":      func(c *Config) { c.Daemon.TCPListen = "11435" },
		"daemon.dashboard_listen":  func(c *Config) { c.Daemon.DashboardListen = "0.0.0.0:7480" },
		"daemon.dashboard_listen ": func(c *Config) { c.Daemon.DashboardListen = "7480" },
		"daemon.dashboard_listen  ": func(c *Config) {
			c.Daemon.DashboardListen, c.Daemon.MetricsListen = "127.0.0.1:7480", "127.0.0.1:7480"
		},
		"daemon.max_dashboards_per_sigil": func(c *Config) { c.Daemon.MaxDashboardsPerSigil = 0 },
		"persona":                         func(c *Config) { c.Backend.Mode, c.Personas = "external", []Persona{{Name: "w", GGUF: "/m.gguf"}} },
		"persona[0].name":                 func(c *Config) { c.Personas = []Persona{{Name: "ctxd", GGUF: "/m.gguf"}} },
		"persona[1].name":                 func(c *Config) { c.Personas = []Persona{{Name: "w", GGUF: "/m.gguf"}, {Name: "w", GGUF: "/m.gguf"}} },
		"persona[0].name ":                func(c *Config) { c.Personas = []Persona{{Name: "../etc", GGUF: "/m.gguf"}} },
		"persona[0].name  ":               func(c *Config) { c.Personas = []Persona{{Name: c.Backend.Model, GGUF: "/m.gguf"}} },
		"persona[0].sigils":               func(c *Config) { c.Personas = []Persona{{Name: "w", GGUF: "/m.gguf", Sigils: []string{"nobody"}}} },
		"persona[0].slots":                func(c *Config) { c.Personas = []Persona{{Name: "w", GGUF: "/m.gguf", Slots: 2}} }, // Ollama: the server's
		"persona[0].num_ctx":              func(c *Config) { c.Personas = []Persona{{Name: "w", GGUF: "/m.gguf", NumCtx: -1}} },
		"persona[0].gguf":                 func(c *Config) { c.Backend.GGUF, c.Personas = "", []Persona{{Name: "w"}} },
		"limits.memory_budget_mb":         func(c *Config) { c.Limits.MemoryBudgetMB = -1 },
		"persona[0].name   ":              func(c *Config) { c.Personas = []Persona{{Name: "Writer", GGUF: "/m.gguf"}} }, // Ollama: lower case
	}
	for field, mutate := range cases {
		c := Default(env)
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("%s: error %v does not name it", field, err)
		}
	}
}

func TestTCPListen(t *testing.T) {
	c := Default(env)
	c.Sigils["default"] = Sigil{Scopes: []string{"ask"}, TokenSHA256: strings.Repeat("a", 64)}
	for _, addr := range []string{"127.0.0.1:11435", "[::1]:0", "localhost:11435"} {
		c.Daemon.TCPListen = addr
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
	c.Daemon.TCPListen, c.Daemon.TCPAllowRemote = "0.0.0.0:11435", true
	if err := c.Validate(); err != nil {
		t.Errorf("a remote address explicitly allowed: %v", err)
	}
}

// TestPersonaConfig: a persona's configuration is the default's with its
// own name, identity, model, window, slots, codex and state directory;
// what it leaves out is the default's. Relative paths in the file are the
// file's.
func TestPersonaConfig(t *testing.T) {
	path := writeConfig(t, "[backend]\nkind = \"llamacpp\"\nmodel = \"coder\"\ngguf = \"a.gguf\"\nnum_ctx = 4096\n\n[[persona]]\nname = \"writer\"\ngguf = \"b.gguf\"\ncodex = \"docs\"\nnum_ctx = 2048\npersona = \"You write.\"\n\n[[persona]]\nname = \"reviewer\"\npinned = true\n")
	c, err := Load(path, env)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(path)
	w, r := c.PersonaConfig(0), c.PersonaConfig(1)
	if w.Backend.Model != "writer" || w.Backend.GGUF != filepath.Join(dir, "b.gguf") || w.Codex.Path != filepath.Join(dir, "docs") ||
		w.Backend.NumCtx != 2048 || w.Identity.Persona != "You write." || w.Daemon.StateDir != filepath.Join(c.Daemon.StateDir, "personas", "writer") || len(w.Personas) != 0 {
		t.Errorf("writer: %+v %+v %+v %+v", w.Backend, w.Codex.Path, w.Identity, w.Daemon.StateDir)
	}
	if r.Backend.GGUF != filepath.Join(dir, "a.gguf") || r.Backend.NumCtx != 4096 || r.Identity.Persona != c.Identity.Persona || !c.Personas[1].Pinned {
		t.Errorf("reviewer: %+v %+v", r.Backend, r.Identity)
	}
}

// openAIRouting makes c an external OpenAI backend with empty routing,
// for a case to spoil.
func openAIRouting(c *Config) *Routing {
	c.Backend.Kind, c.Backend.Mode, c.Backend.URL = "openai", "external", "https://engine:8000/v1"
	c.Backend.Routing = &Routing{Headers: map[string]string{}, Fields: map[string]string{}}
	return c.Backend.Routing
}

// TestRepositoryConfigs: the configurations make run and make run-llamacpp
// use load and validate.
func TestRepositoryConfigs(t *testing.T) {
	for _, name := range []string{"ctxd.toml", "ctxd-llamacpp.toml"} {
		c, err := Load(filepath.Join("..", name), env)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestValidateReportsEverySection: a configuration bad in every section
// is refused with one line for each, a section at a time in Validate's
// order, each naming its field.
func TestValidateReportsEverySection(t *testing.T) {
	c := Default(env)
	c.Daemon.LogLevel = "loud"
	c.Sigils["default"] = Sigil{Scopes: []string{"ask"}, TokenSHA256: "xyz"}
	c.Backend.Model = ""
	c.Identity.Persona = " "
	c.Codex.TopK = 0
	c.Limits.AnswerReserve, c.Limits.LowPowerAnswerReserve = 0, 0
	c.Env.Interval.Duration = time.Hour
	c.Karma.TopK = 0
	want := []string{"daemon.log_level", "sigils.default.token_sha256", "backend.model", "identity.persona",
		"codex.top_k", "limits.answer_reserve", "environment.interval", "karma.top_k"}
	err := c.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	got := strings.Split(err.Error(), "\n")
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d:\n%v", len(got), len(want), err)
	}
	for i, field := range want {
		if !strings.HasPrefix(got[i], "config: "+field+": ") {
			t.Errorf("line %d is %q, want it to name %s", i+1, got[i], field)
		}
	}
}
