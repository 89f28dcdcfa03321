package persona

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// Evacuable is a persona's request path as the pool needs it: it can give
// its memory back and take it again.
type Evacuable interface {
	// Evacuate saves what the persona's slots hold and stops its model
	// server; nothing runs on it meanwhile (the pool sees to that).
	Evacuate(ctx context.Context) error
	// Restore starts its model server again and restores the saved slots.
	Restore(ctx context.Context) error
}

// Spec is one persona as the pool serves it.
type Spec[E Evacuable] struct {
	Name   string
	Pinned bool     // never evacuated
	Sigils []string // the sigils that may use it; empty: every sigil
	// Planned is the memory it holds while resident: weights, KV windows,
	// host prompt cache, its server's own.
	Planned int64
	// Open loads it the first time; the pool calls it once at most, unless
	// it fails.
	Open func(ctx context.Context) (E, error)
}

// State is where a persona stands.
type State string

const (
	Cold       State = "cold"       // never loaded
	Loading    State = "loading"    // its first load runs
	Resident   State = "resident"   // loaded: requests run on it
	Evacuating State = "evacuating" // its slots are being saved and its server stopped
	Evacuated  State = "evacuated"  // on disk: its next request restores it
	Restoring  State = "restoring"  // its server starts and its slots come back
)

// loadTimeout bounds a load or a restore, which runs on for the requests
// waiting for it even when the one that started it is gone.
const loadTimeout = 10 * time.Minute

// Pool holds the personas. It is safe for concurrent use.
type Pool[E Evacuable] struct {
	budget int64
	log    *slog.Logger
	def    string
	order  []string
	// onChange is told the bytes the resident personas plan, after every
	// change (the hardware probe's plan); nil: nobody.
	onChange func(planned int64)

	mu      sync.Mutex
	closed  bool // Close was called: nothing loads any more
	members map[string]*member[E]
	changed chan struct{} // closed and replaced on every change of state
	clock   uint64        // counts uses, to find the one idle longest
}

type member[E Evacuable] struct {
	spec        Spec[E]
	eng         E
	state       State
	inflight    int
	lastUsed    uint64
	lastAt      time.Time
	evacuations int
	restores    int
	lastLoad    time.Duration // how long its last load or restore took
	lastErr     string
}

// Config shapes a pool.
type Config struct {
	// Budget is the memory, in bytes, all resident personas may plan
	// together.
	Budget int64
	// OnChange is told what the resident personas plan together, after
	// every change; nil: nobody.
	OnChange func(planned int64)
	Logger   *slog.Logger
}

// New makes a pool of specs; the first is the default persona, which
// requests that name none get.
func New[E Evacuable](cfg Config, specs ...Spec[E]) (*Pool[E], error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("persona: no persona")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pool[E]{budget: cfg.Budget, log: cfg.Logger, def: specs[0].Name, onChange: cfg.OnChange,
		members: map[string]*member[E]{}, changed: make(chan struct{})}
	for _, s := range specs {
		if _, dup := p.members[s.Name]; dup || s.Name == "" {
			return nil, fmt.Errorf("persona: name %q given twice or empty", s.Name)
		}
		p.members[s.Name] = &member[E]{spec: s, state: Cold}
		p.order = append(p.order, s.Name)
	}
	return p, nil
}

// Adopt makes a persona resident with a request path loaded elsewhere
// (the default persona, which the daemon brings up at start).
func (p *Pool[E]) Adopt(name string, eng E, took time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.members[name]
	if m == nil {
		return fmt.Errorf("persona: no persona %q", name)
	}
	m.eng, m.state, m.lastLoad, m.lastAt = eng, Resident, took, time.Now()
	p.clock++
	m.lastUsed = p.clock
	p.changedLocked()
	return nil
}

// Names are the personas' names, the default first.
func (p *Pool[E]) Names() []string { return slices.Clone(p.order) }

// Resolve is the persona a request of sigil names ("": the default), or
// an error that names it and lists the personas sigil may use (a persona
// sigil may not use is refused as such, naming no other sigil).
func (p *Pool[E]) Resolve(name, sigil string) (string, error) {
	if name == "" {
		name = p.def
	}
	if _, ok := p.members[name]; !ok {
		var open []string
		for _, n := range p.order {
			if p.Allowed(n, sigil) {
				open = append(open, n)
			}
		}
		return "", ctxd.Errorf(ctxd.KindNotFound, "persona %q not found; this ctxd serves %s to sigil %q", name, strings.Join(open, ", "), sigil)
	}
	if !p.Allowed(name, sigil) {
		return "", ctxd.Errorf(ctxd.KindForbidden, "persona %q is not open to sigil %q (its [[persona]] sigils)", name, sigil)
	}
	return name, nil
}

// Allowed reports whether sigil may use the persona.
func (p *Pool[E]) Allowed(name, sigil string) bool {
	m := p.members[name]
	return m != nil && (len(m.spec.Sigils) == 0 || slices.Contains(m.spec.Sigils, sigil))
}

// State is where the persona stands now ("" for an unknown name).
func (p *Pool[E]) State(name string) State {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.members[name]; m != nil {
		return m.state
	}
	return ""
}

// Peek is the persona's request path if it was ever loaded (resident or
// not: an evacuated one still answers for its codex and status).
func (p *Pool[E]) Peek(name string) (E, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero E
	m := p.members[name]
	if m == nil || m.state == Cold || m.state == Loading {
		return zero, false
	}
	return m.eng, true
}

// Acquire makes the persona resident, evacuating others as the budget
// requires, and returns its request path and what to call when the
// request is done with it (until then the persona is not evacuated). It
// tells progress (when not nil) what it waits for. A persona that cannot
// fit the budget even alone, or a sigil not allowed, is refused at once.
func (p *Pool[E]) Acquire(ctx context.Context, name, sigil string, progress func(string)) (E, func(), error) {
	var zero E
	name, err := p.Resolve(name, sigil)
	if err != nil {
		return zero, nil, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	said := ""
	// say tells progress msg unless it was the last thing said, with the
	// lock let go (progress may write to a slow client); it reports
	// whether it did, and the caller then looks at the state again.
	say := func(msg string) bool {
		if msg == said {
			return false
		}
		said = msg
		p.mu.Unlock()
		progress(msg)
		p.mu.Lock()
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.members[name]
	for {
		if p.closed {
			return zero, nil, ctxd.Errorf(ctxd.KindUnavailable, "persona %q: the daemon is stopping", name)
		}
		if m.lastErr != "" && (m.state == Cold || m.state == Evacuated) {
			err := ctxd.Errorf(ctxd.KindUnavailable, "persona %q: %s", name, m.lastErr)
			m.lastErr = ""
			return zero, nil, err
		}
		switch m.state {
		case Resident:
			m.inflight++
			p.clock++
			m.lastUsed, m.lastAt = p.clock, time.Now()
			var once sync.Once
			return m.eng, func() { once.Do(func() { p.release(m) }) }, nil
		case Cold, Evacuated:
			victim, wait, err := p.roomLocked(m)
			if err != nil {
				return zero, nil, err
			}
			var msg string
			switch {
			case victim != nil:
				msg = fmt.Sprintf("evacuating persona %q (idle longest) to make room for %q", victim.spec.Name, name)
			case wait:
				msg = fmt.Sprintf("persona %q waits for room: every resident persona it could displace is in use", name)
			case m.state == Cold:
				msg = fmt.Sprintf("loading persona %q", name)
			default:
				msg = fmt.Sprintf("restoring persona %q from disk", name)
			}
			if say(msg) {
				continue
			}
			switch {
			case victim != nil:
				if err := p.evacuateLocked(victim, "to make room for "+name); err != nil {
					return zero, nil, ctxd.Errorf(ctxd.KindUnavailable, "persona %q: no room: evacuating persona %q failed: %v", name, victim.spec.Name, err)
				}
			case wait:
				if err := p.waitLocked(ctx); err != nil {
					return zero, nil, err
				}
			default:
				p.loadLocked(m)
			}
		default:
			if say(fmt.Sprintf("waiting: persona %q is %s", name, m.state)) {
				continue
			}
			if err := p.waitLocked(ctx); err != nil {
				return zero, nil, err
			}
		}
	}
}

// release ends one request on m.
func (p *Pool[E]) release(m *member[E]) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m.inflight--
	m.lastAt = time.Now()
	p.changedLocked()
}

// usedLocked is what the personas holding memory plan together.
func (p *Pool[E]) usedLocked() int64 {
	var n int64
	for _, m := range p.members {
		switch m.state {
		case Loading, Resident, Evacuating, Restoring:
			n += m.spec.Planned
		}
	}
	return n
}

// roomLocked says what loading m needs first: a persona to evacuate, or
// to wait for one to become idle (or for an evacuation under way), or
// nothing. It refuses a persona that cannot fit beside the pinned ones.
func (p *Pool[E]) roomLocked(m *member[E]) (victim *member[E], wait bool, err error) {
	if p.budget <= 0 || p.usedLocked()+m.spec.Planned <= p.budget {
		return nil, false, nil
	}
	var pinned int64
	for _, o := range p.members {
		if o != m && o.spec.Pinned && o.state != Cold && o.state != Evacuated {
			pinned += o.spec.Planned
		}
	}
	if pinned+m.spec.Planned > p.budget {
		return nil, false, ctxd.Errorf(ctxd.KindUnavailable, "persona %q needs %d MiB, and the memory budget of %d MiB holds %d MiB of pinned personas: raise limits.memory_budget_mb, unpin one, or give it a smaller window",
			m.spec.Name, m.spec.Planned>>20, p.budget>>20, pinned>>20)
	}
	for _, o := range p.members {
		if o == m || o.spec.Pinned || o.state != Resident || o.inflight > 0 {
			continue
		}
		if victim == nil || o.lastUsed < victim.lastUsed {
			victim = o
		}
	}
	return victim, victim == nil, nil
}

// evacuateLocked evacuates v, letting go of the lock meanwhile.
func (p *Pool[E]) evacuateLocked(v *member[E], why string) error {
	v.state = Evacuating
	p.changedLocked()
	p.mu.Unlock()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	err := v.eng.Evacuate(ctx)
	cancel()
	p.mu.Lock()
	if err != nil {
		// What failed to stop still holds its memory: it stays resident.
		p.log.Error("persona not evacuated", "persona", v.spec.Name, "err", err)
		v.state = Resident
	} else {
		v.state = Evacuated
		v.evacuations++
		p.log.Info("persona evacuated", "persona", v.spec.Name, "why", why, "took", time.Since(start).Round(time.Millisecond))
	}
	p.changedLocked()
	return err
}

// loadLocked loads or restores m, letting go of the lock meanwhile.
func (p *Pool[E]) loadLocked(m *member[E]) {
	was := m.state
	m.state = Loading
	if was == Evacuated {
		m.state = Restoring
	}
	p.changedLocked()
	p.mu.Unlock()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), loadTimeout)
	var eng E
	var err error
	if was == Cold {
		eng, err = m.spec.Open(ctx)
	} else {
		err = m.eng.Restore(ctx)
	}
	cancel()
	took := time.Since(start)
	p.mu.Lock()
	if err != nil {
		m.state, m.lastErr = was, err.Error()
		p.log.Error("persona not loaded", "persona", m.spec.Name, "from", was, "err", err)
	} else {
		if was == Cold {
			m.eng = eng
		} else {
			m.restores++
		}
		m.state, m.lastLoad = Resident, took
		p.log.Info("persona resident", "persona", m.spec.Name, "from", was, "took", took.Round(time.Millisecond))
	}
	p.changedLocked()
}

// waitLocked waits for the next change, or ctx's end.
func (p *Pool[E]) waitLocked(ctx context.Context) error {
	ch := p.changed
	p.mu.Unlock()
	defer p.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Pool[E]) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
	if p.onChange != nil {
		p.onChange(p.usedLocked())
	}
}

// EvacuateIdle evacuates every resident persona that is idle, not pinned
// and not the one used last (critical memory pressure: room is made before
// an allocation can fail). It returns their names.
func (p *Pool[E]) EvacuateIdle(why string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var last *member[E]
	for _, m := range p.members {
		if m.state == Resident && (last == nil || m.lastUsed > last.lastUsed) {
			last = m
		}
	}
	var done []string
	for _, name := range p.order {
		m := p.members[name]
		if m == last || m.spec.Pinned || m.state != Resident || m.inflight > 0 {
			continue
		}
		if p.evacuateLocked(m, why) == nil {
			done = append(done, name)
		}
	}
	return done
}

// Status is one persona's state, for ctxd status.
type Status struct {
	Name         string  `json:"name"`
	Default      bool    `json:"default,omitempty"`
	Pinned       bool    `json:"pinned,omitempty"`
	State        State   `json:"state"`
	PlannedBytes int64   `json:"planned_bytes"`
	InFlight     int     `json:"in_flight"`
	Evacuations  int     `json:"evacuations"`
	Restores     int     `json:"restores"`
	LastLoadMs   float64 `json:"last_load_ms,omitempty"`
	IdleSeconds  float64 `json:"idle_seconds,omitempty"`
}

// Statuses are every persona's state, the default first, and the budget.
func (p *Pool[E]) Statuses() (out []Status, budget, used int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, name := range p.order {
		m := p.members[name]
		s := Status{Name: name, Default: name == p.def, Pinned: m.spec.Pinned, State: m.state, PlannedBytes: m.spec.Planned,
			InFlight: m.inflight, Evacuations: m.evacuations, Restores: m.restores, LastLoadMs: float64(m.lastLoad.Microseconds()) / 1000}
		if m.inflight == 0 && !m.lastAt.IsZero() {
			s.IdleSeconds = time.Since(m.lastAt).Seconds()
		}
		out = append(out, s)
	}
	return out, p.budget, p.usedLocked()
}

// SetPlanned corrects a persona's planned memory (its server was seen to
// hold more than planned), then evacuates idle personas, the idle longest
// first, until the resident ones fit the budget again; it returns those
// it evacuated.
func (p *Pool[E]) SetPlanned(name string, bytes int64) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.members[name]
	if m == nil {
		return nil
	}
	m.spec.Planned = bytes
	p.changedLocked()
	var done []string
	for !p.closed && p.budget > 0 && p.usedLocked() > p.budget {
		var victim *member[E]
		for _, o := range p.members {
			if !o.spec.Pinned && o.state == Resident && o.inflight == 0 && (victim == nil || o.lastUsed < victim.lastUsed) {
				victim = o
			}
		}
		if victim == nil || p.evacuateLocked(victim, "the resident personas' measured memory is over the budget") != nil {
			break
		}
		done = append(done, victim.spec.Name)
	}
	return done
}

// Close stops the pool: no persona loads, restores or is evacuated after
// it. It waits for those under way to end and returns every request path
// ever loaded, for the caller to close (the default's among them).
func (p *Pool[E]) Close() []E {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for {
		busy := false
		for _, m := range p.members {
			switch m.state {
			case Loading, Restoring, Evacuating:
				busy = true
			}
		}
		if !busy {
			break
		}
		_ = p.waitLocked(context.Background())
	}
	var out []E
	for _, name := range p.order {
		if m := p.members[name]; m.state != Cold {
			out = append(out, m.eng)
		}
	}
	return out
}
