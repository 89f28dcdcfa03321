package httpapi

import (
	"context"
	"slices"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/persona"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
)

// Status is the body of GET /v1/status.
type Status struct {
	Version      string               `json:"version"`
	Ready        bool                 `json:"ready"`
	Error        string               `json:"error,omitempty"`
	Backend      bringup.BackendInfo  `json:"backend"`
	Codex        *ctxd.CodexStats     `json:"codex,omitempty"`
	Limits       governor.Limits      `json:"limits"`
	Window       *governor.WindowPlan `json:"window,omitempty"`
	Model        *governor.ModelFacts `json:"model,omitempty"`
	Scheduler    *scheduler.Status    `json:"scheduler,omitempty"`
	LastRequest  *ctxd.Summary        `json:"last_request,omitempty"`
	Environment  ctxd.Environment     `json:"environment"`
	MemorySource string               `json:"memory_source"`
	// Hardware is the probe's raw reading (never part of a prompt), and
	// Bands counts its readings and band changes.
	Hardware  *hostenv.Reading  `json:"hardware,omitempty"`
	Bands     *hostenv.Counters `json:"bands,omitempty"`
	Sigils    []SigilStatus     `json:"sigils"`
	Karma     bool              `json:"karma"` // answers are recorded as traces
	Sessions  int               `json:"sessions"`
	Listeners Listeners         `json:"listeners"`
	// Bounds are the daemon's resource bounds, with what is in use of
	// those it counts (a sigil other than an admin sees its own share).
	Bounds   []Bound `json:"bounds,omitempty"`
	LogLevel string  `json:"log_level"`
	// Config is the file the configuration was read from ("" for the
	// built-in defaults); Reload how the last reload went (nil: none yet).
	Config string        `json:"config,omitempty"`
	Reload *ReloadStatus `json:"reload,omitempty"`
	// Personas are the personas served under one memory budget, when
	// the configuration has more than the default one.
	Personas *PersonasStatus `json:"personas,omitempty"`
}

// PersonasStatus is the memory budget and each persona's share of it.
type PersonasStatus struct {
	BudgetBytes  int64           `json:"budget_bytes"`  // what all resident personas may plan together
	PlannedBytes int64           `json:"planned_bytes"` // what the resident ones plan now
	Personas     []PersonaStatus `json:"personas"`      // the default first
}

// PersonaStatus is one persona: where it stands, what it plans, and what
// its server really holds.
type PersonaStatus struct {
	persona.Status
	Model  string `json:"model"`                // its model file
	NumCtx int    `json:"num_ctx"`              // its window per slot
	Slots  int    `json:"slots"`                // its slots
	RSS    int64  `json:"rss_bytes"`            // its server's resident memory now (0: not running)
	VRAM   int64  `json:"vram_bytes,omitempty"` // the GPU memory NVML says its server uses, on a GPU
	OffBy  string `json:"off_by,omitempty"`     // how far what it holds (VRAM on a GPU, else RSS) is from the plan, when it is running
	// On disk while it is evacuated: its saved slots, the tokens they
	// hold, and their files' bytes.
	SavedSlots  int   `json:"saved_slots,omitempty"`
	SavedTokens int   `json:"saved_tokens,omitempty"`
	SavedBytes  int64 `json:"saved_bytes,omitempty"`
}

// SigilStatus is one configured sigil as status shows it: never a token
// or its hash.
type SigilStatus struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	Scopes      []string `json:"scopes"`
	Token       bool     `json:"token"`
	Revoked     bool     `json:"revoked,omitempty"`
	UIDs        []int    `json:"uids,omitempty"`
	GIDs        []int    `json:"gids,omitempty"`
}

// Listeners says where the daemon listens and how it trusts requests.
type Listeners struct {
	Socket string `json:"socket"`
	TCP    string `json:"tcp,omitempty"` // every request on it needs a sigil's token
	// Dashboard is daemon.dashboard_listen's address: the dashboard only,
	// with a token.
	Dashboard string `json:"dashboard,omitempty"`
	Trust     string `json:"trust"`
}

// ReloadStatus is how the last reload went (status's "reload", and the
// answer of POST /v1/reload).
type ReloadStatus struct {
	At    time.Time `json:"at"`
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"` // why the new configuration was refused; the old one stays in force
	File  string    `json:"file,omitempty"`
	// Applied lists the changed keys now in force; NeedsRestart the
	// changed keys that take effect at the next start only.
	Applied      []string `json:"applied,omitempty"`
	NeedsRestart []string `json:"needs_restart,omitempty"`
}

// FillEngine fills the part of st a ready request path reports: the
// backend, its window and model, the governor's limits, the slots and
// their queue, the last request and the codex. It reads snapshots only.
func (st *Status) FillEngine(e *engine.Engine) {
	m := e.Model
	st.Ready, st.Backend, st.Limits = true, m.Info, e.Orch.Limits()
	if m.Restarts != nil {
		st.Backend.Restarts = m.Restarts()
	}
	if m.Loads != nil {
		if n := m.Loads(); n >= 0 {
			st.Backend.ModelLoads = &n
		}
	}
	window, facts, sched := m.Window, m.Facts, e.Sched.Status()
	st.Window, st.Model, st.Scheduler, st.LastRequest = &window, &facts, &sched, e.Orch.LastSummary()
	if cs, ok := e.Codex.Stats(); ok {
		st.Codex = &cs
	}
}

// statusFor is the daemon's status as the sigil who may see it: all of it
// for an admin; for any other sigil, its own sessions only (the slots and
// the queue name no other sigil's session, the last request shows only if
// it was its own), its own entry among the sigils, and the codex's files,
// redactions and skipped files only with a codex scope (as GET /v1/codex).
func (srv *Server) statusFor(ctx context.Context, who runcontext.Sigil) Status {
	st := srv.core.Status(ctx)
	admin := sigils.Allows(who, sigils.ScopeAdmin)
	st.Bounds = srv.bounds(who.Name, admin)
	if admin {
		return st
	}
	owner := func(string) string { return "" }
	if e, err := srv.core.Engine(); err == nil {
		owner = func(session string) string {
			_, s, ok := e.Orch.LastPrompt(session)
			if !ok {
				return ""
			}
			return s
		}
	}
	mine := func(session string) bool { return session != "" && owner(session) == who.Name }
	if st.LastRequest != nil && !mine(st.LastRequest.Session) {
		st.LastRequest = nil
	}
	if st.LastRequest != nil {
		last := *st.LastRequest
		last.Session = ctxd.ClientSessionID(last.Session) // the id its client named
		st.LastRequest = &last
	}
	if sc := st.Scheduler; sc != nil {
		c := *sc
		c.Slots = slices.Clone(sc.Slots)
		for i := range c.Slots {
			if !mine(c.Slots[i].Session) {
				c.Slots[i].Session, c.Slots[i].Prefix = "", ""
			}
			c.Slots[i].Session = ctxd.ClientSessionID(c.Slots[i].Session)
		}
		c.Waiting = slices.Clone(sc.Waiting)
		for i := range c.Waiting {
			if !mine(c.Waiting[i].Session) {
				c.Waiting[i].Session = ""
			}
			c.Waiting[i].Session = ctxd.ClientSessionID(c.Waiting[i].Session)
		}
		st.Scheduler = &c
	}
	var own []SigilStatus
	for _, s := range st.Sigils {
		if s.Name == who.Name {
			own = append(own, s)
		}
	}
	st.Sigils = own
	if cs := st.Codex; cs != nil && !sigils.Allows(who, sigils.ScopeCodexLoad) && !sigils.Allows(who, sigils.ScopeSearchCodex) {
		c := *cs
		c.Root, c.Largest, c.Redacted, c.Skipped = "", nil, nil, nil
		st.Codex = &c
	}
	return st
}

// bounds are the daemon's resource bounds and what is in use of those it
// counts; a viewer who is not an admin sees only its own sigil's share.
func (srv *Server) bounds(viewer string, admin bool) []Bound {
	d, k := srv.cfg.Daemon, srv.cfg.KarmaBounds
	share := func(by map[string]int) (*int, map[string]int) {
		total := 0
		for _, n := range by {
			total += n
		}
		if !admin {
			return nil, map[string]int{viewer: by[viewer]}
		}
		return &total, by
	}
	ws, wsBy := share(srv.websockets.counts())
	dash, dashBy := share(srv.dashboards.counts())
	mcpBy := srv.mcp.bySigilCounts()
	mcpTotal, mcpMine := share(mcpBy)
	out := []Bound{
		{Key: "daemon.max_connections", Limit: int64(d.MaxConnections)},
		{Key: "daemon.max_body_bytes", Limit: d.MaxBodyBytes},
		{Key: "daemon.max_websockets_per_sigil", Limit: int64(d.MaxWebSocketsPerSigil), InUse: ws, BySigil: wsBy},
		{Key: "daemon.max_dashboards_per_sigil", Limit: int64(d.MaxDashboardsPerSigil), InUse: dash, BySigil: dashBy},
		{Key: "daemon.max_mcp_sessions_per_sigil", Limit: int64(d.MaxMCPSessionsPerSigil), BySigil: mcpMine},
		{Key: "daemon.max_mcp_sessions", Limit: int64(d.MaxMCPSessions), InUse: mcpTotal},
		{Key: "daemon.max_unauthenticated", Limit: int64(d.MaxUnauthenticated)},
		{Key: "daemon.max_asks_per_sigil", Limit: int64(d.MaxAsksPerSigil)},
		{Key: "daemon.max_sessions_per_sigil", Limit: int64(d.MaxSessionsPerSigil)},
	}
	if srv.cfg.Karma != nil {
		out = append(out, Bound{Key: "karma.max_note_bytes", Limit: int64(k.MaxNoteBytes)},
			Bound{Key: "karma.max_judgements", Limit: int64(k.MaxJudgements)})
	}
	return out
}
