package cache

import (
	"slices"
	"strings"
	"sync"

	"github.com/ctxd/ctxd/runcontext"
)

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

// Slots remembers the prompt tokens each backend slot last evaluated.
// It is safe for concurrent use.
type Slots struct {
	mu     sync.Mutex // guards tokens
	tokens map[string][]int
}

// NewSlots returns an empty tracker: nothing is known to be cached.
func NewSlots() *Slots { return &Slots{tokens: map[string][]int{}} }

// Expect returns how many leading tokens of prompt the slot already holds.
func (s *Slots) Expect(slot string, prompt []int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return LCP(s.tokens[slot], prompt)
}

// Record notes that slot now holds prompt (the caller must not modify it).
func (s *Slots) Record(slot string, prompt []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[slot] = slices.Clip(prompt)
}

// Forget drops what is known about slot, e.g. after the backend restarted.
func (s *Slots) Forget(slot string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, slot)
}

// Break says where a prompt stopped extending the one before it.
type Break struct {
	Block  string `json:"block"`  // first block whose bytes changed
	Reason string `json:"reason"` // human-readable cause
}

// Compare reports where cur stops extending prev, the previous prompt of
// the same session followed by its answer as it renders into the state.
// It returns nil when cur extends prev. It compares block by block and
// copies nothing: the stable blocks of two requests usually share memory.
func Compare(prev, cur runcontext.Rendered, prevAnswer string) *Break {
	for k := range runcontext.BlockState {
		if prev.Blocks[k] != cur.Blocks[k] {
			name := runcontext.BlockNames[k]
			return &Break{Block: name, Reason: name + " block changed"}
		}
	}
	// The previous query and answer belong in the state now, so the new
	// state must start with the old state, the old query and the answer.
	st := cur.Blocks[runcontext.BlockState]
	for _, part := range []string{prev.Blocks[runcontext.BlockState], prev.Blocks[runcontext.BlockQuery], runcontext.RenderAnswer(prevAnswer)} {
		if !strings.HasPrefix(st, part) {
			return &Break{Block: runcontext.BlockNames[runcontext.BlockState], Reason: "conversation was compacted or rewritten"}
		}
		st = st[len(part):]
	}
	return nil
}
