// Package tokencount counts the tokens of rendered prompts exactly, with
// the serving model's own tokenizer, doing as little tokenizer work per
// request as exactness allows.
//
// The stable blocks (identity to karma) are tokenized once per content and
// shared by everyone who renders them: the codex service when it plans CAG
// or RAG, and every request after it. Per request only the conversation
// and the query are tokenized, and a session's next conversation only as
// far as it is new. Every shortcut is checked against tokenizing whole, and
// a tokenizer for which a shortcut is not exact loses that shortcut for
// good: counts stay exact.
//
// It is not a cache of what the backend holds (package scheduler tracks
// that) and it never talks to a backend.
package tokencount

import (
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// Counter counts prompt tokens. It is safe for concurrent use; the
// requests of one session must not run concurrently (the scheduler
// ensures it), since they extend one another's tails.
type Counter struct {
	tok ctxd.Tokenizer
	log *slog.Logger

	bosOnce sync.Once
	bos     int // tokens the tokenizer adds to any whole prompt (BOS)
	bosErr  error

	noTailCache atomic.Bool // extending tails disagreed with whole tails once
	wholeOnly   atomic.Bool // split counting disagreed with the backend: count whole prompts

	mu       sync.Mutex           // guards the maps below; never held while tokenizing
	prefixes map[uint64]*prefix   // the stable blocks' tokens, by content
	stable   map[uint64]int       // counts of stable blocks, by content
	pieces   map[uint64]int       // counts of other text (state, query, dropped turns), bounded
	tails    map[string]tailCache // each session's last conversation-and-query tokens
}

// New returns a counter over tok.
func New(tok ctxd.Tokenizer, log *slog.Logger) *Counter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Counter{
		tok: tok, log: log.With("component", "tokencount"),
		prefixes: map[uint64]*prefix{}, stable: map[uint64]int{}, pieces: map[uint64]int{}, tails: map[string]tailCache{},
	}
}

// Tokens is a prompt's tokens and each block's count.
type Tokens struct {
	IDs    []int
	Blocks [runcontext.NumBlocks]int // counted block by block: the sum can differ from len(IDs) by a token or two
	// Prefix is how many leading IDs are the stable blocks' own tokens
	// (identity to karma), the same for every prompt that renders them;
	// 0 when the tokenizer merges across the boundary.
	Prefix int
}

var hashSeed = maphash.MakeSeed()

// prefix is the tokens of a prompt's stable blocks, computed once.
type prefix struct {
	ready  chan struct{} // closed once tokens, blocks and err are set
	err    error
	tokens []int
	blocks [runcontext.BlockState]int // each stable block's own count

	check      sync.Once // compares the split with tokenizing a whole prompt, once
	checked    atomic.Bool
	splittable bool // the check agreed; set inside check
}

// anchor ends every stable prefix (each block ends with a blank line). The
// tail is tokenized after it, so it starts as it would in the whole prompt.
const anchor = "\n\n"

// Prompt tokenizes a rendered prompt exactly as the backend will. session
// names whose conversation this is ("" for a prompt of no session); its
// next prompt is then tokenized only as far as it is new.
func (c *Counter) Prompt(r runcontext.Rendered, session string) (Tokens, error) {
	var t Tokens
	p, err := c.prefix(r)
	if err != nil {
		return t, err
	}
	copy(t.Blocks[:runcontext.BlockState], p.blocks[:])
	if t.IDs, err = c.ids(r, p, session); err != nil {
		return t, fmt.Errorf("tokencount: %w", err)
	}
	// The query is counted on its own; the conversation is what remains of
	// the prompt's count, so the largest changing block is not tokenized twice.
	if t.Blocks[runcontext.BlockQuery], err = c.Text(r.Blocks[runcontext.BlockQuery]); err != nil {
		return t, err
	}
	t.Blocks[runcontext.BlockState] = max(0, len(t.IDs)-len(p.tokens)-t.Blocks[runcontext.BlockQuery])
	if len(t.IDs) >= len(p.tokens) && slices.Equal(t.IDs[:len(p.tokens)], p.tokens) {
		t.Prefix = len(p.tokens)
	}
	return t, nil
}

// Stable counts the tokens of a prompt's stable blocks (identity to karma),
// BOS included: what the CAG/RAG plan weighs. Requests that render the same
// stable blocks reuse the work.
func (c *Counter) Stable(r runcontext.Rendered) (int, error) {
	p, err := c.prefix(r)
	if err != nil {
		return 0, err
	}
	return len(p.tokens), nil
}

// WholePrompts makes the counter tokenize whole prompts from now on: the
// backend counted a prompt differently than the split counting did.
func (c *Counter) WholePrompts() {
	if !c.wholeOnly.Swap(true) {
		c.log.Warn("token count differs from the backend's; counting whole prompts from now on")
	}
}

// Forget drops what the counter holds of a session.
func (c *Counter) Forget(session string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.tails, session)
}

// prefix returns the stable blocks' tokens, computing them once per
// content however many requests ask at the same time.
func (c *Counter) prefix(r runcontext.Rendered) (*prefix, error) {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	for _, b := range r.Blocks[:runcontext.BlockState] {
		h.WriteString(b)
		h.WriteByte(0)
	}
	key := h.Sum64()
	c.mu.Lock()
	p := c.prefixes[key]
	owner := p == nil
	if owner {
		if len(c.prefixes) >= 64 {
			clear(c.prefixes) // environment bands, sigils and codex reloads make few distinct prefixes
		}
		p = &prefix{ready: make(chan struct{})}
		c.prefixes[key] = p
	}
	c.mu.Unlock()
	if !owner {
		<-p.ready
		return p, p.err
	}
	defer close(p.ready) // even if the tokenizer panics: nobody waits for ever
	p.tokens, p.err = c.tok.Tokenize(r.Prompt()[:r.Offset(runcontext.BlockState)])
	for k := range runcontext.BlockState {
		if p.err != nil {
			break
		}
		p.blocks[k], p.err = c.stableBlock(r.Blocks[k])
	}
	if p.err != nil {
		p.err = fmt.Errorf("tokencount: stable blocks: %w", p.err)
		c.mu.Lock()
		delete(c.prefixes, key) // the next request tries again
		c.mu.Unlock()
	}
	return p, p.err
}

// stableBlock counts one stable block, once per content: the codex block
// is the largest text ctxd ever counts.
func (c *Counter) stableBlock(text string) (int, error) {
	return c.cachedCount(c.stable, 64, text)
}

// ids tokenizes the whole prompt: the cached prefix, then the tail. The
// first prompt with a prefix also tokenizes whole, to check the split.
func (c *Counter) ids(r runcontext.Rendered, p *prefix, session string) ([]int, error) {
	if c.wholeOnly.Load() || (p.checked.Load() && !p.splittable) {
		return c.tok.Tokenize(r.Prompt())
	}
	tail, err := c.sessionTail(session, r.Blocks[runcontext.BlockState]+r.Blocks[runcontext.BlockQuery])
	if err != nil {
		return nil, err
	}
	ids := make([]int, 0, len(p.tokens)+len(tail))
	ids = append(append(ids, p.tokens...), tail...)
	var whole []int
	p.check.Do(func() {
		if whole, err = c.tok.Tokenize(r.Prompt()); err != nil {
			return
		}
		p.splittable = slices.Equal(whole, ids)
		p.checked.Store(true)
		if !p.splittable {
			c.log.Info("this tokenizer merges across the stable prefix; counting whole prompts for it", "prefix_tokens", len(p.tokens))
		}
	})
	switch {
	case err != nil:
		return nil, err
	case whole != nil:
		return whole, nil
	case !p.checked.Load() || !p.splittable: // the check failed, or found the split inexact
		return c.tok.Tokenize(r.Prompt())
	}
	return ids, nil
}

// tailCache is a session's last conversation-and-query text and its tokens.
type tailCache struct {
	text    string
	ids     []int
	extends int // extensions since the last full check
}

// tailCheckEvery is how often an extended tail is checked against
// tokenizing it whole.
const tailCheckEvery = 8

// sessionTail tokenizes the conversation and query of a session's prompt.
// A session's next prompt usually extends the last one's tail (by the
// answer and the new query), so only the new text is tokenized, after the
// line break the old tail ends with. Every few extensions the result is
// checked against the whole tail; a disagreement turns this off for good.
func (c *Counter) sessionTail(session, tail string) ([]int, error) {
	c.mu.Lock()
	prev, ok := c.tails[session]
	c.mu.Unlock()
	if session != "" && ok && !c.noTailCache.Load() && strings.HasSuffix(prev.text, "\n") && strings.HasPrefix(tail, prev.text) {
		add, err := c.afterAnchor("\n", tail[len(prev.text):])
		if err != nil {
			return nil, err
		}
		if add != nil {
			ids := append(slices.Clip(prev.ids), add...)
			next := tailCache{text: tail, ids: ids, extends: prev.extends + 1}
			if next.extends >= tailCheckEvery {
				whole, err := c.afterAnchor(anchor, tail)
				if err != nil {
					return nil, err
				}
				if !slices.Equal(whole, ids) {
					if !c.noTailCache.Swap(true) {
						c.log.Info("this tokenizer merges across turns; tokenizing whole conversations from now on")
					}
					ids = whole
				}
				next = tailCache{text: tail, ids: ids}
			}
			c.rememberTail(session, next)
			return ids, nil
		}
	}
	// If the anchor's tokens do not lead (the tokenizer merged across it)
	// this is nil, and the whole-prompt check finds the difference.
	ids, err := c.afterAnchor(anchor, tail)
	if err != nil {
		return nil, err
	}
	if session != "" {
		c.rememberTail(session, tailCache{text: tail, ids: ids})
	}
	return ids, nil
}

func (c *Counter) rememberTail(session string, t tailCache) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tails) >= 1024 {
		clear(c.tails)
	}
	c.tails[session] = t
}

// afterAnchor tokenizes text as it tokenizes after the anchor: the two are
// tokenized together and the anchor's own tokens dropped. It returns nil if
// they do not lead (the tokenizer merged across the anchor).
func (c *Counter) afterAnchor(anchor, text string) ([]int, error) {
	a, err := c.tok.TokenizeText(anchor)
	if err != nil {
		return nil, err
	}
	ids, err := c.tok.TokenizeText(anchor + text)
	if err != nil {
		return nil, err
	}
	if len(ids) < len(a) || !slices.Equal(ids[:len(a)], a) {
		return nil, nil
	}
	return ids[len(a):], nil
}

// Text counts the tokens of a piece of text as the tokenizer counts it on
// its own, without the special tokens a whole prompt starts with. Counts
// are cached by content, within a bound: state and query blocks change
// every turn.
func (c *Counter) Text(text string) (int, error) {
	return c.cachedCount(c.pieces, 4096, text)
}

// cachedCount counts text, looking it up in m (by content) first and
// keeping at most bound counts there.
func (c *Counter) cachedCount(m map[uint64]int, bound int, text string) (int, error) {
	h := maphash.String(hashSeed, text)
	c.mu.Lock()
	n, ok := m[h]
	c.mu.Unlock()
	if ok {
		return n, nil
	}
	n, err := c.count(text)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	if len(m) >= bound {
		clear(m)
	}
	m[h] = n
	c.mu.Unlock()
	return n, nil
}

// count counts text as the whole-prompt tokenizer does, less its BOS.
func (c *Counter) count(text string) (int, error) {
	c.bosOnce.Do(func() {
		ids, err := c.tok.Tokenize("")
		c.bos, c.bosErr = len(ids), err
	})
	if c.bosErr != nil {
		return 0, fmt.Errorf("tokencount: %w", c.bosErr)
	}
	ids, err := c.tok.Tokenize(text)
	if err != nil {
		return 0, fmt.Errorf("tokencount: %w", err)
	}
	return max(0, len(ids)-c.bos), nil
}
