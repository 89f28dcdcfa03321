package modelgen

import (
	"cmp"
	"slices"
	"strings"
	"unicode/utf8"
)

// pair is two adjacent symbols that a merge joins.
type pair struct{ a, b string }

// word is one pre-tokenized corpus word as a symbol sequence, with its count.
type word struct {
	syms  []string
	count int
}

// trainMerges learns up to n BPE merges from words. Ties break on the
// symbols themselves so the result is the same on every machine. Pair
// counts are kept incrementally: a merge only revisits the words that hold
// the merged pair.
func trainMerges(words []word, n int) []pair {
	counts := map[pair]int{}
	where := map[pair]map[int]struct{}{}
	addWord := func(wi, sign int) {
		w := words[wi]
		for i := 0; i+1 < len(w.syms); i++ {
			p := pair{w.syms[i], w.syms[i+1]}
			counts[p] += sign * w.count
			if sign > 0 {
				if where[p] == nil {
					where[p] = map[int]struct{}{}
				}
				where[p][wi] = struct{}{}
			}
		}
	}
	for wi := range words {
		addWord(wi, 1)
	}
	merges := make([]pair, 0, n)
	for len(merges) < n {
		best, bestN := pair{}, 0
		for p, c := range counts {
			if c > bestN || (c == bestN && cmpPair(p, best) < 0) {
				best, bestN = p, c
			}
		}
		if bestN < 2 {
			break
		}
		merges = append(merges, best)
		joined := best.a + best.b
		affected := make([]int, 0, len(where[best]))
		for wi := range where[best] {
			affected = append(affected, wi)
		}
		slices.Sort(affected)
		for _, wi := range affected {
			addWord(wi, -1)
			s := words[wi].syms
			out := make([]string, 0, len(s))
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best.a && s[i+1] == best.b {
					out = append(out, joined)
					i++
					continue
				}
				out = append(out, s[i])
			}
			words[wi].syms = out
			addWord(wi, 1)
		}
		delete(counts, best)
		delete(where, best)
		for p, c := range counts {
			if c <= 0 {
				delete(counts, p)
			}
		}
	}
	return merges
}

func cmpPair(x, y pair) int {
	if c := cmp.Compare(x.a, y.a); c != 0 {
		return c
	}
	return cmp.Compare(x.b, y.b)
}

// countWords splits text with split and counts each distinct word, in a
// deterministic order.
func countWords(text string, split func(string) []string, symbols func(string) []string) []word {
	counts := map[string]int{}
	for _, w := range split(text) {
		counts[w]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	words := make([]word, 0, len(keys))
	for _, k := range keys {
		words = append(words, word{syms: symbols(k), count: counts[k]})
	}
	return words
}

// utf8Symbols splits s into its characters.
func utf8Symbols(s string) []string {
	out := make([]string, 0, utf8.RuneCountInString(s))
	for _, r := range s {
		out = append(out, string(r))
	}
	return out
}

// spmSplit pre-tokenizes like SentencePiece: spaces become "▁" and start
// a word; newlines and tabs stand alone.
func spmSplit(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		for _, f := range strings.Fields(line) {
			out = append(out, "▁"+f)
		}
	}
	return out
}

// gpt2Split pre-tokenizes roughly like GPT-2: words keep their leading
// space, mapped through the byte-to-unicode table.
func gpt2Split(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		for i, f := range strings.Fields(line) {
			if i > 0 {
				f = " " + f
			}
			out = append(out, byteEncode(f))
		}
	}
	return out
}

var byteToRune, runeToByte = gpt2ByteTable()

// gpt2ByteTable is GPT-2's reversible byte-to-unicode mapping: printable
// bytes map to themselves, the rest to code points from 256 up.
func gpt2ByteTable() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := map[rune]byte{}
	n := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}

func byteEncode(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}
