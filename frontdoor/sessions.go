package frontdoor

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/toolcall"
)

// conversations finds the session a door's conversation belongs to. A
// client resends its whole history with each request; after each answer
// the door remembers what the conversation has said so far (its history,
// the question and the answer as the client will send it back) under the
// session that answered it. A request whose history is one the door
// remembers joins that session, so a conversation stays in one session
// whatever its first message; any other (a first turn, a conversation
// that diverged from every one the door knows) begins a session of its
// own. Nothing is remembered for a request that was refused or failed, so
// it leaves nothing behind. Two conversations that said the same things
// share a session, as they share a prefix.
//
// Agents also rewrite a conversation they continue: Qwen Code, resuming
// one, takes the reminders off its earlier messages and sends the answers
// it got in pieces as one. Such a history matches no digest, but it
// still holds every answer the conversation got, in order, and nothing
// else in their place. So a history the door cannot place joins the
// session of the conversation (of the same asker: door, sigil, model and
// system text) whose answers it holds, all of them and only them (their
// text joined, white space aside), when it also opens as that
// conversation did: the same first message or an edit of it (the two
// share their first half, or their first 4 KiB). It also joins the
// session whose answers it holds all of, in order, among others (at
// least 64 characters of that session's, white space aside; the newest
// such conversation): Qwen Code asks again with a larger answer limit
// when an answer is cut, goes on in the second conversation, and keeps
// both answers when it resumes. The session takes the
// client's history as a new epoch, keeping the codex excerpts of its
// first turn (see orchestrator's follow) and the record of the turns it
// replaced. A conversation that diverged — another answer to a question,
// another question with its own answer — holds answers no conversation
// got: its own session.
//
// What the door remembers is a digest per answered turn, in memory and
// bounded (the oldest are forgotten first): after a restart, a
// conversation continues in a new session, which still shares the
// identity, codex and environment with every other.
type conversations struct {
	mu     sync.Mutex
	ids    map[string]string // conversation digest → session
	order  []string          // digests, oldest first
	max    int
	starts []opening // the most recently answered conversations' openings, oldest first
}

// opening is how an answered conversation began: who asked (the digest of
// door, sigil, model and system text), its first message (its first 4 KiB,
// its length and digest), and its session. The door keeps the openings of
// the conversations answered last.
type opening struct {
	who, first, digest string
	size               int
	session            string
	// answers mark the conversation's answers, in order, as of its last
	// answered turn.
	answers []answerMark
}

// answerMark is one answer, white space left out: its start, length and
// digest, enough to find it in another conversation's answers.
type answerMark struct {
	head string
	n    int
	sum  [sha256.Size]byte
}

// Bounds of the answers an opening marks (the newest are kept), and of
// what a conversation must have been answered before a history that holds
// its answers among others joins it.
const (
	maxMarks    = 256
	minMarkedIn = 64
)

// markAnswers marks turns' answers.
func markAnswers(turns []ctxd.Turn) []answerMark {
	var marks []answerMark
	for _, t := range turns {
		a := strings.Join(strings.Fields(t.Answer), "")
		if a == "" {
			continue
		}
		marks = append(marks, answerMark{head: a[:min(len(a), 32)], n: len(a), sum: sha256.Sum256([]byte(a))})
	}
	return marks[max(0, len(marks)-maxMarks):]
}

// heldIn reports whether answers (a conversation's answers joined, white
// space left out) hold every answer o marks, in order, and they are at
// least minMarkedIn long in all.
func (o opening) heldIn(answers string) bool {
	total := 0
	for _, m := range o.answers {
		total += m.n
	}
	if total < minMarkedIn {
		return false
	}
	at := 0
	for _, m := range o.answers {
		found := false
		for at+m.n <= len(answers) {
			i := strings.Index(answers[at:], m.head)
			if i < 0 || at+i+m.n > len(answers) {
				return false
			}
			if sha256.Sum256([]byte(answers[at+i:at+i+m.n])) == m.sum {
				at, found = at+i+m.n, true
				break
			}
			at += i + 1
		}
		if !found {
			return false
		}
	}
	return true
}

// Bounds of the openings remembered: how many, and how much of each first
// message.
const (
	maxOpenings  = 256
	openingBytes = 4096
)

func newOpening(who, first, session string) opening {
	first = strings.TrimSpace(first)
	d := sha256.Sum256([]byte(first))
	return opening{who: who, first: first[:min(len(first), openingBytes)], digest: hex.EncodeToString(d[:]), size: len(first), session: session}
}

// opens reports whether a conversation that opened as c opens as this
// one did: the same first message, or one that opens with the same text
// (at least half of this one's, or all of what is kept of it).
func (o opening) opens(c opening) bool {
	if c.digest == o.digest {
		return true
	}
	n := ctxd.SharedStart(o.first, c.first)
	return n > 0 && (2*n >= o.size || n == len(o.first) && len(o.first) == openingBytes)
}

// opened remembers how session's conversation began, as the newest.
func (c *conversations) opened(o opening) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts = slices.DeleteFunc(c.starts, func(x opening) bool { return x.session == o.session })
	c.starts = append(c.starts, o)
	if len(c.starts) > maxOpenings {
		c.starts = c.starts[1:]
	}
}

// rewritten is the session of the conversation a history the door
// cannot place rewrites: the one whose answers (answersKey) it holds, if
// it opens as that one did.
func (c *conversations) rewritten(who string, history []ctxd.Turn) (string, bool) {
	if len(history) == 0 {
		return "", false
	}
	cand := newOpening(who, history[0].Query, "")
	id, exact := c.find(answersKey(who, history))
	answers := answersText(history)
	c.mu.Lock()
	defer c.mu.Unlock()
	if exact {
		for i := len(c.starts) - 1; i >= 0; i-- {
			if o := c.starts[i]; o.session == id {
				if o.who == who && o.opens(cand) {
					return id, true
				}
				break
			}
		}
	}
	// The newest conversation of this asker, opened so, whose answers
	// the history holds among others.
	for i := len(c.starts) - 1; i >= 0; i-- {
		if o := c.starts[i]; o.who == who && o.opens(cand) && o.heldIn(answers) {
			return o.session, true
		}
	}
	return "", false
}

// answersKey is the digest of what a conversation was answered: the
// asker (who), then its answers' text joined, white space left out (an
// agent may join answers it got in pieces, with or without a line
// between them).
func answersKey(who string, turns []ctxd.Turn) string {
	h := sha256.New()
	h.Write([]byte("answers\x00"))
	h.Write([]byte(who))
	h.Write([]byte{0})
	h.Write([]byte(answersText(turns)))
	return hex.EncodeToString(h.Sum(nil))
}

// answersText is turns' answers joined, white space left out.
func answersText(turns []ctxd.Turn) string {
	var sb strings.Builder
	for _, t := range turns {
		for _, f := range strings.Fields(t.Answer) {
			sb.WriteString(f)
		}
	}
	return sb.String()
}

// maxConversations bounds the door's memory of conversations: digests of
// answered turns, about 100 bytes each.
const maxConversations = 1 << 16

func newConversations(max int) *conversations {
	return &conversations{ids: map[string]string{}, max: max}
}

// conversationKey is the digest of a conversation on a door: who asks
// (door, sigil, model), its system text and its turns. Texts are compared
// trimmed, as clients send back answers trimmed or not.
func conversationKey(door, sigil, model, system string, turns []ctxd.Turn) string {
	h := sha256.New()
	for _, s := range []string{door, sigil, strings.TrimSuffix(model, ":latest"), strings.TrimSpace(system)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	for _, t := range turns {
		h.Write([]byte{1})
		h.Write([]byte(strings.TrimSpace(t.Query)))
		h.Write([]byte{0})
		h.Write([]byte(strings.TrimSpace(t.Answer)))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// find is the session a conversation whose digest is key belongs to.
func (c *conversations) find(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.ids[key]
	return id, ok
}

// remember records that the conversation whose digest is key belongs to
// session.
func (c *conversations) remember(key, session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.ids[key]; !ok {
		c.order = append(c.order, key)
	}
	c.ids[key] = session
	for len(c.order) > c.max {
		delete(c.ids, c.order[0])
		c.order = c.order[1:]
	}
}

// following is how a door request's session was found, and what to
// remember once it is answered.
type following struct {
	convs *conversations
	// turns is the conversation with this turn answered; nil: nothing
	// to remember.
	turns func(answer string) []ctxd.Turn
	key   func(turns []ctxd.Turn) string // the conversation's digest
	who   string                         // the asker's digest (door, sigil, model, system text)
	first string                         // the conversation's first message
}

// answered remembers the conversation, with this answer, under session:
// its digest, its answers' digest, and how it opened; and the history
// the request came with (a question asked again, with a larger answer
// limit or after a failure, goes on in the same session, however the
// session came by that history).
func (f following) answered(session, answer string) {
	if f.turns != nil {
		turns := f.turns(answer)
		if len(turns) > 1 {
			f.convs.remember(f.key(turns[:len(turns)-1]), session)
		}
		f.convs.remember(f.key(turns), session)
		f.convs.remember(answersKey(f.who, turns), session)
		o := newOpening(f.who, f.first, session)
		o.answers = markAnswers(turns)
		f.convs.opened(o)
	}
}

// sessionOf is the session of a conversation: the X-Ctxd-Session header;
// for a question outside any conversation, one derived from who asks and
// what; else the session whose conversation the history continues, or a
// new one.
func (d *Doors) sessionOf(r *http.Request, door, sigil, model string, c conversation) (string, following, error) {
	if s := r.Header.Get("X-Ctxd-Session"); s != "" {
		if err := ctxd.CheckSessionID(s); err != nil {
			return "", following{}, ctxd.Errorf(ctxd.KindInvalid, "header X-Ctxd-Session: %v", err)
		}
		return s, following{}, nil
	}
	if c.Ephemeral {
		return door + "-" + conversationKey(door, sigil, model, c.System, []ctxd.Turn{{Query: c.Query}})[:20], following{}, nil
	}
	f := following{convs: d.convs,
		turns: func(answer string) []ctxd.Turn {
			return append(c.History[:len(c.History):len(c.History)], ctxd.Turn{Query: c.Query, Answer: answer})
		},
		key:   func(turns []ctxd.Turn) string { return conversationKey(door, sigil, model, c.System, turns) },
		who:   conversationKey(door, sigil, model, c.System, nil),
		first: c.Query,
	}
	if len(c.History) > 0 {
		f.first = c.History[0].Query
		if id, ok := d.convs.find(f.key(c.History)); ok {
			return id, f, nil
		}
		if id, ok := d.convs.rewritten(f.who, c.History); ok {
			return id, f, nil
		}
	}
	b := make([]byte, 10)
	_, _ = rand.Read(b)
	return door + "-" + hex.EncodeToString(b), f, nil
}

// answerAsSent is an answer as its client holds it, and sends it back in
// its next request's history (see toConversation): its tool calls in
// their canonical text, or its text.
func answerAsSent(text string, sum *ctxd.Summary) string {
	if len(sum.ToolCalls) > 0 {
		return toolcall.Render(sum.ToolCalls)
	}
	return text
}
