package httpapi

import (
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/scheduler"
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
	LogLevel  string            `json:"log_level"`
	// Config is the file the configuration was read from ("" for the
	// built-in defaults); Reload how the last reload went (nil: none yet).
	Config string        `json:"config,omitempty"`
	Reload *ReloadStatus `json:"reload,omitempty"`
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
	Trust  string `json:"trust"`
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
