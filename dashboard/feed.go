// Package dashboard provides the daemon's live dashboard: the page
// (embedded; it needs no network), the feed of finished turns and band
// changes it shows, and the short-lived tokens that open it in a browser.
// The HTTP surface (httpapi) serves them and decides who sees what.
package dashboard

import (
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// Turn is one finished answer as the dashboard shows it.
type Turn struct {
	Seq     int64        `json:"seq"` // counts every turn recorded since the daemon started
	At      time.Time    `json:"at"`
	Sigil   string       `json:"sigil"`             // the sigil that asked
	Persona string       `json:"persona,omitempty"` // the persona that answered, when there are several
	Session string       `json:"session"`           // the id its client named
	Summary ctxd.Summary `json:"summary"`
}

// BandChange is a change of the environment bands.
type BandChange struct {
	At   time.Time        `json:"at"`
	From ctxd.Environment `json:"from"`
	To   ctxd.Environment `json:"to"`
}

// Bucket counts the turns that finished in BucketSeconds from Start (unix
// seconds): requests, and the prompt tokens evaluated and reused.
type Bucket struct {
	Start     int64 `json:"start"`
	Requests  int   `json:"requests"`
	Evaluated int   `json:"evaluated"`
	Reused    int   `json:"reused"`
}

// Feed sizes: turns kept for a page that opens (the series covers what they
// cover), band changes kept, and each page's queue of turns not yet sent.
const (
	DefaultTurns  = 2000
	keptBands     = 50
	pageQueue     = 256
	BucketSeconds = 10 // the activity series' bucket
	SeriesBuckets = 60 // the series' length: ten minutes
)

// Feed keeps the latest turns and band changes and tells the open pages of
// each new one. Record never waits for a page: a page whose queue is full
// is told to start again from a snapshot.
type Feed struct {
	max int

	mu     sync.Mutex
	turns  []Turn           // oldest first, at most max
	series map[string]*ring // each sigil's activity, counted as turns are recorded
	seq    int64
	bands  []BandChange // oldest first, at most keptBands
	env    ctxd.Environment
	envSet bool
	subs   map[*Sub]struct{}
}

// NewFeed keeps the last max turns (DefaultTurns when max <= 0).
func NewFeed(max int) *Feed {
	if max <= 0 {
		max = DefaultTurns
	}
	return &Feed{max: max, series: map[string]*ring{}, subs: map[*Sub]struct{}{}}
}

// ring is one sigil's last SeriesBuckets buckets, each in the place its
// start gives it.
type ring [SeriesBuckets]Bucket

// Reused is the prompt tokens a turn reused from the server's cache: what
// the server says it reused where it says (llama-server's cache_n), else
// what ctxd expected it to hold. The page counts them alike.
func Reused(sum ctxd.Summary) int {
	if sum.BackendCachedTokens != nil {
		return *sum.BackendCachedTokens
	}
	return sum.CachedTokens
}

// Record notes a finished answer of sigil's (answered by persona, "" for
// the only one). The session is shown by the id its client named; the
// tool calls' arguments are left out (a page shows what a turn cost, not
// what it said).
func (f *Feed) Record(sigil, persona string, sum ctxd.Summary, at time.Time) {
	sum.Session = ctxd.ClientSessionID(sum.Session)
	sum.ToolCalls = nil
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	t := Turn{Seq: f.seq, At: at, Sigil: sigil, Persona: persona, Session: sum.Session, Summary: sum}
	if len(f.turns) == f.max {
		copy(f.turns, f.turns[1:])
		f.turns = f.turns[:len(f.turns)-1]
	}
	f.turns = append(f.turns, t)
	r := f.series[sigil]
	if r == nil {
		r = &ring{}
		f.series[sigil] = r
	}
	start := at.Unix() - at.Unix()%BucketSeconds
	if b := &r[(start/BucketSeconds)%SeriesBuckets]; start >= b.Start { // an older turn than its place holds is past the window
		if start > b.Start {
			*b = Bucket{Start: start}
		}
		b.Requests++
		b.Evaluated += sum.EvaluatedTokens
		b.Reused += Reused(sum)
	}
	for s := range f.subs {
		s.offer(Event{Turn: &t})
	}
}

// NoteEnvironment records env as the bands now; a change from the last
// noted is kept and told to the open pages. The first note only sets the
// starting point.
func (f *Feed) NoteEnvironment(env ctxd.Environment, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.envSet {
		f.env, f.envSet = env, true
		return
	}
	if env == f.env {
		return
	}
	c := BandChange{At: at, From: f.env, To: env}
	f.env = env
	if len(f.bands) == keptBands {
		f.bands = append(f.bands[:0], f.bands[1:]...)
	}
	f.bands = append(f.bands, c)
	for s := range f.subs {
		s.offer(Event{Band: &c})
	}
}

// Turns is the kept turns visible says a viewer may see, oldest first, at
// most n of them (all for n <= 0).
func (f *Feed) Turns(visible func(sigil string) bool, n int) []Turn {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Turn
	for i := len(f.turns) - 1; i >= 0 && (n <= 0 || len(out) < n); i-- {
		if visible(f.turns[i].Sigil) {
			out = append(out, f.turns[i])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Series is the activity of the sigils visible says a viewer may see:
// SeriesBuckets contiguous buckets of BucketSeconds, the last one holding
// now, oldest first. It is counted as turns are recorded, so it covers the
// whole window however many turns the feed keeps.
func (f *Feed) Series(visible func(sigil string) bool, now time.Time) []Bucket {
	last := now.Unix() - now.Unix()%BucketSeconds
	first := last - (SeriesBuckets-1)*BucketSeconds
	out := make([]Bucket, SeriesBuckets)
	for i := range out {
		out[i].Start = first + int64(i)*BucketSeconds
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for sigil, r := range f.series {
		if !visible(sigil) {
			continue
		}
		for _, b := range r {
			if b.Requests == 0 || b.Start < first || b.Start > last {
				continue
			}
			o := &out[(b.Start-first)/BucketSeconds]
			o.Requests += b.Requests
			o.Evaluated += b.Evaluated
			o.Reused += b.Reused
		}
	}
	return out
}

// Bands is the kept band changes, oldest first.
func (f *Feed) Bands() []BandChange {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]BandChange(nil), f.bands...)
}

// Subscribe opens a page's queue of what happens from now on; Close it
// when the page goes.
func (f *Feed) Subscribe() *Sub {
	s := &Sub{f: f, ch: make(chan Event, pageQueue), behind: make(chan struct{}, 1)}
	f.mu.Lock()
	f.subs[s] = struct{}{}
	f.mu.Unlock()
	return s
}

// Event is a turn or a band change on its way to a page.
type Event struct {
	Turn *Turn
	Band *BandChange
}

// Sub is one page's queue.
type Sub struct {
	f      *Feed
	ch     chan Event
	behind chan struct{} // signalled when an event did not fit the queue
}

// offer queues e without waiting; a full queue marks the page behind.
// Called with the feed's lock held.
func (s *Sub) offer(e Event) {
	select {
	case s.ch <- e:
	default:
		select {
		case s.behind <- struct{}{}:
		default:
		}
	}
}

// Events is the page's queue of turns and band changes.
func (s *Sub) Events() <-chan Event { return s.ch }

// Behind is signalled when events did not fit the queue: the page must
// start again from a snapshot (Drain first: the snapshot holds what was
// queued).
func (s *Sub) Behind() <-chan struct{} { return s.behind }

// Drain empties the queue.
func (s *Sub) Drain() {
	for {
		select {
		case <-s.ch:
		default:
			return
		}
	}
}

// Close ends the page's queue.
func (s *Sub) Close() {
	s.f.mu.Lock()
	delete(s.f.subs, s)
	s.f.mu.Unlock()
}
