package orchestrator

import (
	"context"
	"slices"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// openSession is the session a request runs in, fetched once and handed
// down to every later step: claimed for the request's sigil, and following
// its client's history if the request carries one. followed says whether
// the session took that history (a new epoch). An ephemeral ask runs in an
// empty session of its name, read and written nowhere. The caller holds
// the session.
func (o *Orchestrator) openSession(ctx context.Context, req ctxd.AskRequest, sigil runcontext.Sigil) (sess ctxd.Session, followed bool, err error) {
	if req.Ephemeral {
		return ctxd.Session{ID: req.Session}, false, nil
	}
	if sess, err = o.session(ctx, req.Session); err != nil {
		return sess, false, err
	}
	if err := o.claim(ctx, &sess, sigil.Name); err != nil {
		return sess, false, err
	}
	if req.History != nil {
		if followed, err = o.follow(ctx, &sess, req.History); err != nil {
			return sess, false, err
		}
	}
	return sess, followed, nil
}

// session returns a session, from memory when this daemon already holds
// it: the orchestrator is the store's only writer, and a session's
// requests run one at a time, so memory and store agree. What memory holds
// is the session as stored, its owner included.
func (o *Orchestrator) session(ctx context.Context, id string) (ctxd.Session, error) {
	o.mu.Lock()
	s, ok := o.sessions[id]
	o.mu.Unlock()
	if ok {
		s.Turns, s.Seqs = slices.Clone(s.Turns), slices.Clone(s.Seqs)
		return s, nil
	}
	sctx, cancel := o.storeCtx(ctx, false)
	defer cancel()
	s, err := o.store.Session(sctx, id)
	if err != nil {
		return s, o.storeErr(sctx, id, "read the session", err)
	}
	o.cacheSession(s)
	return s, nil
}

// claim makes the session sigil's, or refuses a session another sigil
// owns: its history (and karma) are that sigil's. A session already the
// sigil's, as fetched, costs no store call. The caller holds the session.
func (o *Orchestrator) claim(ctx context.Context, sess *ctxd.Session, sigil string) error {
	if sess.Owner == sigil {
		return nil
	}
	sctx, cancel := o.storeCtx(ctx, false)
	defer cancel()
	owner, err := o.store.ClaimSession(sctx, sess.ID, sigil, o.cfg.Sigils.Default(), o.cfg.Now())
	if err != nil {
		return o.storeErr(sctx, sess.ID, "claim the session", err)
	}
	if owner != sigil {
		return ctxd.Errorf(ctxd.KindForbidden, "session %q belongs to another sigil; choose another session id", sess.ID)
	}
	sess.Owner = owner
	o.cacheSession(*sess)
	return nil
}

// cacheSession keeps s as stored (its owner included), for the session's
// next request.
func (o *Orchestrator) cacheSession(s ctxd.Session) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.sessions) >= 1024 {
		clear(o.sessions) // a bound, not an LRU: a miss costs one read
	}
	o.sessions[s.ID] = s
}

// uncacheSession forgets what memory holds of a session whose write
// failed: its next request reads the store.
func (o *Orchestrator) uncacheSession(id string) {
	o.mu.Lock()
	delete(o.sessions, id)
	o.mu.Unlock()
}
