package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Scheduler owns a backend's slots. It is safe for concurrent use.
//
// A request first takes its session (Session), so a session runs one
// request at a time and turn n+1 renders after turn n is recorded; then it
// takes a slot (Acquire). Both waits are first come, first served and end
// at once when the request's context does.
type Scheduler struct {
	now      func() time.Time
	lruTies  bool   // on a tie, the least recently used slot (else the lowest-numbered)
	released uint64 // counts releases, to order slots by last use

	mu       sync.Mutex // guards the fields below; never held while waiting
	slots    []slot
	queue    []*waiter // requests waiting for a slot, oldest first
	sessions map[string]*sessionQueue
	epoch    uint64 // bumped by Forget: leases of an older epoch record nothing
}

// slot is what the scheduler knows of one backend slot.
type slot struct {
	held     []int     // tokens the slot is known to hold (a prefix of what it holds)
	busy     bool      // a lease holds it
	session  string    // the session using it, or the one it served last
	lastUsed uint64    // when it was last released, in releases
	freedAt  time.Time // when it was last released
	measured int       // the backend's last measured reuse on it; -1: none
	stopped  bool      // its last request was stopped: it may hold more than held
	prefix   string    // names the stable prefix it holds, for status
}

// waiter is a request waiting for a slot.
type waiter struct {
	session    string
	prompt     []int
	restorable int // leading tokens of prompt the backend can restore into any slot from a saved file
	since      time.Time
	ahead      int
	granted    chan struct{} // closed when slot is set
	slot       int
	prev       string // the session the slot served before, when granted
}

// sessionQueue serializes the requests of one session.
type sessionQueue struct {
	busy    bool
	waiters []chan struct{} // closed to hand the session over, oldest first
}

// Options shape a scheduler.
type Options struct {
	Slots int              // at least one
	Now   func() time.Time // the clock for wait times; nil means time.Now
	// LeastRecentTies breaks a tie between free slots (the same prefix
	// length) by taking the least recently used, which keeps the others'
	// conversations warm: for a backend whose slot ctxd chooses
	// (llama-server). Without it the lowest-numbered slot wins, which is
	// how Ollama's runner chooses its own slots.
	LeastRecentTies bool
}

// New returns a scheduler with all slots empty.
func New(o Options) *Scheduler {
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Scheduler{now: o.Now, lruTies: o.LeastRecentTies, slots: make([]slot, max(1, o.Slots)), sessions: map[string]*sessionQueue{}}
	for i := range s.slots {
		s.slots[i].measured = -1
	}
	return s
}

// Slots is how many slots the scheduler owns.
func (s *Scheduler) Slots() int { return len(s.slots) }

// Session waits until no other request of session id runs, then holds the
// session until release is called. Requests of one session are served in
// the order they arrived. It returns how long it waited, or ctx's error
// (with nothing held) if ctx ended first.
func (s *Scheduler) Session(ctx context.Context, id string) (release func(), waited time.Duration, err error) {
	start := s.now()
	s.mu.Lock()
	q := s.sessions[id]
	if q == nil {
		q = &sessionQueue{}
		s.sessions[id] = q
	}
	if !q.busy {
		q.busy = true
		s.mu.Unlock()
		return s.sessionRelease(id), 0, nil
	}
	turn := make(chan struct{})
	q.waiters = append(q.waiters, turn)
	s.mu.Unlock()

	select {
	case <-turn:
		return s.sessionRelease(id), s.now().Sub(start), nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-turn: // handed over just as ctx ended: pass it on
		s.handOverLocked(id)
	default:
		q.waiters = slices.DeleteFunc(q.waiters, func(c chan struct{}) bool { return c == turn })
	}
	return nil, s.now().Sub(start), ctx.Err()
}

func (s *Scheduler) sessionRelease(id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.handOverLocked(id)
		})
	}
}

// handOverLocked gives session id to its next waiter, or frees it.
func (s *Scheduler) handOverLocked(id string) {
	q := s.sessions[id]
	if len(q.waiters) == 0 {
		delete(s.sessions, id)
		return
	}
	next := q.waiters[0]
	q.waiters = q.waiters[1:]
	close(next)
}

// Lease is a slot held by one request. Call Record with what the slot
// holds afterwards, if that changed, then Release.
type Lease struct {
	Slot   int // the slot's index
	Cached int // leading tokens of the prompt the slot holds
	// Restore: the slot holds fewer leading tokens of the prompt than the
	// saved prefix would give it; the caller restores that first.
	Restore bool
	Ahead   int           // requests that were waiting ahead of this one
	Waited  time.Duration // time spent waiting for the slot
	// AfterStop: the slot's last request was stopped (Stopped), so it may
	// hold more of that request's prompt than Cached counts on.
	AfterStop bool
	// Previous is the session the slot served before this request ("":
	// none since start): another session's means this one's conversation
	// was not there to reuse.
	Previous string

	s        *Scheduler
	epoch    uint64
	released bool
}

// Acquire waits for a free slot and holds it. Requests are served first
// come, first served (a session has at most one request waiting, so this
// is round-robin across sessions: none starves). The request takes the
// free slot that holds the longest prefix of prompt, the lowest-numbered
// on a tie (the rule Ollama's runner applies itself). If ctx ends first it
// returns ctx's error and the request leaves the queue at once.
func (s *Scheduler) Acquire(ctx context.Context, session string, prompt []int) (*Lease, error) {
	return s.AcquireRestorable(ctx, session, prompt, 0)
}

// AcquireRestorable is Acquire for a backend that can load a saved prefix
// of restorable tokens into any slot: a slot is then worth at least that
// much, and among slots worth the same the one whose content would lose
// the least is taken (an empty one before another session's conversation).
func (s *Scheduler) AcquireRestorable(ctx context.Context, session string, prompt []int, restorable int) (*Lease, error) {
	w := &waiter{session: session, prompt: prompt, restorable: restorable, since: s.now(), granted: make(chan struct{})}
	s.mu.Lock()
	w.ahead = len(s.queue)
	s.queue = append(s.queue, w)
	s.dispatchLocked()
	s.mu.Unlock()

	select {
	case <-w.granted:
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-w.granted: // granted just as ctx ended: give the slot back unused
			s.slots[w.slot].busy = false
			s.dispatchLocked()
		default:
			s.queue = slices.DeleteFunc(s.queue, func(x *waiter) bool { return x == w })
		}
		s.mu.Unlock()
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := &Lease{
		Slot: w.slot, Cached: LCP(s.slots[w.slot].held, prompt), Ahead: w.ahead, AfterStop: s.slots[w.slot].stopped, Previous: w.prev,
		Waited: s.now().Sub(w.since), s: s, epoch: s.epoch,
	}
	l.Restore = l.Cached < w.restorable
	return l, nil
}

// liveFor is how long after its last request a session's conversation
// counts as live: its agent is likely to come back to it.
const liveFor = 10 * time.Minute

// dispatchLocked hands free slots to the oldest waiters.
func (s *Scheduler) dispatchLocked() {
	now := s.now()
	for len(s.queue) > 0 {
		best, bestWorth, bestLoss, bestDisplaces := -1, 0, 0, false // worth may be negative: any free slot beats none
		w := s.queue[0]
		for i := range s.slots {
			sl := &s.slots[i]
			if sl.busy {
				continue
			}
			lcp := LCP(sl.held, w.prompt)
			worth, loss, displaces := lcp, 0, false
			if s.lruTies {
				// Where ctxd picks the slot, a slot that holds another
				// session's live conversation is taken only when every free
				// slot does (an agent's side request leaves its main
				// conversation alone); then a slot is worth what it holds of
				// the prompt or what a restore gives it, less the other
				// session's tokens it would lose. (Ollama's runner takes the
				// longest prefix, the lowest on a tie, and ctxd must predict it.)
				loss = len(sl.held) - lcp
				worth = max(lcp, w.restorable) - loss
				displaces = loss > 0 && sl.session != "" && sl.session != w.session && now.Sub(sl.freedAt) < liveFor
			}
			better := best < 0 || bestDisplaces && !displaces ||
				displaces == bestDisplaces && (worth > bestWorth || worth == bestWorth && s.lruTies && (loss < bestLoss || loss == bestLoss && sl.lastUsed < s.slots[best].lastUsed))
			if better {
				best, bestWorth, bestLoss, bestDisplaces = i, worth, loss, displaces
			}
		}
		if best < 0 {
			return
		}
		s.queue = s.queue[1:]
		w.prev = s.slots[best].session
		s.slots[best].busy, s.slots[best].session = true, w.session
		w.slot = best
		close(w.granted)
	}
}

// Record notes that the lease's slot now holds tokens (the caller must not
// modify them afterwards). After a Forget it records nothing: whatever the
// request left behind was lost with the backend.
func (l *Lease) Record(tokens []int) { l.record(tokens, false) }

// Stopped is Record for a request that failed or was stopped: the slot
// holds tokens, and perhaps more of the request's prompt (a backend
// notices a stop between batches of the prompt). The next lease on the
// slot says so (AfterStop).
func (l *Lease) Stopped(tokens []int) { l.record(tokens, true) }

func (l *Lease) record(tokens []int, stopped bool) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.released && l.epoch == l.s.epoch {
		l.s.slots[l.Slot].held = slices.Clip(tokens)
		l.s.slots[l.Slot].stopped = stopped
	}
}

// Measured notes the backend's own count of the prompt tokens it reused
// on the lease's slot, for status.
func (l *Lease) Measured(n int) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.released {
		l.s.slots[l.Slot].measured = n
	}
}

// Prefix names the stable prefix the lease's slot holds, for status.
func (l *Lease) Prefix(name string) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if !l.released {
		l.s.slots[l.Slot].prefix = name
	}
}

// Release frees the slot for the next waiter. Calling it again does nothing.
func (l *Lease) Release() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.released {
		return
	}
	l.released = true
	l.s.released++
	l.s.slots[l.Slot].busy = false
	l.s.slots[l.Slot].lastUsed = l.s.released
	l.s.slots[l.Slot].freedAt = l.s.now()
	l.s.dispatchLocked()
}

// Forget drops what is known of every slot: the backend restarted and its
// KV cache is gone.
func (s *Scheduler) Forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	for i := range s.slots {
		s.slots[i].held, s.slots[i].prefix, s.slots[i].measured = nil, "", -1
	}
}

// Held is what one slot holds, as Snapshot reports it and Put restores
// it: for a backend that is stopped and started again with its slots
// saved to files and restored.
type Held struct {
	Slot    int
	Tokens  []int  // what ctxd knows the slot holds
	Session string // the session it served last
	Prefix  string // the stable prefix it holds, for status
}

// Snapshot reports every slot that holds something and is not in use.
func (s *Scheduler) Snapshot() []Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Held
	for i, sl := range s.slots {
		if !sl.busy && len(sl.held) > 0 {
			out = append(out, Held{Slot: i, Tokens: sl.held, Session: sl.session, Prefix: sl.prefix})
		}
	}
	return out
}

// Put says a slot holds h again (its saved copy was restored after a
// Forget). A slot in use, or one out of range, is left as it is.
func (s *Scheduler) Put(h Held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.Slot < 0 || h.Slot >= len(s.slots) || s.slots[h.Slot].busy {
		return
	}
	sl := &s.slots[h.Slot]
	sl.held, sl.session, sl.prefix, sl.stopped, sl.measured = slices.Clip(h.Tokens), h.Session, h.Prefix, false, -1
	sl.freedAt = s.now()
}

// Status is the scheduler's state, for ctxd status.
type Status struct {
	Slots      []SlotStatus `json:"slots"`
	Busy       int          `json:"busy"`
	Waiting    []Waiting    `json:"waiting"`             // requests waiting for a slot, oldest first
	InSessions int          `json:"waiting_for_session"` // requests waiting for their session's earlier request
}

// SlotStatus is one slot.
type SlotStatus struct {
	Slot           int    `json:"slot"`
	Busy           bool   `json:"busy"`
	Session        string `json:"session,omitempty"`         // serving now, or served last
	HeldTokens     int    `json:"held_tokens"`               // tokens ctxd expects the slot to hold
	Prefix         string `json:"prefix,omitempty"`          // the stable prefix it holds
	MeasuredCached *int   `json:"measured_cached,omitempty"` // the backend's last measured reuse on it
}

// Waiting is one request in the slot queue.
type Waiting struct {
	Session   string  `json:"session"`
	WaitingMs float64 `json:"waiting_ms"`
}

// Status reports the slots and the queue. It never waits on a request.
func (s *Scheduler) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	st := Status{Waiting: []Waiting{}}
	for i, sl := range s.slots {
		ss := SlotStatus{Slot: i, Busy: sl.busy, Session: sl.session, HeldTokens: len(sl.held), Prefix: sl.prefix}
		if sl.measured >= 0 {
			m := sl.measured
			ss.MeasuredCached = &m
		}
		st.Slots = append(st.Slots, ss)
		if sl.busy {
			st.Busy++
		}
	}
	for _, w := range s.queue {
		st.Waiting = append(st.Waiting, Waiting{Session: w.session, WaitingMs: float64(now.Sub(w.since).Microseconds()) / 1000})
	}
	for _, q := range s.sessions {
		st.InSessions += len(q.waiters)
	}
	return st
}

// String describes a lease for logs.
func (l *Lease) String() string {
	return fmt.Sprintf("slot %d (%d cached, %d ahead, waited %s)", l.Slot, l.Cached, l.Ahead, l.Waited)
}

// LCP is the length of the longest common prefix of a and b.
func LCP[T comparable](a, b []T) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
