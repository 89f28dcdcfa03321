package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sqlite"
)

// measured is a rendered prompt, its tokens and the governor's view of it.
type measured struct {
	governor.Measure
	Tokens []int
}

var hashSeed = maphash.MakeSeed()

// measure renders rc and counts its tokens: the whole prompt exactly, and
// each block on its own (cached by content, so the codex is counted once).
func (o *Orchestrator) measure(rc *runcontext.RunContext, session string) (measured, error) {
	r := runcontext.Render(rc)
	tokens, prefix, err := o.tokenizeLocked(r, session)
	if err != nil {
		return measured{}, fmt.Errorf("orchestrator: count prompt tokens: %w", err)
	}
	m := measured{Measure: governor.Measure{Rendered: r, PromptTokens: len(tokens), KVBytes: o.cfg.KVBytes}, Tokens: tokens}
	// The stable blocks were counted with their prefix, once; the query is
	// counted on its own; the conversation is what remains of the prompt's
	// count, so the largest changing block is not tokenized twice.
	copy(m.BlockTokens[:runcontext.BlockState], prefix.blocks[:])
	if m.BlockTokens[runcontext.BlockQuery], err = o.countLocked(r.Blocks[runcontext.BlockQuery]); err != nil {
		return measured{}, err
	}
	m.BlockTokens[runcontext.BlockState] = max(0, len(tokens)-len(prefix.tokens)-m.BlockTokens[runcontext.BlockQuery])
	return m, nil
}

// prefixTokens are the tokens of a prompt's stable blocks (identity to
// karma), and whether splitting there is known to tokenize like the whole.
type prefixTokens struct {
	tokens     []int
	blocks     [runcontext.BlockState]int // each stable block's own count
	verified   bool
	splittable bool
}

// anchor ends every stable prefix (each block ends with a blank line). The
// tail is tokenized after it, so it starts as it would in the whole prompt.
const anchor = "\n\n"

// tokenizeLocked tokenizes a rendered prompt. The stable blocks are
// tokenized once per content and reused; only the conversation and the
// query are tokenized per request. The first use of each prefix checks the
// split against tokenizing the whole prompt, and a tokenizer for which the
// two differ gets whole prompts from then on: counts stay exact.
func (o *Orchestrator) tokenizeLocked(r runcontext.Rendered, session string) (ids []int, prefix *prefixTokens, err error) {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	for _, b := range r.Blocks[:runcontext.BlockState] {
		h.WriteString(b)
		h.WriteByte(0)
	}
	key := h.Sum64()
	e := o.prefixes[key]
	if e == nil {
		full := r.Prompt()
		pre, err := o.tok.Tokenize(full[:r.Offset(runcontext.BlockState)])
		if err != nil {
			return nil, nil, err
		}
		e = &prefixTokens{tokens: pre}
		for k := range runcontext.BlockState {
			if e.blocks[k], err = o.countLocked(r.Blocks[k]); err != nil {
				return nil, nil, err
			}
		}
		if len(o.prefixes) >= 16 {
			clear(o.prefixes) // environment bands and sigils make few distinct prefixes
		}
		o.prefixes[key] = e
	}
	if o.wholeOnly || (e.verified && !e.splittable) {
		ids, err = o.tok.Tokenize(r.Prompt())
		return ids, e, err
	}
	tail, err := o.sessionTail(session, r.Blocks[runcontext.BlockState]+r.Blocks[runcontext.BlockQuery])
	if err != nil {
		return nil, nil, err
	}
	ids = make([]int, 0, len(e.tokens)+len(tail))
	ids = append(append(ids, e.tokens...), tail...)
	if !e.verified {
		whole, err := o.tok.Tokenize(r.Prompt())
		if err != nil {
			return nil, nil, err
		}
		e.verified, e.splittable = true, slices.Equal(whole, ids)
		if !e.splittable {
			o.log.Info("this tokenizer merges across the stable prefix; counting whole prompts for it", "prefix_tokens", len(e.tokens))
		}
		return whole, e, nil
	}
	return ids, e, nil
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
func (o *Orchestrator) sessionTail(session, tail string) ([]int, error) {
	prev, ok := o.tails[session]
	if session != "" && ok && !o.noTailCache && strings.HasSuffix(prev.text, "\n") && strings.HasPrefix(tail, prev.text) {
		add, err := o.afterAnchor("\n", tail[len(prev.text):])
		if err != nil {
			return nil, err
		}
		if add != nil {
			ids := append(slices.Clip(prev.ids), add...)
			c := tailCache{text: tail, ids: ids, extends: prev.extends + 1}
			if c.extends >= tailCheckEvery {
				whole, err := o.tailTokens(tail)
				if err != nil {
					return nil, err
				}
				if !slices.Equal(whole, ids) {
					o.log.Info("this tokenizer merges across turns; tokenizing whole conversations from now on")
					o.noTailCache = true
					ids = whole
				}
				c = tailCache{text: tail, ids: ids}
			}
			o.rememberTail(session, c)
			return ids, nil
		}
	}
	ids, err := o.tailTokens(tail)
	if err != nil {
		return nil, err
	}
	if session != "" {
		o.rememberTail(session, tailCache{text: tail, ids: ids})
	}
	return ids, nil
}

func (o *Orchestrator) rememberTail(session string, c tailCache) {
	if len(o.tails) >= 1024 {
		clear(o.tails)
	}
	o.tails[session] = c
}

// tailTokens tokenizes the text after a stable prefix, as it tokenizes
// there: after the anchor the prefix ends with, whose own tokens are then
// dropped. If the anchor's tokens do not lead (the tokenizer merged across
// it) it returns none, and the whole-prompt check finds the difference.
func (o *Orchestrator) tailTokens(tail string) ([]int, error) {
	return o.afterAnchor(anchor, tail)
}

// afterAnchor tokenizes text as it tokenizes after the anchor: the two are
// tokenized together and the anchor's own tokens dropped. It returns nil if
// they do not lead (the tokenizer merged across the anchor).
func (o *Orchestrator) afterAnchor(anchor, text string) ([]int, error) {
	a, err := o.tok.TokenizeText(anchor)
	if err != nil {
		return nil, err
	}
	ids, err := o.tok.TokenizeText(anchor + text)
	if err != nil {
		return nil, err
	}
	if len(ids) < len(a) || !slices.Equal(ids[:len(a)], a) {
		return nil, nil
	}
	return ids[len(a):], nil
}

// countLocked counts the tokens of a piece of text without the special
// tokens the tokenizer adds to every text.
func (o *Orchestrator) countLocked(text string) (int, error) {
	if o.bos < 0 {
		ids, err := o.tok.Tokenize("")
		if err != nil {
			return 0, fmt.Errorf("orchestrator: count tokens: %w", err)
		}
		o.bos = len(ids)
	}
	h := maphash.String(hashSeed, text)
	if n, ok := o.blockCache[h]; ok {
		return n, nil
	}
	ids, err := o.tok.Tokenize(text)
	if err != nil {
		return 0, fmt.Errorf("orchestrator: count tokens: %w", err)
	}
	if len(o.blockCache) > 4096 {
		clear(o.blockCache) // state and query blocks change every turn; keep the map bounded
	}
	n := max(0, len(ids)-o.bos)
	o.blockCache[h] = n
	return n, nil
}

// compact applies the message depth: once the history passes max_depth it
// is cut to the low mark in one step and a new epoch begins.
func (o *Orchestrator) compact(ctx context.Context, id string, sess *sqlite.Session, rc *runcontext.RunContext) (governor.Action, bool, error) {
	c := o.cfg.Limits.Compact(sess.Turns)
	if !c.Compacted() {
		return governor.Action{}, false, nil
	}
	dropped := 0
	for _, i := range c.Dropped {
		n, err := o.countLocked(runcontext.RenderQuery(sess.Turns[i].Query, sess.Turns[i].Excerpts) + runcontext.RenderAnswer(sess.Turns[i].Answer))
		if err != nil {
			return governor.Action{}, false, err
		}
		dropped += n
	}
	before := len(sess.Turns)
	if err := o.newEpoch(ctx, id, sess, c.Keep, sess.Summary); err != nil {
		return governor.Action{}, false, err
	}
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := governor.Action{
		Kind:         "compact",
		Reason:       fmt.Sprintf("history of %d turns passed max_depth %d; cut to %d in one step", before, o.cfg.Limits.MaxDepth, len(c.Keep)),
		TurnsDropped: len(c.Dropped), TokensDropped: dropped, Epoch: sess.Epoch,
	}
	o.log.Info("compacted history", "session", id, "epoch", act.Epoch, "turns_dropped", act.TurnsDropped, "tokens_dropped", act.TokensDropped, "reason", act.Reason)
	return act, true, nil
}

// newEpoch stores a new epoch holding the turns at keep and summary, and
// updates sess to match.
func (o *Orchestrator) newEpoch(ctx context.Context, id string, sess *sqlite.Session, keep []int, summary string) error {
	seqs := make([]int64, len(keep))
	turns := make([]runcontext.Turn, len(keep))
	for j, i := range keep {
		seqs[j], turns[j] = sess.Seqs[i], sess.Turns[i]
	}
	epoch, err := o.store.NewEpoch(ctx, id, seqs, summary, o.cfg.Now())
	if err != nil {
		return fmt.Errorf("orchestrator: %w", err)
	}
	sess.Epoch, sess.Summary, sess.Turns, sess.Seqs = epoch, summary, turns, seqs
	o.cacheSession(*sess)
	return nil
}

// condenseInstruction asks the backend for the summary that replaces the
// prunable history.
const condenseInstruction = "Condense the conversation above into a short summary. Keep every fact, name, number and decision; drop greetings and repetition."

// condense makes room when a request is still too large after compaction:
// the prunable (not pinned) turns and any earlier summary are summarized by
// the backend in a separate call, and the summary, stored with a new epoch,
// replaces them. If even the summarizing prompt does not fit, the oldest
// prunable turns are dropped from it first, and that is reported as well.
func (o *Orchestrator) condense(ctx context.Context, id string, sess *sqlite.Session, rc *runcontext.RunContext) ([]governor.Action, error) {
	var prunable, pinned []int
	for i, t := range sess.Turns {
		if t.Verbatim {
			pinned = append(pinned, i)
		} else {
			prunable = append(prunable, i)
		}
	}
	if len(prunable) == 0 {
		return nil, nil // nothing the governor may touch: the request is refused as it is
	}
	crc := *rc
	crc.Query = runcontext.Query{Text: condenseInstruction}
	var actions []governor.Action
	var m measured
	skip := 0
	for ; ; skip++ {
		turns := make([]runcontext.Turn, 0, len(prunable)-skip)
		for _, i := range prunable[skip:] {
			turns = append(turns, sess.Turns[i])
		}
		crc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: turns}
		var err error
		if m, err = o.measure(&crc, ""); err != nil {
			return nil, err
		}
		if _, err := o.cfg.Limits.Check(m.Measure); err == nil {
			if skip > 0 {
				actions = append(actions, governor.Action{
					Kind:         "prune",
					Reason:       fmt.Sprintf("even the summarizing prompt did not fit; the oldest %d turns were left out of the summary", skip),
					TurnsDropped: skip,
				})
			}
			break
		}
		if skip == len(prunable) {
			return nil, nil // the stable blocks and the query alone do not fit: condensing cannot help
		}
	}
	gen, err := o.backend.Generate(ctx, GenerateRequest{
		Prompt: m.Rendered.Prompt(), MaxTokens: o.cfg.Limits.AnswerReserve, NumKeep: len(m.Tokens),
		Stop: []string{runcontext.StopSequence},
	}, func(string) error { return nil })
	if err != nil {
		o.slots.Forget(o.cfg.Slot)
		return nil, fmt.Errorf("orchestrator: condense history: %w", err)
	}
	o.slots.Record(o.cfg.Slot, m.Tokens)
	summary := strings.TrimSpace(gen.Text)
	if summary == "" {
		return nil, errors.New("orchestrator: condense history: the backend returned an empty summary")
	}
	dropped := m.BlockTokens[runcontext.BlockState]
	if err := o.newEpoch(ctx, id, sess, pinned, summary); err != nil {
		return nil, err
	}
	rc.State = runcontext.State{Epoch: sess.Epoch, Summary: sess.Summary, Turns: sess.Turns}
	act := governor.Action{
		Kind:         "condense",
		Reason:       fmt.Sprintf("the request did not fit; %d prunable turns were summarized by the backend (%d tokens)", len(prunable), gen.EvalCount),
		TurnsDropped: len(prunable) - skip, TokensDropped: dropped, Epoch: sess.Epoch,
	}
	o.log.Info("condensed history", "session", id, "epoch", act.Epoch, "turns", act.TurnsDropped, "state_tokens_before", dropped)
	return append(actions, act), nil
}

// describe lists actions for an error message.
func describe(actions []governor.Action) string {
	parts := make([]string, len(actions))
	for i, a := range actions {
		parts[i] = a.Kind + ": " + a.Reason
	}
	return strings.Join(parts, "; ")
}

// LastSummary is the summary of the last answered request, for status.
func (o *Orchestrator) LastSummary() *Summary {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastBudget
}
