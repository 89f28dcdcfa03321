package codex

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/ctxd/ctxd"
)

// Bound bounds the tokens a vocabulary makes of a text from the text's
// length alone. For any text of n bytes (tokenized as a piece of a prompt,
// without the special tokens added at a prompt's start):
//
//	ceil(n / MaxTokenBytes) ≤ tokens ≤ n + BoundSlack
//
// for the two vocabulary kinds llama.cpp tokenizes without normalizing
// (SentencePiece "llama" and byte-level BPE "gpt2"; llamatok states the
// longest token for those only). The upper bound holds because every byte
// becomes at most one token (byte fallback; byte-level BPE), plus the one
// space SentencePiece puts before a text. The lower bound because no token
// stands for more bytes of text than its own text in the vocabulary has
// (SentencePiece writes a space as the 3-byte "▁", BPE a byte as a 1- or
// 2-byte character, byte tokens as "<0x41>"). Text that looks like a
// special token is escaped before it is counted, and escaping only adds
// bytes. n is the length of the text counted: for a file, after redaction.
// The bound is tested on both vocabulary kinds with adversarial text
// (TestBoundHolds). The decision uses the lower bound; the upper one is
// why counting can stop early only from below.
type Bound struct {
	MaxTokenBytes int // the longest token's text in the vocabulary, in bytes
}

// BoundSlack is the most tokens a text has beyond one per byte.
const BoundSlack = 1

// Lower is the fewest tokens n bytes can be.
func (b Bound) Lower(n int64) int64 {
	if b.MaxTokenBytes <= 0 || n <= 0 {
		return 0
	}
	return (n + int64(b.MaxTokenBytes) - 1) / int64(b.MaxTokenBytes)
}

// Upper is the most tokens n bytes can be.
func (b Bound) Upper(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return n + BoundSlack
}

// Count counts files exactly, in path order, with the cache's counts
// where it has them, until over returns true for the running total; it
// reports whether it stopped early. over sees the exact tokens of the
// files counted so far and the bytes of those not yet counted that bound
// their tokens from below: a redacted file's content is shorter than the
// file (a private key becomes a short marker), so it bounds nothing until
// counted. Counts are kept in the codex and the cache.
func (c *Codex) Count(ctx context.Context, counter Counter, cache *Cache, over func(exact, restBytes int64) bool) (bool, error) {
	var exact, rest int64
	for _, f := range c.Files {
		switch {
		case f.Counted:
			exact += int64(f.Tokens)
		case len(f.Redactions) == 0:
			rest += f.Size
		}
	}
	defer c.sumTokens()
	for i := range c.Files {
		f := &c.Files[i]
		if f.Counted {
			continue
		}
		if over(exact, rest) {
			return true, nil
		}
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("codex: counting cancelled: %w", err)
		}
		n, err := c.countFile(i, counter, cache)
		if err != nil {
			return false, err
		}
		f.Tokens, f.Counted = n, true
		exact += int64(n)
		if len(f.Redactions) == 0 {
			rest -= f.Size
		}
	}
	return over(exact, rest), nil
}

// countFile counts file i's content.
func (c *Codex) countFile(i int, counter Counter, cache *Cache) (int, error) {
	f := &c.Files[i]
	s, err := c.Content(i)
	if err != nil {
		return 0, err
	}
	n, err := counter.CountText(s)
	if err != nil {
		return 0, ctxd.Errorf(ctxd.KindInternal, "codex: count tokens of %s: %w", f.Path, err)
	}
	cache.setTokens(f.sum, c.redact, n)
	return n, nil
}

// Counts are exact token counts of a codex's files, by index, as CountAll
// finds them.
type Counts struct {
	Tokens  []int // by file index; -1: not counted (yet)
	Exact   int64 // sum of the counted
	Counted int   // files counted
	Bytes   int64 // bytes counted
}

// CountAll counts every file the codex has not counted, with workers
// goroutines (1: on the calling goroutine, whose thread the caller may
// have set to a low priority), without modifying the codex (it is shared by then): the
// counts go to the cache and, as they come, to progress. It is how the
// whole-tree totals are found in the background. A cancelled ctx stops it
// (the counts so far stay in the cache).
func (c *Codex) CountAll(ctx context.Context, counter Counter, cache *Cache, workers int, progress func(Counts)) (Counts, error) {
	out := Counts{Tokens: make([]int, len(c.Files))}
	var todo []int
	for i, f := range c.Files {
		out.Tokens[i] = -1
		if f.Counted {
			out.Tokens[i] = f.Tokens
			out.Exact += int64(f.Tokens)
			out.Counted++
			out.Bytes += f.Size
			continue
		}
		if ce, ok := cache.get(f.sum, c.redact); ok && ce.Counted {
			out.Tokens[i] = ce.Tokens
			out.Exact += int64(ce.Tokens)
			out.Counted++
			out.Bytes += f.Size
			continue
		}
		todo = append(todo, i)
	}
	if progress != nil {
		progress(out)
	}
	var mu sync.Mutex
	err := parallel(ctx, len(todo), min(workers, runtime.GOMAXPROCS(0)), func(j int) error {
		i := todo[j]
		n, err := c.countFile(i, counter, cache)
		if err != nil {
			return err
		}
		mu.Lock()
		out.Tokens[i] = n
		out.Exact += int64(n)
		out.Counted++
		out.Bytes += c.Files[i].Size
		snapshot := out
		mu.Unlock()
		if progress != nil {
			progress(snapshot)
		}
		return nil
	})
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("codex: counting cancelled: %w", err)
	}
	return out, err
}
