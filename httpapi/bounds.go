package httpapi

import (
	"sync"

	"github.com/ctxd/ctxd"
)

// holds counts what each sigil holds open of one kind of long-lived thing
// (WebSockets, MCP sessions), so that one sigil cannot take what every
// other sigil needs: past its bound, a sigil's next one is refused with an
// error naming the bound's key.
type holds struct {
	mu    sync.Mutex
	what  string // what is held, for the error
	key   string // the configuration key of the bound
	limit int
	by    map[string]int
}

func newHolds(what, key string, limit int) *holds {
	return &holds{what: what, key: key, limit: limit, by: map[string]int{}}
}

// take counts one more for sigil, or refuses it (KindTooMany) if the
// sigil holds its bound already. release gives it back.
func (h *holds) take(sigil string) (release func(), err error) {
	if h == nil {
		return func() {}, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.limit > 0 && h.by[sigil] >= h.limit {
		return nil, ctxd.Errorf(ctxd.KindTooMany, "sigil %q holds %d %s, the most %s allows; close one first", sigil, h.by[sigil], h.what, h.key)
	}
	h.by[sigil]++
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.by[sigil]--; h.by[sigil] <= 0 {
				delete(h.by, sigil)
			}
		})
	}, nil
}

// counts is what each sigil holds now.
func (h *holds) counts() map[string]int {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.by))
	for k, v := range h.by {
		out[k] = v
	}
	return out
}

// Bound is one resource bound as status shows it: its configuration key,
// its value, and (where it is counted) what is in use now.
type Bound struct {
	Key   string `json:"key"`
	Limit int64  `json:"limit"`
	// InUse is the total now; BySigil what each sigil holds (status shows
	// a sigil only its own).
	InUse   *int           `json:"in_use,omitempty"`
	BySigil map[string]int `json:"by_sigil,omitempty"`
}
