package orchestrator

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// sessions is the session side of the orchestrator: every call a request
// makes to the session store, each bounded by the store's deadline, and
// the sessions as stored, held in memory so that a session's next request
// need not read it back. The orchestrator is the store's only writer, and
// a session's requests run one at a time (the scheduler holds the session
// for each), so memory and store agree; a write that fails forgets what
// memory holds of its session, and the next request reads the store.
type sessions struct {
	store    ctxd.Store
	deadline storeDeadline
	sigils   *sigils.Registry // its default sigil may claim a session recorded before owners were
	now      func() time.Time
	log      *slog.Logger
	perSigil int // sessions one sigil may hold (0: no bound)
	// shared: other daemons write the store too, so what memory holds of
	// a session is not read back (Config.SharedStore).
	shared bool

	mu   sync.Mutex              // guards held and owned; held only to read or write them
	held map[string]ctxd.Session // sessions as stored, owner included, by id
	// owned counts each sigil's sessions (perSigil): read from the store
	// once, then kept as sessions are begun and deleted. nil until read.
	owned map[string]int
}

func newSessions(store ctxd.Store, deadline storeDeadline, reg *sigils.Registry, now func() time.Time, log *slog.Logger, perSigil int) *sessions {
	return &sessions{store: store, deadline: deadline, sigils: reg, now: now, log: log, perSigil: perSigil, held: map[string]ctxd.Session{}}
}

// open is the session a request runs in, fetched once and handed down to
// every later step: claimed for the request's sigil, and following its
// client's history if the request carries one. followed says whether the
// session took that history (a new epoch). An ephemeral ask runs in an
// empty session of its name, read and written nowhere. A new session
// (nothing stored under its id) is the sigil's at once, and its claim is
// written behind (w), while the backend evaluates the prompt: nobody else
// can take it meanwhile, as the caller holds the session and the state
// directory is this daemon's alone. With a shared store another daemon
// could: the store's ClaimSession decides, and the loser's request ends
// refused (KindForbidden), its answer not recorded.
func (s *sessions) open(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil, w *writeBehind) (sess ctxd.Session, followed bool, err error) {
	if req.Ephemeral {
		return ctxd.Session{ID: req.Session}, false, nil
	}
	if sess, err = s.get(ctx, req.Session); err != nil {
		return sess, false, err
	}
	if sess.Owner == "" && sess.Count == 0 {
		if err := s.begin(ctx, sigil.Name); err != nil {
			return sess, false, err
		}
	}
	if sess.Owner == "" && sess.Count == 0 && req.History == nil {
		claimed := sess // owned by nobody yet: the claim writes its owner
		w.queue(func() error { return s.claim(ctx, &claimed, sigil.Name) })
		sess.Owner = sigil.Name
	} else if err := s.claim(ctx, &sess, sigil.Name); err != nil {
		return sess, false, err
	}
	if req.History != nil {
		if followed, err = s.follow(ctx, &sess, req.History); err != nil {
			return sess, false, err
		}
	}
	return sess, followed, nil
}

// get returns a session, from memory when this daemon already holds it.
func (s *sessions) get(ctx context.Context, id string) (ctxd.Session, error) {
	s.mu.Lock()
	sess, ok := s.held[id]
	s.mu.Unlock()
	if ok && !s.shared {
		sess.Turns, sess.Seqs = slices.Clone(sess.Turns), slices.Clone(sess.Seqs)
		return sess, nil
	}
	sctx, cancel := s.deadline.ctx(ctx, false)
	defer cancel()
	sess, err := s.store.Session(sctx, id)
	if err != nil {
		return sess, s.deadline.err(sctx, id, "read the session", err)
	}
	s.keep(sess)
	return sess, nil
}

// scoped is the session that sigil's id names (ctxd.ScopedSessionID).
func (s *sessions) scoped(ctx context.Context, sigil, id string) (string, error) {
	if or, ok := s.store.(ownerReader); ok && s.shared {
		// Nothing is held: read the owner alone, not the whole session
		// (open reads that once the request holds it).
		sctx, cancel := s.deadline.ctx(ctx, false)
		defer cancel()
		owner, err := or.SessionOwner(sctx, id)
		if err != nil {
			return "", s.deadline.err(sctx, id, "read the session's owner", err)
		}
		return ctxd.ScopedSessionID(owner, sigil, s.sigils.Default(), id), nil
	}
	sess, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	return ctxd.ScopedSessionID(sess.Owner, sigil, s.sigils.Default(), id), nil
}

// ownerReader is a store that reads a session's owner alone ("" for a
// session never begun or recorded before owners were): a shared store,
// where nothing is held and a whole session costs a read.
type ownerReader interface {
	SessionOwner(ctx context.Context, id string) (string, error)
}

// claim makes the session sigil's, or refuses a session another sigil
// owns: its history (and karma) are that sigil's. A session already the
// sigil's, as fetched, costs no store call. The caller holds the session.
func (s *sessions) claim(ctx context.Context, sess *ctxd.Session, sigil string) error {
	if sess.Owner == sigil {
		return nil
	}
	sctx, cancel := s.deadline.ctx(ctx, false)
	defer cancel()
	owner, err := s.store.ClaimSession(sctx, sess.ID, sigil, s.sigils.Default(), s.now())
	if err != nil {
		return s.deadline.err(sctx, sess.ID, "claim the session", err)
	}
	if owner != sigil {
		return ctxd.Errorf(ctxd.KindForbidden, "session %q belongs to another sigil; choose another session id", sess.ID)
	}
	sess.Owner = owner
	s.keep(*sess)
	return nil
}

// newEpoch stores a new epoch of session id holding the turns at keep and
// summary, and updates sess to match.
func (s *sessions) newEpoch(ctx context.Context, id string, sess *ctxd.Session, keep []int, summary string) error {
	seqs := make([]int64, len(keep))
	turns := make([]ctxd.Turn, len(keep))
	for j, i := range keep {
		seqs[j], turns[j] = sess.Seqs[i], sess.Turns[i]
	}
	sctx, cancel := s.deadline.ctx(ctx, false)
	defer cancel()
	var since int64 // the last turn read: later ones are another daemon's, kept
	if n := len(sess.Seqs); n > 0 {
		since = sess.Seqs[n-1]
	}
	epoch, err := s.store.NewEpoch(sctx, id, seqs, since, summary, s.now())
	if err != nil {
		s.forget(id)
		return s.deadline.err(sctx, id, "begin a new epoch", err)
	}
	sess.Epoch, sess.Summary, sess.Turns, sess.Seqs = epoch, summary, turns, seqs
	s.keep(*sess)
	return nil
}

// dropExcerpts stores a new epoch of session id whose history keeps its
// turns, those at seqs (nil: all) without their excerpts, and updates sess
// to match.
func (s *sessions) dropExcerpts(ctx context.Context, id string, sess *ctxd.Session, seqs []int64) error {
	sctx, cancel := s.deadline.ctx(ctx, false)
	defer cancel()
	epoch, err := s.store.DropExcerpts(sctx, id, seqs, s.now())
	if err != nil {
		s.forget(id)
		return s.deadline.err(sctx, id, "leave the history's excerpts out", err)
	}
	turns := slices.Clone(sess.Turns)
	for i := range turns {
		if seqs == nil || i < len(sess.Seqs) && slices.Contains(seqs, sess.Seqs[i]) {
			turns[i].Excerpts = nil
		}
	}
	sess.Epoch, sess.Turns = epoch, turns
	s.keep(*sess)
	return nil
}

// appendTurn stores the turn, with the request's summary (JSON), and
// updates sess to match. The write is not cancelled with ctx (the backend
// already holds the answer in its cache, and the next turn must extend
// it), but bounded; its failure is an answer not recorded.
func (s *sessions) appendTurn(ctx context.Context, id string, sess ctxd.Session, turn ctxd.Turn, summary []byte) error {
	sctx, cancel := s.deadline.ctx(ctx, true)
	defer cancel()
	seq, err := s.store.AppendTurn(sctx, id, turn, summary, s.now())
	if err != nil {
		s.forget(id)
		return s.deadline.notRecorded(sctx, id, "write the turn", err)
	}
	sess.Turns = append(sess.Turns, turn)
	sess.Seqs = append(sess.Seqs, seq)
	sess.Count++
	s.keep(sess)
	return nil
}

// delete deletes session id from the store and forgets it. The caller
// holds the session.
func (s *sessions) delete(ctx context.Context, id string) error {
	sctx, cancel := s.deadline.ctx(ctx, false)
	defer cancel()
	s.mu.Lock()
	held, ok := s.held[id]
	s.mu.Unlock()
	if err := s.store.DeleteSession(sctx, id); err != nil {
		return s.deadline.err(sctx, id, "delete the session", err)
	}
	s.forget(id)
	s.mu.Lock()
	if s.owned != nil && ok && held.Count > 0 && s.owned[held.Owner] > 0 {
		s.owned[held.Owner]--
	}
	s.mu.Unlock()
	return nil
}

// begin counts a new session of sigil, or refuses it (KindTooMany) if the
// sigil holds perSigil sessions already: one sigil's thousands of
// sessions cost every other's store. The counts are read from the store
// on first use and kept after; with a shared store, where other daemons
// begin and delete sessions too, they are read at every new session (two
// daemons beginning a sigil's last one at once may both admit it).
func (s *sessions) begin(ctx context.Context, sigil string) error {
	if s.perSigil <= 0 {
		return nil
	}
	s.mu.Lock()
	counted := s.owned != nil && !s.shared
	s.mu.Unlock()
	if !counted {
		sctx, cancel := s.deadline.ctx(ctx, false)
		all, err := s.store.Sessions(sctx)
		cancel()
		if err != nil {
			return s.deadline.err(sctx, "", "count the sigils' sessions", err)
		}
		owned := map[string]int{}
		for _, si := range all {
			owner := si.Sigil
			if owner == "" {
				owner = s.sigils.Default() // recorded before owners were
			}
			owned[owner]++
		}
		s.mu.Lock()
		if s.owned == nil || s.shared {
			s.owned = owned
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.owned[sigil]; n >= s.perSigil {
		return ctxd.Errorf(ctxd.KindTooMany, "sigil %q holds %d sessions, the most daemon.max_sessions_per_sigil allows; delete some (DELETE /v1/sessions/{id})", sigil, n)
	}
	s.owned[sigil]++
	return nil
}

// keep holds sess as stored (its owner included), for the session's next
// request.
func (s *sessions) keep(sess ctxd.Session) {
	if s.shared {
		return // nothing is read back from memory (Config.SharedStore)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.held) >= 1024 {
		clear(s.held) // a bound, not an LRU: a miss costs one read
	}
	s.held[sess.ID] = sess
}

// forget drops what memory holds of a session (one deleted, or whose
// write failed): its next request reads the store.
func (s *sessions) forget(id string) {
	s.mu.Lock()
	delete(s.held, id)
	s.mu.Unlock()
}
