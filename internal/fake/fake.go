// Package fake holds small in-memory implementations of the interfaces
// ctxd's core consumes — a session store, a scripted backend, a byte
// tokenizer and a settable environment — so the orchestrator, the
// scheduler and every route of the daemon can be tested with `go test`
// and no model server. The real adapters are tested against the real
// things in their own packages and in integration/.
package fake

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// Tokenizer makes one token per byte: exact and trivially checkable.
type Tokenizer struct{}

var _ ctxd.Tokenizer = Tokenizer{}

func (Tokenizer) Tokenize(s string) ([]int, error) {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out, nil
}

func (t Tokenizer) TokenizeText(s string) ([]int, error) { return t.Tokenize(s) }

func (Tokenizer) CountText(s string) (int, error) { return len(s), nil }

// Sensor reports the bands it is set to.
type Sensor struct {
	mu  sync.Mutex
	env ctxd.Environment
}

// NewSensor returns a sensor with memory "high", no GPU, AC power, offline.
func NewSensor() *Sensor {
	return &Sensor{env: ctxd.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "offline"}}
}

func (s *Sensor) Environment() ctxd.Environment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.env
}

// SetVRAM changes the VRAM pressure band.
func (s *Sensor) SetVRAM(band string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.env.VRAM = band
}

// Store is an in-memory session store.
type Store struct {
	mu       sync.Mutex
	sessions map[string]*storedSession
	failNext error // the next write fails with it
}

type storedSession struct {
	epoch   int
	summary string
	turns   []storedTurn
	owner   string
}

type storedTurn struct {
	seq   int64
	epoch int
	turn  ctxd.Turn
}

var (
	_ ctxd.Store          = (*Store)(nil)
	_ ctxd.SessionCounter = (*Store)(nil)
)

// NewStore returns an empty store.
func NewStore() *Store { return &Store{sessions: map[string]*storedSession{}} }

// FailNextWrite makes the next AppendTurn or NewEpoch fail with err.
func (s *Store) FailNextWrite(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = err
}

func (s *Store) writeErrLocked() error {
	err := s.failNext
	s.failNext = nil
	return err
}

func (s *Store) Session(_ context.Context, id string) (ctxd.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ctxd.Session{ID: id}
	st := s.sessions[id]
	if st == nil {
		return out, nil
	}
	out.Epoch, out.Summary, out.Count, out.Owner = st.epoch, st.summary, len(st.turns), st.owner
	for _, t := range st.turns {
		if t.epoch == st.epoch {
			out.Turns = append(out.Turns, t.turn)
			out.Seqs = append(out.Seqs, t.seq)
		}
	}
	return out, nil
}

func (s *Store) AppendTurn(_ context.Context, id string, t ctxd.Turn, _ []byte, _ time.Time) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	st := s.sessionLocked(id)
	seq := int64(len(st.turns) + 1)
	st.turns = append(st.turns, storedTurn{seq: seq, epoch: st.epoch, turn: t})
	return seq, nil
}

func (s *Store) NewEpoch(_ context.Context, id string, keep []int64, since int64, summary string, _ time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	st := s.sessionLocked(id)
	st.epoch++
	st.summary = summary
	for i := range st.turns {
		if slices.Contains(keep, st.turns[i].seq) || st.turns[i].epoch == st.epoch-1 && st.turns[i].seq > since {
			st.turns[i].epoch = st.epoch
		}
	}
	return st.epoch, nil
}

func (s *Store) ReplaceTurns(_ context.Context, id string, turns []ctxd.Turn, _ time.Time) (int, []int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, nil, err
	}
	st := s.sessionLocked(id)
	st.epoch++
	st.summary = ""
	var seqs []int64
	for _, t := range turns {
		seq := int64(len(st.turns) + 1)
		st.turns = append(st.turns, storedTurn{seq: seq, epoch: st.epoch, turn: t})
		seqs = append(seqs, seq)
	}
	return st.epoch, seqs, nil
}

func (s *Store) DropExcerpts(_ context.Context, id string, seqs []int64, _ time.Time) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writeErrLocked(); err != nil {
		return 0, err
	}
	st := s.sessionLocked(id)
	st.epoch++
	for i := range st.turns {
		if st.turns[i].epoch == st.epoch-1 {
			st.turns[i].epoch = st.epoch
		}
		if seqs == nil || slices.Contains(seqs, st.turns[i].seq) {
			st.turns[i].turn.Excerpts = nil
		}
	}
	return st.epoch, nil
}

// sessionLocked returns the stored session id, creating it.
func (s *Store) sessionLocked(id string) *storedSession {
	st := s.sessions[id]
	if st == nil {
		st = &storedSession{}
		s.sessions[id] = st
	}
	return st
}

func (s *Store) ClaimSession(_ context.Context, id, sigil, legacy string, _ time.Time) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sessionLocked(id)
	if st.owner == "" && (len(st.turns) == 0 || sigil == legacy) {
		st.owner = sigil
	}
	return st.owner, nil
}

func (s *Store) DeleteSession(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, id)
	return nil
}

func (s *Store) Sessions(context.Context) ([]ctxd.SessionInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ctxd.SessionInfo
	for id, st := range s.sessions {
		out = append(out, ctxd.SessionInfo{ID: id, Epoch: st.epoch, Turns: len(st.turns), Sigil: st.owner})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// SessionCount is how many sessions Sessions would list.
func (s *Store) SessionCount(context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions), nil
}

// Backend is a scripted backend. It streams its answer word by word and
// remembers every request; Hold makes generations stop after their first
// piece until Release (or their context ends); FailNext makes the next
// generation fail.
type Backend struct {
	mu         sync.Mutex
	answer     string
	requests   []ctxd.GenerateRequest
	gate       chan struct{} // nil: generations run through
	failNext   error
	incomplete bool
	running    int
	maxRunning int
	stopped    int // generations that ended because their context did
	started    chan ctxd.GenerateRequest
}

var _ ctxd.Backend = (*Backend)(nil)

// NewBackend returns a backend that answers "an answer".
func NewBackend() *Backend {
	return &Backend{answer: "an answer", started: make(chan ctxd.GenerateRequest, 1024)}
}

// SetAnswer sets the text every generation streams.
func (b *Backend) SetAnswer(text string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answer = text
}

// SetIncomplete makes generations end like a stream without the backend's
// final message.
func (b *Backend) SetIncomplete(v bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.incomplete = v
}

// Hold makes generations that start from now on wait after their first
// piece until Release.
func (b *Backend) Hold() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gate == nil {
		b.gate = make(chan struct{})
	}
}

// Release lets held generations finish, and later ones run through.
func (b *Backend) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gate != nil {
		close(b.gate)
		b.gate = nil
	}
}

// FailNext makes the next generation fail with err before streaming.
func (b *Backend) FailNext(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failNext = err
}

// Started yields each request as its generation starts.
func (b *Backend) Started() <-chan ctxd.GenerateRequest { return b.started }

// Prompts are the prompts of every generation so far, in order.
func (b *Backend) Prompts() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, r := range b.requests {
		out = append(out, r.Prompt)
	}
	return out
}

// Requests are every generation's request so far, in order.
func (b *Backend) Requests() []ctxd.GenerateRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.requests)
}

// Running is how many generations run now.
func (b *Backend) Running() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.running
}

// MaxRunning is the most generations that ran at once.
func (b *Backend) MaxRunning() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.maxRunning
}

// Stopped is how many generations ended because their context did.
func (b *Backend) Stopped() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopped
}

// ErrScripted is what FailNext callers usually pass.
var ErrScripted = errors.New("fake backend: scripted failure")

func (b *Backend) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	b.mu.Lock()
	if err := b.failNext; err != nil {
		b.failNext = nil
		b.mu.Unlock()
		return ctxd.Generation{}, err
	}
	b.requests = append(b.requests, req)
	b.running++
	b.maxRunning = max(b.maxRunning, b.running)
	gate, answer, incomplete := b.gate, b.answer, b.incomplete
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.running--
		b.mu.Unlock()
	}()
	select {
	case b.started <- req:
	default:
	}

	start := time.Now()
	gen := ctxd.Generation{PromptEvalCount: len(req.Prompt), BackendCached: -1}
	pieces := strings.SplitAfter(answer, " ")
	var sb strings.Builder
	for i, p := range pieces {
		if err := ctx.Err(); err != nil {
			return b.stop(gen, sb.String(), err)
		}
		if i == 0 {
			gen.TTFT = time.Since(start)
		}
		sb.WriteString(p)
		if err := onToken(p); err != nil {
			return b.stop(gen, sb.String(), err)
		}
		if i == 0 && gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return b.stop(gen, sb.String(), ctx.Err())
			}
		}
	}
	gen.Text = sb.String()
	if incomplete {
		gen.DoneReason = ctxd.DoneIncomplete
		gen.PromptEvalCount = 0
		return gen, nil
	}
	gen.DoneReason, gen.EvalCount = ctxd.DoneStop, len(pieces)
	return gen, nil
}

func (b *Backend) stop(gen ctxd.Generation, text string, err error) (ctxd.Generation, error) {
	b.mu.Lock()
	b.stopped++
	b.mu.Unlock()
	gen.Text = text
	return gen, fmt.Errorf("fake backend: generation stopped: %w", err)
}
