package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// Validate names every bad field, one error each ("config: FIELD: why"),
// joined: a section at a time, in the order below.
func (c Config) Validate() error {
	var p problems
	c.validateDaemon(&p)
	c.validateSigils(&p)
	c.Backend.validate(&p)
	c.Identity.validate(&p)
	c.Codex.validate(&p)
	if c.Backend.CacheReuse > 0 && c.Codex.Order == ctxd.OrderPath {
		p.bad("backend.cache_reuse", "moves the files an edit changed to the codex's end, which codex.order = %q forbids; use %q", ctxd.OrderPath, ctxd.OrderStability)
	}
	c.Limits.validate(&p)
	c.Env.validate(&p)
	c.Karma.validate(&p)
	c.Store.validate(&p)
	c.validatePersonas(&p)
	return errors.Join(p...)
}

// validatePersonas checks [[persona]]: names unique, none the default's,
// each usable in a URL's path and a directory's name; sigils configured;
// sizes not negative; and a backend ctxd runs itself (managed), whose
// servers or models it can stop and start again.
func (c Config) validatePersonas(p *problems) {
	if len(c.Personas) == 0 {
		return
	}
	if c.Backend.Mode != "managed" {
		p.bad("persona", "several personas need backend.mode = \"managed\": ctxd runs each persona's llama-server, or the Ollama that loads every persona's model, to evacuate and restore them; this is %s", c.Backend.Mode)
	}
	seen := map[string]bool{c.Backend.Model: true, "ctxd": true}
	for i, ps := range c.Personas {
		field := fmt.Sprintf("persona[%d]", i)
		switch {
		case !validPersonaName(ps.Name):
			p.bad(field+".name", "%q must be 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'", ps.Name)
		case seen[ps.Name]:
			p.bad(field+".name", "%q is taken (by the default persona, backend.model %q, by \"ctxd\", or by another persona)", ps.Name, c.Backend.Model)
		}
		if c.Backend.Kind == "ollama" && ps.Name != strings.ToLower(ps.Name) {
			p.bad(field+".name", "%q: on Ollama a persona's model is imported under its name, which Ollama keeps in lower case; name it %q", ps.Name, strings.ToLower(ps.Name))
		}
		seen[ps.Name] = true
		if ps.NumCtx < 0 {
			p.bad(field+".num_ctx", "%d must not be negative", ps.NumCtx)
		}
		if ps.Slots < 0 || ps.Slots > 64 {
			p.bad(field+".slots", "%d must be between 0 (backend.slots) and 64", ps.Slots)
		}
		if c.Backend.Kind == "ollama" && ps.Slots != 0 && ps.Slots != c.Backend.Slots {
			p.bad(field+".slots", "%d: on Ollama every model has the server's backend.slots (%d; OLLAMA_NUM_PARALLEL)", ps.Slots, c.Backend.Slots)
		}
		for _, sg := range ps.Sigils {
			if _, ok := c.Sigils[sg]; !ok {
				p.bad(field+".sigils", "%q is not a configured sigil", sg)
			}
		}
		if ps.GGUF == "" && c.Backend.GGUF == "" {
			p.bad(field+".gguf", "needs a model file (or backend.gguf)")
		}
	}
}

// validPersonaName: a name for URLs, model fields and a directory.
func validPersonaName(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// problems are the bad fields a validation found, in the order found.
type problems []error

// bad records that field is bad, and why.
func (p *problems) bad(field, format string, args ...any) {
	*p = append(*p, fmt.Errorf("config: %s: %s", field, fmt.Sprintf(format, args...)))
}

// validateDaemon checks [daemon]: the socket and state directory, logging,
// the request limits and timeouts, the TCP and metrics listeners (which
// depend on the sigils' tokens) and the default sigil.
func (c Config) validateDaemon(p *problems) {
	d := c.Daemon
	if d.Socket == "" {
		p.bad("daemon.socket", "must be set")
	} else if len(d.Socket) > 100 {
		p.bad("daemon.socket", "%q is %d bytes; Unix socket paths must stay under ~100", d.Socket, len(d.Socket))
	}
	if d.StateDir == "" {
		p.bad("daemon.state_dir", "must be set")
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, d.LogLevel) {
		p.bad("daemon.log_level", "%q is not one of debug, info, warn, error", d.LogLevel)
	}
	if d.MaxBodyBytes < 1024 {
		p.bad("daemon.max_body_bytes", "%d is below 1024", d.MaxBodyBytes)
	}
	if g := d.ShutdownGrace.Duration; g < 0 || g > 5*time.Minute {
		p.bad("daemon.shutdown_grace", "%v must be between 0s and 5m", g)
	}
	if n := d.MaxConnections; n < 16 || n > 1<<20 {
		p.bad("daemon.max_connections", "%d must be between 16 and 1048576", n)
	}
	for _, b := range []struct {
		key string
		n   int
	}{{"daemon.max_websockets_per_sigil", d.MaxWebSocketsPerSigil}, {"daemon.max_dashboards_per_sigil", d.MaxDashboardsPerSigil},
		{"daemon.max_mcp_sessions_per_sigil", d.MaxMCPSessionsPerSigil}, {"daemon.max_mcp_sessions", d.MaxMCPSessions},
		{"daemon.max_unauthenticated", d.MaxUnauthenticated}, {"daemon.max_asks_per_sigil", d.MaxAsksPerSigil}} {
		if b.n < 1 || b.n > 1<<16 {
			p.bad(b.key, "%d must be between 1 and 65536", b.n)
		}
	}
	if n := d.MaxSessionsPerSigil; n < 1 || n > 1<<30 {
		p.bad("daemon.max_sessions_per_sigil", "%d must be between 1 and 1073741824", n)
	}
	if h := d.HeaderTimeout.Duration; h < 100*time.Millisecond || h > time.Minute {
		p.bad("daemon.header_timeout", "%v must be between 100ms and 1m", h)
	}
	if b := d.BodyTimeout.Duration; b < 100*time.Millisecond || b > 10*time.Minute {
		p.bad("daemon.body_timeout", "%v must be between 100ms and 10m", b)
	}
	if i := d.IdleTimeout.Duration; i < time.Second || i > time.Hour {
		p.bad("daemon.idle_timeout", "%v must be between 1s and 1h", i)
	}
	if s := d.StoreTimeout.Duration; s < 100*time.Millisecond || s > 10*time.Minute {
		p.bad("daemon.store_timeout", "%v must be between 100ms and 10m", s)
	}
	if !slices.Contains([]string{"refuse", "leave_out"}, d.DisallowedTools) {
		p.bad("daemon.disallowed_tools", "%q is not refuse or leave_out", d.DisallowedTools)
	}
	if w := d.WriteTimeout.Duration; w < 100*time.Millisecond {
		p.bad("daemon.write_timeout", "%v must be at least 100ms", w)
	}
	if !slices.Contains([]string{"auto", "json", "text"}, d.LogFormat) {
		p.bad("daemon.log_format", "%q is not one of auto, json, text", d.LogFormat)
	}
	c.validateListeners(p)
	if _, ok := c.Sigils[d.DefaultSigil]; !ok {
		p.bad("daemon.default_sigil", "%q is not a configured sigil", d.DefaultSigil)
	}
}

// validateListeners checks daemon.metrics_listen and
// daemon.dashboard_listen (loopback only: this machine's) and
// daemon.tcp_listen (loopback unless allowed, and only with a sigil that
// has a token to use it).
func (c Config) validateListeners(p *problems) {
	d := c.Daemon
	loopbackOnly(p, "daemon.metrics_listen", d.MetricsListen, "the metrics listener has no tokens, so it serves this machine only",
		map[string]string{"daemon.tcp_listen": d.TCPListen})
	loopbackOnly(p, "daemon.dashboard_listen", d.DashboardListen, "the dashboard listener serves this machine only (a remote viewer uses daemon.tcp_listen, with a token)",
		map[string]string{"daemon.tcp_listen": d.TCPListen, "daemon.metrics_listen": d.MetricsListen})
	if a := d.TCPListen; a != "" {
		host, _, err := net.SplitHostPort(a)
		ip := net.ParseIP(host)
		switch {
		case err != nil:
			p.bad("daemon.tcp_listen", "%q is not host:port: %v", a, err)
		case !d.TCPAllowRemote && host != "localhost" && (ip == nil || !ip.IsLoopback()):
			p.bad("daemon.tcp_listen", "%q is not a loopback address; set daemon.tcp_allow_remote = true to listen beyond this machine (tokens are still required)", a)
		case c.liveTokens() == 0:
			p.bad("daemon.tcp_listen", "every request on the TCP listener needs a sigil's token, and no sigil has one: run `ctxd sigil token NAME` and add its token_sha256 line")
		}
	}
}

// liveTokens is how many sigils have a token and are not revoked.
func (c Config) liveTokens() int {
	n := 0
	for _, sg := range c.Sigils {
		if sg.TokenSHA256 != "" && !sg.Revoked {
			n++
		}
	}
	return n
}

// validateSigils checks [sigils.NAME]: each name, scope, hash and id.
func (c Config) validateSigils(p *problems) {
	for name, sg := range c.Sigils {
		sg.validate(p, name)
	}
}

func (sg Sigil) validate(p *problems, name string) {
	if !sigils.NameRE.MatchString(name) {
		p.bad("sigils."+name, "the name must match %s", sigils.NameRE)
	}
	for _, sc := range sg.Scopes {
		if err := sigils.CheckScope(sc); err != nil {
			p.bad("sigils."+name+".scopes", "%v", err)
		}
	}
	for _, h := range sg.RevokedSHA256 {
		if !isHash(h) {
			p.bad("sigils."+name+".revoked_sha256", "%q must be 64 lowercase hex digits", h)
		}
	}
	for _, id := range append(slices.Clone(sg.UIDs), sg.GIDs...) {
		if id < 0 {
			p.bad("sigils."+name+".uids", "uid/gid %d must not be negative", id)
		}
	}
	switch {
	case sg.TokenSHA256 == "":
	case !isHash(sg.TokenSHA256):
		p.bad("sigils."+name+".token_sha256", "must be 64 lowercase hex digits (the line `ctxd sigil add` prints)")
	case slices.Contains(sg.RevokedSHA256, sg.TokenSHA256):
		p.bad("sigils."+name+".token_sha256", "is also in revoked_sha256: make a new token with `ctxd sigil token %s`", name)
	}
}

func isHash(h string) bool {
	return len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
}

// validate checks [backend]: the kind and mode and what each needs, the
// model, the window and slots, and the sampling.
func (b Backend) validate(p *problems) {
	llama := b.Kind == "llamacpp"
	if b.Kind != "ollama" && !llama && b.Kind != "openai" {
		p.bad("backend.kind", "%q is not one of ollama, llamacpp, openai", b.Kind)
	}
	b.validateOpenAI(p)
	switch b.Mode {
	case "managed":
		if b.Kind == "openai" {
			p.bad("backend.mode", "\"managed\": ctxd does not run an OpenAI-compatible server: set mode = \"external\" and url to the server (or its router)")
			break
		}
		if b.Listen == "" || llama && strings.HasSuffix(b.Listen, ".sock") {
			break // "": the default, chosen per kind at start
		}
		if host, _, err := net.SplitHostPort(b.Listen); err != nil {
			p.bad("backend.listen", "%v", err)
		} else if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			p.bad("backend.listen", "%q: a managed backend listens on a loopback address", b.Listen)
		}
		if llama && b.GGUF == "" {
			p.bad("backend.gguf", "must be set: a managed llama-server loads this model file")
		}
	case "external":
		if llama && strings.HasSuffix(b.URL, ".sock") {
			break
		}
		if !strings.HasPrefix(b.URL, "http://") && !strings.HasPrefix(b.URL, "https://") {
			p.bad("backend.url", "%q must be an http:// or https:// URL", b.URL)
		}
	default:
		p.bad("backend.mode", "%q is not one of managed, external", b.Mode)
	}
	if b.Model == "" && b.Kind != "openai" { // openai: "" takes the server's only model
		p.bad("backend.model", "must be set")
	}
	if b.NumCtx < 0 || b.MaxNumCtx <= 0 {
		p.bad("backend.num_ctx", "num_ctx must be 0 or positive and max_num_ctx positive")
	}
	if !slices.Contains([]string{"auto", "template", "plain"}, b.Format) && !runcontext.FormatterNameRE.MatchString(b.Format) {
		p.bad("backend.format", "%q is not one of auto, template, plain, nor the name of a registered format (%s)", b.Format, runcontext.FormatterNameRE)
	}
	if b.Slots < 1 || b.Slots > 64 {
		p.bad("backend.slots", "%d must be between 1 and 64", b.Slots)
	}
	if b.NumBatch < 0 || b.NumThread < 0 {
		p.bad("backend.num_batch", "num_batch and num_thread must not be negative")
	}
	if b.CacheRAMMB < 0 {
		p.bad("backend.cache_ram_mb", "%d must not be negative", b.CacheRAMMB)
	} else if b.CacheRAMMB > 0 && (b.Kind != "llamacpp" || b.Mode != "managed") {
		p.bad("backend.cache_ram_mb", "is for a managed llama-server only (backend.kind = \"llamacpp\", backend.mode = \"managed\")")
	}
	switch {
	case b.CacheReuse < 0:
		p.bad("backend.cache_reuse", "%d must not be negative", b.CacheReuse)
	case b.CacheReuse > 0 && b.Kind != "llamacpp":
		p.bad("backend.cache_reuse", "is llama-server's --cache-reuse (backend.kind = \"llamacpp\"); Ollama reuses only a cached prefix")
	}
	if !(b.Temperature >= 0 && b.Temperature <= math.MaxFloat64) { // written so that NaN and Inf fail
		p.bad("backend.temperature", "%v must be a finite number, 0 or more", b.Temperature)
	}
}

// reservedFields are the /v1/completions fields ctxd writes itself: a
// routing field may not replace them.
var reservedFields = []string{"model", "prompt", "stream", "stream_options", "max_tokens", "stop", "temperature", "seed"}

// headerName is an HTTP header name (RFC 9110's token).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// reservedHeaders are the headers ctxd or HTTP itself sets: a routing
// header may not replace them.
var reservedHeaders = []string{"Authorization", "Content-Type", "Content-Length", "Host", "Accept", "Connection", "Transfer-Encoding", "Te", "Trailer", "Upgrade"}

// validateOpenAI checks the settings of backend.kind = "openai", and that
// they are not set for another kind.
func (b Backend) validateOpenAI(p *problems) {
	openai := b.Kind == "openai"
	switch {
	case b.CAFile != "" && !openai:
		p.bad("backend.ca_file", "is for backend.kind = \"openai\"")
	case b.CAFile != "" && !strings.HasPrefix(b.URL, "https://"):
		p.bad("backend.ca_file", "is set but backend.url %q is not https://", b.URL)
	}
	if b.Retries < 0 || b.Retries > 10 {
		p.bad("backend.retries", "%d must be between 0 and 10", b.Retries)
	}
	if b.IdleTimeout.Duration < 0 || b.IdleTimeout.Duration > 0 && b.IdleTimeout.Duration < time.Second {
		p.bad("backend.idle_timeout", "%s must be 0 (10 minutes) or at least 1s", b.IdleTimeout)
	}
	if !slices.Contains([]string{"auto", "tokens", "text"}, b.Prompt) {
		p.bad("backend.prompt", "%q is not one of auto, tokens, text", b.Prompt)
	}
	if b.Routing == nil {
		return
	}
	if !openai {
		p.bad("backend.routing", "is for backend.kind = \"openai\"")
	}
	for name, v := range b.Routing.Headers {
		if !headerName.MatchString(name) {
			p.bad("backend.routing.headers", "%q is not an HTTP header name", name)
		} else if slices.Contains(reservedHeaders, http.CanonicalHeaderKey(name)) {
			p.bad("backend.routing.headers", "%q is a header ctxd or HTTP sets itself", name)
		}
		checkRouteValue(p, "backend.routing.headers."+name, v)
	}
	for name, v := range b.Routing.Fields {
		if name == "" || slices.Contains(reservedFields, name) {
			p.bad("backend.routing.fields", "%q is a field ctxd writes itself (%s)", name, strings.Join(reservedFields, ", "))
		}
		checkRouteValue(p, "backend.routing.fields."+name, v)
	}
}

// routeVar finds a routing value's {variables}.
var routeVar = regexp.MustCompile(`\{[^{}]*\}`)

// checkRouteValue refuses a routing value with an unknown variable or a
// character a header cannot carry.
func checkRouteValue(p *problems, field, v string) {
	for _, m := range routeVar.FindAllString(v, -1) {
		if m != "{session}" && m != "{parent}" {
			p.bad(field, "%q: %s is not one of {session}, {parent}", v, m)
		}
	}
	for _, r := range v {
		if r < 0x20 || r > 0x7e {
			p.bad(field, "%q: only printable ASCII may go in a header or a routing field", v)
			break
		}
	}
}

// validate checks [store].
func (s Store) validate(p *problems) {
	switch s.Kind {
	case "sqlite":
		if s.URL != "" {
			p.bad("store.url", "is for store.kind = \"postgres\"; the SQLite store is state_dir/ctxd.db")
		}
	case "postgres":
		if !strings.HasPrefix(s.URL, "postgres://") && !strings.HasPrefix(s.URL, "postgresql://") && !strings.Contains(s.URL, "=") {
			p.bad("store.url", "must be a PostgreSQL connection URL (postgres://user@host:5432/db) or key=value string")
		}
	default:
		p.bad("store.kind", "%q is not one of sqlite, postgres", s.Kind)
	}
	if s.MaxConns < 0 || s.MaxConns > 1000 {
		p.bad("store.max_conns", "%d must be between 0 (8) and 1000", s.MaxConns)
	}
}

// validate checks [identity].
func (id Identity) validate(p *problems) {
	if strings.TrimSpace(id.Persona) == "" {
		p.bad("identity.persona", "must not be empty")
	}
}

// validate checks [codex]: its sizes, patterns, CAG ratio, load roots and
// retrieval depth.
func (cx Codex) validate(p *problems) {
	if cx.MaxFileBytes <= 0 || cx.MaxTotalBytes <= 0 {
		p.bad("codex.max_file_bytes", "max_file_bytes and max_total_bytes must be positive")
	}
	if err := codex.ValidatePatterns(cx.Exclude); err != nil {
		p.bad("codex.exclude", "%v", err)
	}
	if err := codex.ValidatePatterns(cx.Include); err != nil {
		p.bad("codex.include", "%v", err)
	}
	if err := codex.ValidatePatterns(cx.AllowSecretFiles); err != nil {
		p.bad("codex.allow_secret_files", "%v", err)
	}
	if !(cx.CAGRatio > 0 && cx.CAGRatio <= 1) { // written so that NaN fails
		p.bad("codex.cag_ratio", "%v must be in (0, 1]", cx.CAGRatio)
	}
	for _, root := range cx.LoadRoots {
		if !filepath.IsAbs(root) {
			p.bad("codex.load_roots", "%q must be an absolute path (or relative to the config file)", root)
		}
	}
	if cx.TopK <= 0 {
		p.bad("codex.top_k", "%d must be positive", cx.TopK)
	}
	if cx.Order != ctxd.OrderStability && cx.Order != ctxd.OrderPath {
		p.bad("codex.order", "%q must be %q or %q", cx.Order, ctxd.OrderStability, ctxd.OrderPath)
	}
}

// validate checks [limits]: the prompt's sizes, the conversation's depth,
// the KV cache type and the memory headroom.
func (l Limits) validate(p *problems) {
	if l.MaxChars < 0 {
		p.bad("limits.max_chars", "%d must not be negative", l.MaxChars)
	}
	if l.AnswerReserve <= 0 {
		p.bad("limits.answer_reserve", "%d must be positive", l.AnswerReserve)
	}
	if l.MaxDepth < 0 {
		p.bad("limits.max_depth", "%d must not be negative", l.MaxDepth)
	}
	if l.CompactTo < 0 || (l.MaxDepth > 0 && l.CompactTo > l.MaxDepth) {
		p.bad("limits.compact_to", "%d must be between 0 and max_depth %d", l.CompactTo, l.MaxDepth)
	}
	if _, err := governor.ParseCacheType(l.KVCacheType); err != nil {
		p.bad("limits.kv_cache_type", "%q is not one of f16, q8_0, q4_0", l.KVCacheType)
	}
	if r := l.LowPowerAnswerReserve; r < 0 || r > l.AnswerReserve {
		p.bad("limits.low_power_answer_reserve", "%d must be between 0 (off) and answer_reserve %d", r, l.AnswerReserve)
	}
	if l.MemoryHeadroomMB < 0 {
		p.bad("limits.memory_headroom_mb", "%d must not be negative", l.MemoryHeadroomMB)
	}
	if l.MemoryBudgetMB < 0 {
		p.bad("limits.memory_budget_mb", "%d must not be negative (0: the memory free at start)", l.MemoryBudgetMB)
	}
}

// validate checks [environment]: the reading interval and the bands'
// thresholds (hostenv's rules, each error naming its field).
func (e Environment) validate(p *problems) {
	if iv := e.Interval.Duration; iv < 100*time.Millisecond || iv > time.Minute {
		p.bad("environment.interval", "%v must be between 100ms and 1m", iv)
	}
	if err := e.Thresholds().Validate(); err != nil {
		var fe *hostenv.FieldError
		for _, err := range unwrapAll(err) {
			if errors.As(err, &fe) {
				p.bad("environment."+fe.Field, "%s", fe.Problem)
			} else {
				p.bad("environment", "%v", err)
			}
		}
	}
}

// unwrapAll is the errors a joined error holds (or err itself).
func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// validate checks [karma]: how many entries, how long, and how fast
// they age.
func (k Karma) validate(p *problems) {
	if k.TopK < 1 || k.TopK > 100 {
		p.bad("karma.top_k", "%d must be between 1 and 100", k.TopK)
	}
	if k.MaxEntryChars < 1 || k.MaxChars < k.MaxEntryChars {
		p.bad("karma.max_chars", "max_entry_chars %d must be positive and max_chars %d at least as large", k.MaxEntryChars, k.MaxChars)
	}
	if k.HalfLife.Duration < time.Minute {
		p.bad("karma.half_life", "%v must be at least 1m", k.HalfLife.Duration)
	}
	if k.MaxNoteBytes < 1 || k.MaxNoteBytes > 1<<20 {
		p.bad("karma.max_note_bytes", "%d must be between 1 and 1048576", k.MaxNoteBytes)
	}
	if k.MaxJudgements < 1 || k.MaxJudgements > 1<<16 {
		p.bad("karma.max_judgements", "%d must be between 1 and 65536", k.MaxJudgements)
	}
}

// loopbackOnly checks the listener key's address a ("" for none): host:port
// on a loopback address (why says why it must be), on a port none of the
// others' addresses has (port 0, any free one, is never shared).
func loopbackOnly(p *problems, key, a, why string, others map[string]string) {
	if a == "" {
		return
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		p.bad(key, "%q is not host:port: %v", a, err)
		return
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		p.bad(key, "%q is not a loopback address: %s", a, why)
		return
	}
	for _, other := range slices.Sorted(maps.Keys(others)) {
		if port != "0" && a == others[other] {
			p.bad(key, "%q is also %s; give each its own port", a, other)
		}
	}
}
