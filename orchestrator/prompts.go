package orchestrator

import (
	"fmt"
	"strings"
	"sync"

	"github.com/ctxd/ctxd/runcontext"
)

// previous is what a session sent last, to find where a prefix broke.
type previous struct {
	rendered runcontext.Rendered
	answer   string                // as the format renders it into the next prompt
	sigil    string                // the sigil it was sent as
	codex    []runcontext.CodexRef // the codex's files, in their order
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

// codexChange says which of the codex's files changed between two prompts'
// codex blocks and how many files still render as before, for a prefix
// break at the codex block; "" if the files are the same.
func codexChange(prev, cur []runcontext.CodexRef) string {
	if len(prev) == 0 || len(cur) == 0 {
		return ""
	}
	was := make(map[string]string, len(prev))
	for _, f := range prev {
		was[f.Path] = f.SHA256
	}
	now := make(map[string]bool, len(cur))
	var changed, added []string
	for _, f := range cur {
		now[f.Path] = true
		switch sum, ok := was[f.Path]; {
		case !ok:
			added = append(added, f.Path)
		case sum != f.SHA256:
			changed = append(changed, f.Path)
		}
	}
	var removed []string
	for _, f := range prev {
		if !now[f.Path] {
			removed = append(removed, f.Path)
		}
	}
	same := 0
	for same < min(len(prev), len(cur)) && prev[same] == cur[same] {
		same++
	}
	if len(changed)+len(added)+len(removed) == 0 && same == len(cur) && len(prev) == len(cur) {
		return ""
	}
	var parts []string
	for _, g := range []struct {
		what  string
		paths []string
	}{{"changed", changed}, {"added", added}, {"removed", removed}} {
		if len(g.paths) > 0 {
			list := strings.Join(g.paths[:min(5, len(g.paths))], ", ")
			if len(g.paths) > 5 {
				list += fmt.Sprintf(" and %d more", len(g.paths)-5)
			}
			parts = append(parts, fmt.Sprintf("%d %s (%s)", len(g.paths), g.what, list))
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("codex files moved; the first %d of %d files render as before", same, len(cur))
	}
	return fmt.Sprintf("codex files %s; the first %d of %d files render as before", strings.Join(parts, ", "), same, len(cur))
}
