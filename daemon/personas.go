package daemon

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/persona"
)

// personas are the pool of personas once the default one is up, and
// what was planned for each.
type personas struct {
	pool  *persona.Pool[*engine.Engine]
	plans map[string]governor.WindowPlan
}

// readOnlyMemory is the probe as a persona's plan reads it: a plan made
// ahead of its load does not touch what VRAM pressure counts (the pool
// tells the probe what the resident personas plan).
type readOnlyMemory struct{ bringup.Memory }

func (readOnlyMemory) SetPlan(uint64, bool) {}

// newPersonas makes the pool: the default persona, resident (def, loaded
// in took), and the configured ones, planned now and loaded on their first
// request. The budget is limits.memory_budget_mb, else the memory free now
// and what the default persona planned, less the headroom.
func (d *Daemon) newPersonas(def *engine.Engine, took time.Duration) (*personas, error) {
	cfg := d.cfg
	defPlanned := def.Model.Planned
	if defPlanned == 0 { // not planned by ctxd: its window, as the server reports it
		defPlanned = bringup.PlannedBytes(def.Model.Window, 0, cfg.Backend.CacheRAMMB)
	}
	ps := &personas{plans: map[string]governor.WindowPlan{cfg.Backend.Model: def.Model.Window}}
	specs := []persona.Spec[*engine.Engine]{{Name: cfg.Backend.Model, Pinned: cfg.Limits.DefaultPinned, Planned: defPlanned}}
	for i := range cfg.Personas {
		pc := cfg.PersonaConfig(i)
		bc := d.bringupConfig(pc, readOnlyMemory{d.probe})
		plan, planned, err := bc.Plan()
		if err != nil {
			return nil, ctxd.Errorf(ctxd.KindInvalid, "persona %q: %w", pc.Backend.Model, err)
		}
		pc.Backend.NumCtx = plan.NumCtx // the window planned now, whatever is free when it loads
		ps.plans[pc.Backend.Model] = plan
		specs = append(specs, persona.Spec[*engine.Engine]{
			Name: pc.Backend.Model, Pinned: cfg.Personas[i].Pinned, Sigils: cfg.Personas[i].Sigils, Planned: planned,
			Open: func(ctx context.Context) (*engine.Engine, error) { return d.openPersona(ctx, pc, def.Model.Server) },
		})
	}
	var budget int64
	if len(cfg.Personas) > 0 {
		rd := d.probe.Read()
		budget = memoryBudget(cfg.Limits, rd, defPlanned)
		d.log.Info("memory budget of the personas", "budget_mib", budget>>20, "source", rd.Source,
			"from", map[bool]string{true: "limits.memory_budget_mb", false: "the memory free now and the default persona's plan, less the headroom"}[cfg.Limits.MemoryBudgetMB > 0])
	}
	pc := persona.Config{Budget: budget, Logger: d.log}
	if len(cfg.Personas) > 0 { // VRAM pressure counts what every resident persona plans
		pc.OnChange = func(planned int64) { d.probe.SetPlan(uint64(max(0, planned)), true) }
	}
	pool, err := persona.New(pc, specs...)
	if err != nil {
		return nil, err
	}
	if err := pool.Adopt(cfg.Backend.Model, def, took); err != nil {
		return nil, err
	}
	ps.pool = pool
	return ps, nil
}

// bringupConfig is bring-up's configuration for one persona's load.
func (d *Daemon) bringupConfig(c config.Config, mem bringup.Memory) bringup.Config {
	return bringup.Config{Backend: c.Backend, Limits: c.Limits, StateDir: c.Daemon.StateDir,
		Env: d.opts.BackendEnv, Memory: mem, Formats: d.formatters, Logger: d.log.With("persona", c.Backend.Model),
		Critical: func() bool { return d.sensor.Environment().VRAM == "critical" }}
}

// openPersona loads a configured persona: its own llama-server (on Ollama,
// its model on the default persona's server) and request path, with the
// limits in force now on its window.
func (d *Daemon) openPersona(ctx context.Context, pc config.Config, server *bringup.Server) (*engine.Engine, error) {
	if err := os.MkdirAll(pc.Daemon.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("persona %q: %w", pc.Backend.Model, err)
	}
	var built atomic.Pointer[engine.Engine] // set once the request path is; the supervisor may call onRestart before
	onRestart := func() {
		if e := built.Load(); e != nil {
			e.Sched.Forget()
		}
	}
	bc := d.bringupConfig(pc, readOnlyMemory{d.probe})
	if pc.Backend.Kind == "ollama" {
		bc.Shared = server // its model loads on the default persona's Ollama (OLLAMA_MAX_LOADED_MODELS: one a persona)
	}
	m, err := bringup.Open(bc)(ctx, onRestart)
	if err != nil {
		return nil, err
	}
	d.reloadMu.Lock()
	limits := d.live.Load().limits(m.Window.NumCtx)
	d.reloadMu.Unlock()
	e, err := engine.New(ctx, d.engineConfig(pc, limits), m)
	if err != nil {
		return nil, err
	}
	built.Store(e)
	return e, nil
}

// Persona is the request path of the persona a request names ("": the
// default), made resident first if it is not (progress hears what that
// waits for), and what to call once the request is done with it.
func (d *Daemon) Persona(ctx context.Context, name, sigil string, progress func(string)) (*engine.Engine, func(), error) {
	ps, err := d.readyPersonas()
	if err != nil {
		return nil, nil, err
	}
	return ps.pool.Acquire(ctx, d.personaName(name), sigil, progress)
}

// PersonaPeek checks that the persona exists and sigil may use it, and
// returns its request path if it was ever loaded and whether it is
// resident now; it loads nothing.
func (d *Daemon) PersonaPeek(name, sigil string) (*engine.Engine, bool, error) {
	ps, err := d.readyPersonas()
	if err != nil {
		return nil, false, err
	}
	name, err = ps.pool.Resolve(d.personaName(name), sigil)
	if err != nil {
		return nil, false, err
	}
	e, ok := ps.pool.Peek(name)
	return e, ok && ps.pool.State(name) == persona.Resident, nil
}

// readyPersonas is the personas once the backend is ready, or the error that says
// why there are none yet (they are set just before the default's engine).
func (d *Daemon) readyPersonas() (*personas, error) {
	if ps := d.personas.Load(); ps != nil {
		return ps, nil
	}
	_, err := d.Engine()
	if err == nil { // between the two stores, or stopping
		err = ctxd.Errorf(ctxd.KindUnavailable, "backend is starting")
	}
	return nil, err
}

// personaName is the pool's name for what a request names: "" (the
// default) for "ctxd" and for backend.model, with or without ":latest".
func (d *Daemon) personaName(name string) string {
	if name == "ctxd" || strings.TrimSuffix(name, ":latest") == strings.TrimSuffix(d.cfg.Backend.Model, ":latest") {
		return ""
	}
	return name
}

// PersonaNames are the personas a sigil may use, the default first, with
// the window planned for each.
func (d *Daemon) PersonaNames(sigil string) []httpapi.PersonaInfo {
	ps := d.personas.Load()
	if ps == nil {
		return nil
	}
	var out []httpapi.PersonaInfo
	for _, name := range ps.pool.Names() {
		if !ps.pool.Allowed(name, sigil) {
			continue
		}
		info := httpapi.PersonaInfo{Name: name, NumCtx: ps.plans[name].NumCtx}
		info.Engine, _ = ps.pool.Peek(name)
		info.Resident = ps.pool.State(name) == persona.Resident
		out = append(out, info)
	}
	return out
}

// watchPressure evacuates idle personas when VRAM pressure turns critical
// (before an allocation can fail), and logs a persona whose server's
// resident memory differs from its plan, until ctx ends.
func (d *Daemon) watchPressure(ctx context.Context, every time.Duration) {
	if len(d.cfg.Personas) == 0 { // one persona: nothing to evacuate, no plan to correct
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ps := d.personas.Load()
		if ps == nil {
			continue
		}
		if d.sensor.Environment().VRAM == hostenv.Critical {
			if names := ps.pool.EvacuateIdle("critical memory pressure"); len(names) > 0 {
				d.log.Warn("memory pressure is critical: idle personas evacuated", "personas", strings.Join(names, " "))
			}
		}
		ps.checkMemory(d)
	}
}

// checkMemory compares each resident persona's server's resident memory
// with its plan. A server seen to hold more than planned has its plan
// raised to what it holds (and a little more), so that the budget counts
// it; the pool then evacuates idle personas until the budget holds again.
// Less than planned is normal (a KV cache is touched as it fills) and only
// shown in status.
func (ps *personas) checkMemory(d *Daemon) {
	sts, _, _ := ps.pool.Statuses()
	for _, st := range sts {
		if st.State != persona.Resident || st.PlannedBytes <= 0 {
			continue
		}
		e, ok := ps.pool.Peek(st.Name)
		if !ok || e.Model.PID == nil {
			continue
		}
		rss, what := d.serverBytes(e.Model.PID())
		if share := float64(rss-st.PlannedBytes) / float64(st.PlannedBytes); rss > 0 && share > raiseShare {
			raised := rss + rss/20
			evacuated := ps.pool.SetPlanned(st.Name, raised)
			d.log.Warn("a persona's server holds more memory than planned: its plan is raised to it", "persona", st.Name,
				"holds_mib", rss>>20, "of", what, "planned_mib", st.PlannedBytes>>20, "off_by", fmt.Sprintf("%+.0f%%", 100*share),
				"now_planned_mib", raised>>20, "evacuated", strings.Join(evacuated, " "))
		}
	}
}

// raiseShare is how far above its plan a server's resident memory may be
// before the plan is raised to it.
const raiseShare = 0.02

// status is every persona's state, plan and resident memory, for status;
// nil when only the default persona is configured.
func (ps *personas) status(d *Daemon) *httpapi.PersonasStatus {
	if ps == nil || len(d.cfg.Personas) == 0 {
		return nil
	}
	sts, budget, used := ps.pool.Statuses()
	out := &httpapi.PersonasStatus{BudgetBytes: budget, PlannedBytes: used}
	for _, st := range sts {
		p := httpapi.PersonaStatus{Status: st, NumCtx: ps.plans[st.Name].NumCtx, Slots: ps.plans[st.Name].Slots}
		if e, ok := ps.pool.Peek(st.Name); ok {
			p.Model = e.Model.TokenizerID
			p.SavedSlots, p.SavedTokens, p.SavedBytes = e.OnDisk()
			if st.State == persona.Resident && e.Model.PID != nil {
				pid := e.Model.PID()
				p.RSS = hostenv.ProcessRSS(pid)
				p.VRAM, _ = d.probe.ProcessVRAM(pid)
			}
		}
		if held, _ := d.heldOf(p.RSS, p.VRAM); held > 0 && st.PlannedBytes > 0 {
			p.OffBy = fmt.Sprintf("%+.0f%%", 100*float64(held-st.PlannedBytes)/float64(st.PlannedBytes))
		}
		out.Personas = append(out.Personas, p)
	}
	return out
}

// memoryBudget is what the personas may plan together: limits.memory_budget_mb,
// else the memory the model runs in that is free now (VRAM summed over the
// GPUs where NVML reads them, host memory otherwise: the reading's source)
// and what the default persona, loaded already, plans, less the headroom.
func memoryBudget(l config.Limits, rd hostenv.Reading, defPlanned int64) int64 {
	if l.MemoryBudgetMB > 0 {
		return int64(l.MemoryBudgetMB) << 20
	}
	return max(0, int64(rd.FreeBytes)+defPlanned-int64(l.MemoryHeadroomMB)<<20)
}

// serverBytes is what a model server holds of the memory the budget is
// of: on a GPU read through NVML, the VRAM NVML says the process uses;
// otherwise its resident memory.
func (d *Daemon) serverBytes(pid int) (int64, string) {
	vram, _ := d.probe.ProcessVRAM(pid)
	return d.heldOf(hostenv.ProcessRSS(pid), vram)
}

// heldOf chooses between a server's resident memory and its VRAM by where
// the budget's memory is read.
func (d *Daemon) heldOf(rss, vram int64) (int64, string) {
	if _, rd := d.probe.Latest(); rd.Source == "nvml" {
		return vram, "vram"
	}
	return rss, "rss"
}
