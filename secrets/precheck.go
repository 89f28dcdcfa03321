package secrets

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
)

// A precheck is a necessary condition for a match of a rule through the
// keyword found at text[start:end], much cheaper than the rule's pattern:
// where it fails (-1), no window opens. Where it passes it returns 0, or
// the end of the window if it knows a match ends before the rule's reach.
// Most keywords are common words (key, token, auth) or fragments (ey, sk);
// the prechecks are what lets the patterns run on a small part of a
// source tree.
type precheck func(text string, start, end int) int

// derivePrecheck finds a precheck for a gitleaks rule from its pattern,
// or returns nil. Two shapes are recognised:
//
//   - a pattern whose matches begin with one of a few literals, each with
//     a keyword as prefix (ghp_, xoxb-, "ey" after \b): the match begins
//     at a keyword, so the text there must begin with the literal, and
//     go on with as many characters as what follows the literal in the
//     pattern can match at least (17 letters and digits after "ey");
//   - gitleaks' generic template, a name holding the keyword, an
//     assignment and a value (generic-api-key and 95 others): the keyword
//     must be followed, within a few name characters and quotes, by an
//     assignment operator, and that by a run of the value's characters as
//     long as the shortest value; and the value cannot hold a line break,
//     so the match ends on the line the value begins on.
//
// The template's precheck and anchoring need the name to begin with a
// keyword wherever it matches (generic-api-key's
// access|auth|key|passw(?:or)?d|…). Such a rule is also given its pattern
// anchored at the keyword, without the lazy run of name characters before
// it: one cheap attempt at each keyword that passes the precheck instead
// of a search of its line.
func derivePrecheck(expr string, keywords []string) (pre precheck, anchored *regexp.Regexp) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil, nil
	}
	if ls, ok := leadsOf(re); ok && ledByKeywords(ls, keywords) {
		return leadPrecheck(ls), nil
	}
	i := strings.Index(expr, assignTemplate)
	if i < 0 || !strings.HasPrefix(expr, templatePrefix) || re.Op == syntax.OpAlternate {
		return nil, nil
	}
	g := captureAfter(re, strings.Count(expr[:i], "(")-strings.Count(expr[:i], "(?")-strings.Count(expr[:i], `\(`))
	if g == nil {
		return nil, nil
	}
	// The precheck looks for the assignment after the keyword: sound only
	// if the name begins with a keyword wherever it matches (not so for
	// new-relic-user-api-key, whose keyword is in its value).
	name, err := syntax.Parse("(?i)(?:"+expr[len(templatePrefix):i], syntax.Perl)
	if err != nil {
		return nil, nil
	}
	if ps, ok := prefixes(name, 64); !ok || !allLedByKeywords(ps, keywords) {
		return nil, nil
	}
	value := byteSet(g)
	terminated := strings.HasSuffix(expr, templateEnd)
	for _, c := range []byte(templateEndBytes) {
		terminated = terminated && !value[c]
	}
	anchored, _ = regexp.Compile("(?i)^" + expr[len(templatePrefix)-len("(?:"):])
	return assignPrecheck(value, minWidth(g), terminated), anchored
}

// templateLazyPrefix is how many name characters the template's lazy
// prefix may take before the keyword.
const templateLazyPrefix = 50

// prefix is a string every match of a pattern begins with (in lower
// case); complete: the match is the string.
type prefix struct {
	s        string
	complete bool
}

// prefixes returns strings of which every match of re begins with one,
// following literals, small character classes, optional parts and
// alternatives, and at most max of them.
func prefixes(re *syntax.Regexp, max int) ([]prefix, bool) {
	switch re.Op {
	case syntax.OpLiteral:
		return []prefix{{strings.ToLower(string(re.Rune)), true}}, true
	case syntax.OpCharClass:
		var ps []prefix
		for i := 0; i+1 < len(re.Rune); i += 2 {
			for c := re.Rune[i]; c <= re.Rune[i+1]; c++ {
				if len(ps) >= 8 || c >= 0x80 {
					return []prefix{{"", false}}, true
				}
				p := prefix{strings.ToLower(string(c)), true}
				if !slices.Contains(ps, p) {
					ps = append(ps, p)
				}
			}
		}
		return ps, true
	case syntax.OpCapture:
		return prefixes(re.Sub[0], max)
	case syntax.OpQuest:
		ps, ok := prefixes(re.Sub[0], max)
		return append(ps, prefix{"", true}), ok
	case syntax.OpEmptyMatch, syntax.OpWordBoundary, syntax.OpNoWordBoundary, syntax.OpBeginText, syntax.OpBeginLine:
		return []prefix{{"", true}}, true
	case syntax.OpAlternate:
		var all []prefix
		for _, s := range re.Sub {
			ps, ok := prefixes(s, max)
			if !ok {
				return nil, false
			}
			all = append(all, ps...)
		}
		return all, len(all) <= max
	case syntax.OpConcat:
		ps := []prefix{{"", true}}
		for _, s := range re.Sub {
			next, ok := prefixes(s, max)
			if !ok {
				return nil, false
			}
			var out []prefix
			for _, p := range ps {
				if !p.complete {
					out = append(out, p)
					continue
				}
				for _, n := range next {
					out = append(out, prefix{p.s + n.s, n.complete})
				}
			}
			if len(out) > max {
				return nil, false
			}
			ps = out
		}
		return ps, true
	}
	return []prefix{{"", false}}, true
}

// allLedByKeywords reports whether each prefix begins with a keyword.
func allLedByKeywords(ps []prefix, keywords []string) bool {
	for _, p := range ps {
		ok := false
		for _, k := range keywords {
			ok = ok || k != "" && strings.HasPrefix(p.s, k)
		}
		if !ok {
			return false
		}
	}
	return len(ps) > 0
}

// The generic template, as gitleaks' generator writes it: a name with the
// keyword, up to 20 more name characters, up to 3 blanks or quotes, an
// operator, up to 5 blanks, quotes or '=', the value in group 1.
const (
	templatePrefix = `(?i)[\w.-]{0,50}?(?:`
	assignTemplate = `(?:[ \t\w.-]{0,20})[\s'"]{0,3}(?:=|>|:{1,3}=|\|\||:|=>|\?=|,)[\x60'"\s=]{0,5}(`
	// What ends the template's value: a quote, blank space, ';', an
	// escaped line break or the end of the text.
	templateEnd      = `(?:[\x60'"\s;]|\\[nr]|$)`
	templateEndBytes = "`'\"\t\n\v\f\r ;\\"
)

// lead is a literal every match begins with.
type lead struct {
	s      string
	fold   bool // compared ignoring case
	wordAt bool // preceded by \b
	// After s, at least runMin bytes of run (nil: nothing known).
	run    *[256]bool
	runMin int
}

// leadsOf returns the literals a match of re must begin with.
func leadsOf(re *syntax.Regexp) ([]lead, bool) {
	switch re.Op {
	case syntax.OpCapture:
		return leadsOf(re.Sub[0])
	case syntax.OpLiteral:
		return []lead{{s: string(re.Rune), fold: re.Flags&syntax.FoldCase != 0}}, true
	case syntax.OpConcat:
		subs := re.Sub
		wb := false
		if len(subs) > 1 && subs[0].Op == syntax.OpWordBoundary {
			wb, subs = true, subs[1:]
		}
		ls, ok := leadsOf(subs[0])
		if !ok {
			return nil, false
		}
		if len(ls) == 1 && subs[0].Op == syntax.OpLiteral {
			// Extend with the literals that follow, then say what the
			// next element needs.
			rest := subs[1:]
			for len(rest) > 0 && rest[0].Op == syntax.OpLiteral && (rest[0].Flags&syntax.FoldCase != 0) == ls[0].fold {
				ls[0].s += string(rest[0].Rune)
				rest = rest[1:]
			}
			if len(rest) > 0 {
				if n := minWidth(rest[0]); n > 0 {
					ls[0].run, ls[0].runMin = byteSet(rest[0]), n
				}
			}
		}
		for i := range ls {
			ls[i].wordAt = ls[i].wordAt || wb
		}
		return ls, true
	case syntax.OpAlternate:
		var all []lead
		for _, s := range re.Sub {
			ls, ok := leadsOf(s)
			if !ok {
				return nil, false
			}
			all = append(all, ls...)
		}
		return all, true
	}
	return nil, false
}

// ledByKeywords reports whether every lead begins with a keyword, so that
// a match begins where a keyword is found.
func ledByKeywords(ls []lead, keywords []string) bool {
	for _, l := range ls {
		if l.s == "" || !isASCII(l.s) {
			return false
		}
		ok := false
		for _, k := range keywords {
			if k != "" && len(k) <= len(l.s) && strings.EqualFold(l.s[:len(k)], k) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func leadPrecheck(ls []lead) precheck {
	return func(text string, start, _ int) int {
		rest := text[start:]
	next:
		for _, l := range ls {
			if len(rest) < len(l.s)+l.runMin {
				continue
			}
			if l.fold && !strings.EqualFold(rest[:len(l.s)], l.s) || !l.fold && rest[:len(l.s)] != l.s {
				continue
			}
			if l.wordAt && start > 0 && isWordByte(text[start-1]) == isWordByte(text[start]) {
				continue
			}
			if l.run != nil {
				for i := len(l.s); i < len(l.s)+l.runMin; i++ {
					if !l.run[rest[i]] {
						continue next
					}
				}
			}
			return 0
		}
		return -1
	}
}

func isWordByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// assignPrecheck is the precheck of the generic template: after the
// keyword, at most 64 name characters, blanks and quotes (the rest of the
// name, 20 more, 3 blanks or quotes), an operator, and within 12 bytes of
// it a run of value characters at least minRun long; with terminated,
// where the value's characters cannot end it, a run that ends the way
// the template's value ends.
func assignPrecheck(value *[256]bool, minRun int, terminated bool) precheck {
	newlines := value['\n']
	return func(text string, _, end int) int {
		i := end
		for n := 0; i < len(text) && n < 64 && nameOrBlank[text[i]]; n++ {
			i++
		}
		if i >= len(text) || !operator[text[i]] {
			return -1
		}
		for j := i + 1; j <= i+12 && j < len(text); {
			if !value[text[j]] {
				j++
				continue
			}
			k := j
			for k < len(text) && value[text[k]] {
				k++
			}
			if k-j >= minRun && (!terminated || k == len(text) || strings.IndexByte(templateEndBytes, text[k]) >= 0) {
				if newlines {
					return 0
				}
				// The value begins by i+12 and holds no line break.
				return lineEndAt(text, min(i+12, len(text)-1))
			}
			j = k
		}
		return -1
	}
}

var nameOrBlank, operator = func() (n, o [256]bool) {
	for c := 0; c < 256; c++ {
		n[c] = isWordByte(byte(c)) || strings.IndexByte(".- \t\r\n\v\f'\"", byte(c)) >= 0
		o[c] = strings.IndexByte("=>:|?,", byte(c)) >= 0
	}
	return
}()

// captureAfter returns the capture group number n of re (1-based), or nil.
func captureAfter(re *syntax.Regexp, before int) *syntax.Regexp {
	var found *syntax.Regexp
	var walk func(*syntax.Regexp)
	walk = func(r *syntax.Regexp) {
		if found != nil {
			return
		}
		if r.Op == syntax.OpCapture && r.Cap == before+1 {
			found = r
			return
		}
		for _, s := range r.Sub {
			walk(s)
		}
	}
	walk(re)
	return found
}

// byteSet is the set of bytes a match of re can hold (every byte from
// 0x80 if it can hold a non-ASCII character).
func byteSet(re *syntax.Regexp) *[256]bool {
	var set [256]bool
	var walk func(*syntax.Regexp)
	addRange := func(lo, hi rune, fold bool) {
		if hi >= 0x80 {
			for c := 0x80; c < 256; c++ {
				set[c] = true
			}
			hi = 0x7f
		}
		for c := lo; c <= hi; c++ {
			set[c] = true
			if fold && 'a' <= c|0x20 && c|0x20 <= 'z' {
				set[c^0x20] = true
			}
		}
	}
	walk = func(r *syntax.Regexp) {
		switch r.Op {
		case syntax.OpLiteral:
			for _, c := range r.Rune {
				addRange(c, c, r.Flags&syntax.FoldCase != 0)
			}
		case syntax.OpCharClass:
			for i := 0; i+1 < len(r.Rune); i += 2 {
				addRange(r.Rune[i], r.Rune[i+1], false)
			}
		case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
			addRange(0, 0x10ffff, false)
		}
		for _, s := range r.Sub {
			walk(s)
		}
	}
	walk(re)
	return &set
}

// minWidth is the length in bytes of re's shortest match.
func minWidth(re *syntax.Regexp) int {
	switch re.Op {
	case syntax.OpLiteral:
		return len(string(re.Rune))
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 1
	case syntax.OpCapture, syntax.OpPlus:
		return minWidth(re.Sub[0])
	case syntax.OpRepeat:
		return re.Min * minWidth(re.Sub[0])
	case syntax.OpConcat:
		n := 0
		for _, s := range re.Sub {
			n += minWidth(s)
		}
		return n
	case syntax.OpAlternate:
		n := -1
		for _, s := range re.Sub {
			if m := minWidth(s); n < 0 || m < n {
				n = m
			}
		}
		return max(n, 0)
	}
	return 0
}

// privateKeyHeader begins the patterns of private key blocks, gitleaks'
// and ctxd's: they run only where the BEGIN line says PRIVATE KEY, not on
// certificates and public keys.
const privateKeyHeader = `(?i)-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY`

// privateKeyAt is the precheck of privateKeyHeader: after "-----BEGIN",
// at most 100 letters, digits, blanks, '_' and '-', then "PRIVATE KEY",
// in any case.
func privateKeyAt(text string, _, end int) int {
	for i := end; i <= end+100 && i < len(text); i++ {
		if len(text)-i >= len("private key") && strings.EqualFold(text[i:i+len("private key")], "private key") {
			return 0
		}
		if c := text[i]; !(isWordByte(c) || c == ' ' || c == '-') {
			return -1
		}
	}
	return -1
}
