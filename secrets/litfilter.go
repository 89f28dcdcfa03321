package secrets

import (
	"regexp/syntax"
	"strings"
)

// litFilter is a necessary condition for a pattern to match a text, in
// terms of the literal strings the text holds (ignoring case), as RE2's
// prefilter has it: a match of "key[_.-]?(?:alias|id)" needs "key" and
// one of "alias" and "id". It spares allowlists' patterns — long
// alternatives of words, the slowest of all to run — on the findings they
// cannot excuse.
type litFilter struct {
	words *keywordMatcher
	root  *filterNode
	n     int // len(words)
}

type filterOp int

const (
	filterAll filterOp = iota // holds of any text
	filterLit                 // the text holds word lit
	filterAnd
	filterOr
)

type filterNode struct {
	op   filterOp
	lit  int // word id, for filterLit
	subs []*filterNode
}

// newLitFilter builds the filter of a pattern, or nil if it says nothing
// (some match needs no literal of two bytes or more).
func newLitFilter(expr string) *litFilter {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil
	}
	f := &litFilter{}
	var words []string
	ids := map[string]int{}
	var build func(re *syntax.Regexp) *filterNode
	build = func(re *syntax.Regexp) *filterNode {
		all := &filterNode{op: filterAll}
		switch re.Op {
		case syntax.OpLiteral:
			s := string(re.Rune)
			if len(s) < 2 || !isASCII(s) {
				return all
			}
			s = strings.ToLower(s)
			id, ok := ids[s]
			if !ok {
				id = len(words)
				ids[s] = id
				words = append(words, s)
			}
			return &filterNode{op: filterLit, lit: id}
		case syntax.OpCapture, syntax.OpPlus:
			return build(re.Sub[0])
		case syntax.OpRepeat:
			if re.Min >= 1 {
				return build(re.Sub[0])
			}
			return all
		case syntax.OpConcat:
			n := &filterNode{op: filterAnd}
			for _, s := range re.Sub {
				if c := build(s); c.op != filterAll {
					n.subs = append(n.subs, c)
				}
			}
			if len(n.subs) == 0 {
				return all
			}
			return n
		case syntax.OpAlternate:
			n := &filterNode{op: filterOr}
			for _, s := range re.Sub {
				c := build(s)
				if c.op == filterAll {
					return all
				}
				n.subs = append(n.subs, c)
			}
			return n
		}
		return all
	}
	f.root = build(re)
	if f.root.op == filterAll {
		return nil
	}
	f.words, f.n = newKeywordMatcher(words), len(words)
	return f
}

// mayMatch reports whether the pattern may match s.
func (f *litFilter) mayMatch(s string) bool {
	var buf [64]bool
	present := buf[:0]
	if f.n <= len(buf) {
		present = buf[:f.n]
	} else {
		present = make([]bool, f.n)
	}
	f.words.scan(s, func(_, id int) { present[id] = true })
	return f.root.eval(present)
}

func (n *filterNode) eval(present []bool) bool {
	switch n.op {
	case filterLit:
		return present[n.lit]
	case filterAnd:
		for _, s := range n.subs {
			if !s.eval(present) {
				return false
			}
		}
		return true
	case filterOr:
		for _, s := range n.subs {
			if s.eval(present) {
				return true
			}
		}
		return false
	}
	return true
}
