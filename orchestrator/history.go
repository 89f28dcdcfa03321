package orchestrator

import (
	"context"
	"strings"

	"github.com/ctxd/ctxd"
)

// follow makes the session agree with the history its client resends (the
// OpenAI and Ollama doors). A client that extends one conversation sends
// back every earlier turn, so its history ends with the session's current
// epoch and nothing changes: the prompt extends the cached prefix. One
// that edited, dropped or regenerated a turn, or that started a new
// conversation under the same session, does not: the session starts a new
// epoch holding the client's turns (the record keeps the old ones), and
// the prefix breaks in the state block. Turns compacted or condensed away
// are no longer compared: the client's history may be longer than the
// epoch when the session has dropped turns. It reports whether it
// replaced the turns; sess is then the session as stored, owner and all.
func (s *sessions) follow(ctx context.Context, sess *ctxd.Session, history []ctxd.Turn) (bool, error) {
	if extends(history, *sess) {
		return false, nil
	}
	turns := make([]ctxd.Turn, len(history))
	for i, t := range history {
		turns[i] = ctxd.Turn{Query: t.Query, Answer: t.Answer, Verbatim: t.Verbatim}
	}
	keepExcerpts(turns, *sess)
	// Not cancelled with the request (the store is asked once, and the
	// session agrees with it whatever the client does), but bounded.
	sctx, cancel := s.deadline.ctx(ctx, true)
	defer cancel()
	epoch, seqs, err := s.store.ReplaceTurns(sctx, sess.ID, turns, s.now())
	if err != nil {
		s.forget(sess.ID)
		return false, s.deadline.err(sctx, sess.ID, "take the client's history", err)
	}
	held := len(sess.Turns)
	*sess = ctxd.Session{ID: sess.ID, Epoch: epoch, Turns: turns, Seqs: seqs, Count: sess.Count + len(turns), Owner: sess.Owner}
	s.keep(*sess)
	s.log.InfoContext(ctx, "session follows its client's history", "session", sess.ID, "client_turns", len(history), "held_turns", held, "epoch", epoch)
	return true, nil
}

// extends reports whether the client's history ends with the session's
// current turns, and is longer only where the session dropped turns.
func extends(history []ctxd.Turn, sess ctxd.Session) bool {
	n, m := len(history), len(sess.Turns)
	if n < m {
		return false
	}
	if n > m && sess.Count == m && sess.Summary == "" {
		return false // the session never dropped a turn: the client has turns it never saw
	}
	for i, t := range sess.Turns {
		h := history[n-m+i]
		if strings.TrimSpace(h.Query) != strings.TrimSpace(t.Query) || strings.TrimSpace(h.Answer) != strings.TrimSpace(t.Answer) {
			return false
		}
	}
	return true
}

// keepExcerpts gives the client's turns, in a new epoch, the codex
// excerpts ctxd retrieved for them: the turns the session held unchanged
// from the first on keep them whole, and so does the first turn that
// changed when it is an edit of the held one (the two share at least its
// first half: an agent that rewrites a reminder at the end of a message).
// The state then renders as before up to the first changed byte, and the
// backend re-reads only what follows it, as it would without ctxd; a
// client history dropped in front of the held turns (a summary, or turns
// compacted away) shares no start with them and keeps nothing.
func keepExcerpts(turns []ctxd.Turn, sess ctxd.Session) {
	if sess.Summary != "" {
		return
	}
	for i := range min(len(turns), len(sess.Turns)) {
		held, t := sess.Turns[i], &turns[i]
		same := strings.TrimSpace(held.Query) == strings.TrimSpace(t.Query)
		if same || edited(held.Query, t.Query) {
			t.Excerpts = held.Excerpts
		}
		if !same || strings.TrimSpace(held.Answer) != strings.TrimSpace(t.Answer) {
			return
		}
	}
}

// edited reports whether query is an edit of held: they share a start at
// least half as long as held.
func edited(held, query string) bool {
	n := ctxd.SharedStart(held, query)
	return n > 0 && 2*n >= len(held)
}
