package secrets

import (
	"math"
	"slices"
	"strings"
	"sync"
)

// Finding is one secret in a text.
type Finding struct {
	Rule       string // the id of the rule that found it
	Start, End int    // the secret's byte offsets in the text
	Line       int    // the line of Start, from 1
}

// Scanner finds secrets with a fixed set of rules. It is safe for
// concurrent use.
type Scanner struct {
	rules      []rule
	global     []allowlist
	keywords   *keywordMatcher
	kwRules    [][]int // keyword id -> the rules it selects
	everywhere []int   // rules without keywords
	version    string
	scratch    sync.Pool // *scratch
}

// scratch is one scan's working memory.
type scratch struct {
	windows  [][]window // per rule, in order, merged
	touched  []int      // rules with windows
	cands    []candidate
	hits     []hit
	quarters [4][]hit
}

type window struct{ start, end int }

type candidate struct {
	start, end int
	rule       int // index in rules: the lower, the more specific
}

// newScanner builds a scanner from a rule set.
func newScanner(rs ruleSet, version string) *Scanner {
	s := &Scanner{rules: rs.rules, global: rs.global, version: version}
	ids := map[string]int{}
	var kws []string
	for i, r := range s.rules {
		if len(r.keywords) == 0 {
			s.everywhere = append(s.everywhere, i)
			continue
		}
		for _, k := range r.keywords {
			id, ok := ids[k]
			if !ok {
				id = len(kws)
				ids[k] = id
				kws = append(kws, k)
				s.kwRules = append(s.kwRules, nil)
			}
			if !slices.Contains(s.kwRules[id], i) {
				s.kwRules[id] = append(s.kwRules[id], i)
			}
		}
	}
	s.keywords = newKeywordMatcher(kws)
	n := len(s.rules)
	s.scratch.New = func() any { return &scratch{windows: make([][]window, n)} }
	return s
}

var defaultScanner = sync.OnceValue(func() *Scanner {
	rs, err := parseGitleaks(gitleaksTOML)
	if err != nil {
		panic(err) // the embedded file is tested
	}
	own := ownRules()
	rs.rules = append(rs.rules, own...)
	rs.global = append(rs.global, ownAllowlists()...)
	return newScanner(rs, Version())
})

// Default is the scanner of gitleaks' default rules and ctxd's own. It is
// built on first use (a few tens of milliseconds).
func Default() *Scanner { return defaultScanner() }

var version = sync.OnceValue(func() string {
	return "gitleaks-" + gitleaksVersion + "+ctxd-" + ownRulesVersion + "+" + rulesHash()
})

// Version names the default rules: the gitleaks release they come from,
// ctxd's own rules' version and a hash of both. What was found with other
// rules must be found again.
func Version() string { return version() }

// Version is the version of the scanner's rules.
func (s *Scanner) Version() string { return s.version }

// Find returns the secrets in text, in order and not overlapping: where
// findings overlap, the one that starts first wins, then the longer, then
// the more specific rule (gitleaks' rules in their order, then its
// generic rule, then ctxd's own).
//
// A rule runs only around its keywords (found in one case-insensitive pass
// over the text) where its precheck passes: on the keyword's line and as
// many lines after it as its pattern can span (a key block: to its END
// line; on a line longer than longLine, only as far around the keyword as
// a match can reach), or anchored at the keyword. Its matches are the
// pattern's in those windows — the same as in the whole text
// (TestFindMatchesWholeText) — and each one's secret is kept if it has
// more entropy than the rule demands, passes ctxd's check and no
// allowlist, the rule's or a global one, excuses it.
func (s *Scanner) Find(text string) []Finding {
	sc := s.scratch.Get().(*scratch)
	defer s.putScratch(sc)
	s.collectWindows(text, sc)
	for _, ri := range sc.touched {
		r := &s.rules[ri]
		if r.anchored != nil {
			s.matchAnchored(text, sc.windows[ri], ri, r, sc)
			continue
		}
		for _, w := range sc.windows[ri] {
			s.matchWindow(text, w, ri, r, sc)
		}
	}
	for _, ri := range s.everywhere {
		s.matchWindow(text, window{0, len(text)}, ri, &s.rules[ri], sc)
	}
	return s.resolve(text, sc)
}

// resolve turns the candidates into findings: in order, not overlapping.
func (s *Scanner) resolve(text string, sc *scratch) []Finding {
	if len(sc.cands) == 0 {
		return nil
	}
	slices.SortFunc(sc.cands, func(a, b candidate) int {
		if a.start != b.start {
			return a.start - b.start
		}
		if a.end != b.end {
			return b.end - a.end
		}
		return a.rule - b.rule
	})
	var out []Finding
	last, line, counted := 0, 1, 0
	for _, c := range sc.cands {
		if c.start < last {
			continue // inside a finding already made
		}
		line += strings.Count(text[counted:c.start], "\n")
		counted = c.start
		out = append(out, Finding{Rule: s.rules[c.rule].id, Start: c.start, End: c.end, Line: line})
		last = c.end
	}
	return out
}

func (s *Scanner) putScratch(sc *scratch) {
	if cap(sc.hits) > 1<<20 {
		return // a huge text's: let it go
	}
	for _, ri := range sc.touched {
		sc.windows[ri] = sc.windows[ri][:0]
	}
	sc.touched = sc.touched[:0]
	sc.cands = sc.cands[:0]
	s.scratch.Put(sc)
}

// collectWindows finds the keywords and, for each rule they select whose
// precheck passes, the merged windows around them: from the start of the
// keyword's line to the end of the reach-th line after it, its line break
// included.
func (s *Scanner) collectWindows(text string, sc *scratch) {
	// The line of the last hit and the ends of the lines after it, found
	// as needed: hits come in order, often many on one line.
	lineStart, lineEnd := -1, -1
	var ends []int // ends[i]: the end of the i-th line after the hit's, its line break included
	sc.hits = s.keywords.appendHits(text, sc.hits[:0], &sc.quarters)
	for _, h := range sc.hits {
		p, id := h.start, h.id
		kwEnd := p + s.keywords.lens[id]
		for _, ri := range s.kwRules[id] {
			r := &s.rules[ri]
			preEnd := 0
			if r.pre != nil {
				if preEnd = r.pre(text, p, kwEnd); preEnd < 0 {
					continue
				}
			}
			if p >= lineEnd {
				lineStart = strings.LastIndexByte(text[:p], '\n') + 1
				lineEnd = lineEndAt(text, p)
				ends = ends[:0]
			}
			end := len(text)
			switch {
			case r.block:
				end = blockEnd(text, kwEnd)
			case preEnd > 0:
				end = max(preEnd, lineEnd)
			case r.reach >= 0:
				for len(ends) < r.reach {
					from := lineEnd
					if len(ends) > 0 {
						from = ends[len(ends)-1]
					}
					ends = append(ends, lineEndAt(text, from))
				}
				end = lineEnd
				if r.reach > 0 {
					end = ends[r.reach-1]
				}
			}
			start := lineStart
			if r.anchored != nil && !r.lineAnchored {
				start = p
			}
			if !r.block && end-lineStart > longLine {
				// A long line (minified code, data): only as far around
				// the keyword as a match can reach.
				span := r.width
				if span < 0 || span > longLine {
					span = longLine
				}
				if !r.lineAnchored {
					start = max(start, p-span)
				}
				end = min(end, kwEnd+span)
			}
			ws := sc.windows[ri]
			if len(ws) == 0 {
				sc.touched = append(sc.touched, ri)
			}
			if r.anchored == nil && len(ws) > 0 && start <= ws[len(ws)-1].end {
				last := &ws[len(ws)-1]
				last.end = max(last.end, end)
				continue
			}
			sc.windows[ri] = append(ws, window{start, end})
		}
	}
	slices.Sort(sc.touched) // rule order, for determinism of nothing but habit
}

// longLine is the length from which a line is searched only around its
// keywords, and the farthest a match of unbounded length is looked for
// from its keyword there.
const longLine = 4096

// blockEnd is where a key block that begins at i may end: the end of the
// line of the first "KEY-----" or "KEY BLOCK-----" (in any case) 64 bytes
// or more after i, or len(s).
func blockEnd(s string, i int) int {
	for i += 64; i < len(s); {
		j := strings.Index(s[i:], "-----")
		if j < 0 {
			break
		}
		j += i
		if j >= 3 && strings.EqualFold(s[j-3:j], "key") || j >= 9 && strings.EqualFold(s[j-9:j], "key block") {
			return lineEndAt(s, j)
		}
		i = j + 1
	}
	return len(s)
}

// lineEndAt is the end of the line holding s[i], just after its line
// break, or len(s).
func lineEndAt(s string, i int) int {
	if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(s)
}

// indexByteFrom is the index of the first c in s at or after i, or len(s).
func indexByteFrom(s string, i int, c byte) int {
	if j := strings.IndexByte(s[i:], c); j >= 0 {
		return i + j
	}
	return len(s)
}

// matchWindow adds the secrets rule ri finds in text[w.start:w.end].
func (s *Scanner) matchWindow(text string, w window, ri int, r *rule, sc *scratch) {
	for _, m := range r.re.FindAllStringSubmatchIndex(text[w.start:w.end], -1) {
		s.consider(text, w.start, m, w.start+m[0], ri, r, sc)
	}
}

// matchAnchored adds the secrets rule ri finds at its keywords: each
// window begins at one, and the pattern, anchored there, matches or not.
// As the unanchored pattern's matches do not overlap, a keyword inside
// the last match is passed over.
func (s *Scanner) matchAnchored(text string, ws []window, ri int, r *rule, sc *scratch) {
	slices.SortFunc(ws, func(a, b window) int { return a.start - b.start })
	last, prev := 0, -1
	for _, w := range ws {
		if w.start < last || w.start == prev {
			continue
		}
		prev = w.start
		m := r.anchored.FindStringSubmatchIndex(text[w.start:w.end])
		if m == nil {
			continue
		}
		// The name characters before the keyword, which the anchored
		// pattern leaves out, would have begun the match as far back as
		// they could reach.
		start := w.start
		for (r.prefix < 0 || start > w.start-r.prefix) && start > last && isNameByte(text[start-1]) {
			start--
		}
		if k := r.keyGroup; k > 0 && m[2*k] == 0 {
			m[2*k] = start - w.start
		}
		s.consider(text, w.start, m, start, ri, r, sc)
		last = w.start + m[1]
	}
}

// consider adds the secret of match m (offsets from off in text) if it is
// one: as gitleaks does, the secret is the rule's group, else the first
// non-empty group, else the match without surrounding line breaks; it
// must have more entropy than the rule wants, pass ctxd's check and not be
// excused by an allowlist. The match begins at matchStart.
func (s *Scanner) consider(text string, off int, m []int, matchStart, ri int, r *rule, sc *scratch) {
	ms, me := matchStart, off+m[1]
	for ms < me && text[ms] == '\n' {
		ms++
	}
	for me > ms && text[me-1] == '\n' {
		me--
	}
	ss, se := ms, me
	key := ""
	switch {
	case r.pairs:
		for g := 1; 2*g+3 < len(m); g += 2 {
			if m[2*g+2] >= 0 {
				ss, se = off+m[2*g+2], off+m[2*g+3]
				key = text[off+m[2*g] : off+m[2*g+1]]
				break
			}
		}
	case r.group > 0:
		if m[2*r.group] >= 0 {
			ss, se = off+m[2*r.group], off+m[2*r.group+1]
		}
	default:
		for g := 1; 2*g+1 < len(m); g++ {
			if g != r.keyGroup && m[2*g] >= 0 && m[2*g+1] > m[2*g] {
				ss, se = off+m[2*g], off+m[2*g+1]
				break
			}
		}
	}
	if k := r.keyGroup; k > 0 && m[2*k+1] >= 0 { // its start may be before off (matchAnchored)
		key = text[off+m[2*k] : off+m[2*k+1]]
	}
	if se <= ss {
		return
	}
	secret := text[ss:se]
	if r.entropy > 0 && entropy(secret) <= r.entropy {
		return
	}
	if r.valid != nil && !r.valid(key, secret) {
		return
	}
	line := func() string { // at most longLine around the match
		a := strings.LastIndexByte(text[max(0, ms-longLine):ms], '\n') + 1 + max(0, ms-longLine)
		return text[a:indexByteFrom(text[:min(len(text), me+longLine)], me, '\n')]
	}
	if allowed(s.global, secret, text[ms:me], line) || allowed(r.allow, secret, text[ms:me], line) {
		return
	}
	sc.cands = append(sc.cands, candidate{ss, se, ri})
}

// allowed reports whether one of the allowlists excuses a finding.
func allowed(as []allowlist, secret, match string, line func() string) bool {
	for i := range as {
		a := &as[i]
		stopOK := a.stop != nil && a.stop.contains(secret)
		if !a.and && stopOK {
			return true
		}
		if a.and && a.stop != nil && !stopOK {
			continue
		}
		if len(a.pats) == 0 {
			if a.and {
				return true // its stop words, all it has, hold
			}
			continue
		}
		t := secret
		switch a.target {
		case targetMatch:
			t = match
		case targetLine:
			t = line()
		}
		for _, p := range a.pats {
			if (p.filter == nil || p.filter.mayMatch(t)) && p.re.MatchString(t) {
				return true
			}
		}
	}
	return false
}

// entropy is the Shannon entropy of s's bytes, in bits.
func entropy(s string) float64 {
	if s == "" {
		return 0
	}
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	n := float64(len(s))
	var h float64
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}

// Redact replaces every secret in text with a marker naming its rule,
// "[REDACTED:rule]", and returns the new text and the findings (offsets
// in text as given). Without findings, text is returned as it is.
func (s *Scanner) Redact(text string) (string, []Finding) {
	found := s.Find(text)
	if len(found) == 0 {
		return text, nil
	}
	var sb strings.Builder
	sb.Grow(len(text))
	last := 0
	for _, f := range found {
		sb.WriteString(text[last:f.Start])
		sb.WriteString("[REDACTED:")
		sb.WriteString(f.Rule)
		sb.WriteString("]")
		last = f.End
	}
	sb.WriteString(text[last:])
	return sb.String(), found
}
