package runcontext

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// foldRange maps lo..hi to ascii, ascii+1, ... (step 1) or all to ascii
// (step 0).
type foldRange struct {
	lo, hi rune
	ascii  byte
	step   uint8
}

// fold is the ASCII character r reads as, if any.
func fold(r rune) (byte, bool) {
	if r < utf8.RuneSelf {
		return byte(r), true
	}
	if r >= 0xE0020 && r <= 0xE007E { // tag characters
		return byte(r - 0xE0000), true
	}
	lo, hi := 0, len(foldRanges)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if foldRanges[m].hi < r {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(foldRanges) && foldRanges[lo].lo <= r {
		f := foldRanges[lo]
		return f.ascii + byte(r-f.lo)*f.step, true
	}
	return 0, false
}

// invisible reports whether r is a format character or a combining mark:
// skipped between the characters of a marker.
func invisible(r rune) bool {
	return r >= utf8.RuneSelf && unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me)
}

// skipped reports whether r is skipped at a line start.
func skipped(r rune) bool {
	if c, ok := fold(r); ok {
		return c == ' ' || c == '\t' || c == '\\' || c < 0x20 || c == 0x7f
	}
	return invisible(r) || unicode.In(r, unicode.Zs, unicode.Cc)
}

func isBidiControl(r rune) bool { return r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 }

// hasBidiControl reports whether s holds an explicit bidi control (all
// are encoded E2 80 AA-AE or E2 81 A6-A9).
func hasBidiControl(s string) bool {
	return strings.IndexByte(s, 0xE2) >= 0 && strings.IndexFunc(s, isBidiControl) >= 0
}

// lineBreaks are the characters that break a line (\r\n is one break).
const lineBreaks = "\n\r\v\f\x1c\x1d\x1e\u0085\u2028\u2029"

// nextBreak finds the first line break at or after byte i of s: the line
// ends at end, the next starts at next; next is -1 if no break follows.
func nextBreak(s string, i int) (end, next int) {
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '\n', '\v', '\f', '\x1c', '\x1d', '\x1e':
			return j, j + 1
		case '\r':
			if j+1 < len(s) && s[j+1] == '\n' {
				return j, j + 2
			}
			return j, j + 1
		case 0xC2: // NEL is C2 85
			if j+1 < len(s) && s[j+1] == 0x85 {
				return j, j + 2
			}
		case 0xE2: // U+2028 and U+2029 are E2 80 A8 and E2 80 A9
			if j+2 < len(s) && s[j+1] == 0x80 && (s[j+2] == 0xA8 || s[j+2] == 0xA9) {
				return j, j + 3
			}
		}
	}
	return len(s), -1
}

// run counts the characters at the start of s that read as c, with
// invisible characters between them, up to max.
func run(s string, c byte, max int) int {
	n := 0
	for _, r := range s {
		if f, ok := fold(r); ok {
			if f != c {
				break
			}
			if n++; n == max {
				break
			}
		} else if !invisible(r) {
			break
		}
	}
	return n
}

// bracketWords follow a bracket at a line start in ctxd's markers.
var bracketWords = []string{"excerpt", "/excerpt", "summary", "/summary"}

// bracketMarker reports whether s starts with a bracket and one of
// bracketWords, folded, in any case, invisible characters skipped.
func bracketMarker(s string) bool {
	var word [8]byte
	n, first := 0, true
	for _, r := range s {
		c, ok := fold(r)
		switch {
		case !ok && invisible(r):
			continue
		case !ok:
		case first:
			if c != '[' {
				return false
			}
			first = false
			continue
		case n < len(word):
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			word[n] = c
			n++
			continue
		}
		break
	}
	for _, w := range bracketWords {
		if strings.HasPrefix(string(word[:n]), w) {
			return true
		}
	}
	return false
}

// skipLead is line without the characters skipped at its start.
func skipLead(line string) string {
	for i, r := range line {
		if !skipped(r) {
			return line[i:]
		}
	}
	return ""
}

// needsEscape reports whether a line (without its line break) would read
// as a marker, or could display as one.
func needsEscape(line string) bool {
	rest := skipLead(line)
	if run(rest, '#', 3) == 3 || bracketMarker(rest) {
		return true
	}
	if !hasBidiControl(line) {
		return false
	}
	return strings.IndexFunc(line, func(r rune) bool {
		c, ok := fold(r)
		return ok && (c == '#' || c == '[')
	}) >= 0
}

// mayNeedEscape is false for text that holds no character that reads as a
// number sign or a bracket: every rune that does starts with one of these
// bytes (TestFoldMatchesTheOracle checks it against the fold table).
func mayNeedEscape(s string) bool {
	return strings.IndexByte(s, '#') >= 0 || strings.IndexByte(s, '[') >= 0 ||
		strings.IndexByte(s, 0xEF) >= 0 || strings.IndexByte(s, 0xF3) >= 0
}

// Escape escapes free text that starts a line as every block escapes its
// free text, so that it cannot form ctxd's structure: a block header or a
// turn marker ("###" at a line start), or an excerpt's or a summary's
// bracket ("[excerpt", "[/excerpt", "[summary", "[/summary" at a line
// start, in any case). (A codex fence is kept from closing by its length:
// see Fence.) It reads text as leniently as a model or a normalizing
// tokenizer might:
//
//   - A line starts at the start of the text and after every line break:
//     \n, \r, \r\n, \v, \f, \x1c, \x1d, \x1e, NEL (U+0085), LINE
//     SEPARATOR (U+2028), PARAGRAPH SEPARATOR (U+2029).
//   - A character reads as the ASCII character its NFKC form is, if it is
//     one (＃ and ﹟ read #, ～ reads ~, ［ reads [, ｅ reads e: the table
//     is foldtable.go), and a Unicode tag character (U+E0020-E007E) as the
//     ASCII character it shadows.
//   - At a line start, white space (including U+00A0, U+3000 and every
//     other space separator), control characters, backslashes, format
//     characters (zero-width spaces and joiners, U+2060, BOM, soft hyphen,
//     bidi marks, overrides and isolates) and combining marks are skipped;
//     between the characters of a marker, format characters and combining
//     marks are.
//
// A line that then starts with three characters that read as number
// signs, or with one that reads as a bracket and one of the words, is
// escaped: it gets one backslash at its very start. So does a line that
// holds an explicit bidi control (U+202A-U+202E, U+2066-U+2069) and a
// character that reads as a number sign or a bracket anywhere, since it
// may display as a marker (its characters reversed) in a bidi-aware
// viewer.
// Nothing else changes: no character is removed or replaced, and text
// with nothing to escape is returned as it is. Escaping is deterministic,
// and reversible: a line of escaped text matches the rule exactly when its
// text did, so removing the first byte of every line that matches undoes it.
//
// Package chattemplate escapes the content it places in the system message
// with it.
func Escape(s string) string { return escapeText(s, true) }

// escape is Escape.
func escape(s string) string { return escapeText(s, true) }

// escapeInline escapes text that continues a line ctxd started (a name
// after a header's keyword): its lines after the first are escaped.
func escapeInline(s string) string { return escapeText(s, false) }

func escapeText(s string, lineStart bool) string {
	if !mayNeedEscape(s) {
		return s
	}
	var sb strings.Builder
	escaped, done := false, 0
	for start, check := 0, lineStart; ; check = true {
		end, next := nextBreak(s, start)
		if check && needsEscape(s[start:end]) {
			if !escaped {
				sb.Grow(len(s) + 8)
				escaped = true
			}
			sb.WriteString(s[done:start])
			sb.WriteByte('\\')
			done = start
		}
		if next < 0 {
			break
		}
		start = next
	}
	if !escaped {
		return s
	}
	sb.WriteString(s[done:])
	return sb.String()
}

// Fence is the codex fence for content: tildes, one more than the longest
// run of characters that read as tildes at the start of any of its lines
// (read as escaping reads them: after any line break, white space,
// control and invisible characters skipped), and at least three. No line
// of content can close it, at any indentation.
func Fence(content string) string {
	best := 0
	if strings.IndexByte(content, '~') >= 0 || strings.IndexByte(content, 0xEF) >= 0 || strings.IndexByte(content, 0xF3) >= 0 {
		for start := 0; ; {
			end, next := nextBreak(content, start)
			line := content[start:end]
			best = max(best, run(skipLead(line), '~', len(line)))
			if next < 0 {
				break
			}
			start = next
		}
	}
	return strings.Repeat("~", max(3, best+1))
}
