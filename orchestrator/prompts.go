package orchestrator

import (
	"sync"

	"github.com/ctxd/ctxd/runcontext"
)

// previous is what a session sent last, to find where a prefix broke.
type previous struct {
	rendered runcontext.Rendered
	answer   string // as the format renders it into the next prompt
	sigil    string // the sigil it was sent as
}

// lastPrompts holds the prompt each session sent last since the daemon
// started (LastPrompt, and where the next request's prefix breaks). It is
// memory only: a session it does not hold reports no prefix break.
type lastPrompts struct {
	mu   sync.Mutex          // guards byID; held only to read or write it
	byID map[string]previous // by session id
}

func newLastPrompts() *lastPrompts { return &lastPrompts{byID: map[string]previous{}} }

// get is what session id sent last; false if none is held.
func (l *lastPrompts) get(id string) (previous, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.byID[id]
	return p, ok
}

// put holds p as what session id sent last.
func (l *lastPrompts) put(id string, p previous) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.byID) >= 1024 {
		clear(l.byID) // a bound: a session whose prompt is dropped reports no prefix break once
	}
	l.byID[id] = p
}

// forget drops what session id sent last (a deleted session).
func (l *lastPrompts) forget(id string) {
	l.mu.Lock()
	delete(l.byID, id)
	l.mu.Unlock()
}
