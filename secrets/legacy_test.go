package secrets

// The redactor ctxd had before this package (codex/redact.go at commit
// 1a372d7), kept to measure against: its twelve hand-written rules, a
// keyword prefilter and windows around the keywords. Only its result type
// changed, to Finding.

import (
	"bytes"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// legacyRulesVersion names the rules below: cached findings are for one version
// (it is part of the cache's format), so a changed legacyRule rescans every file.
const legacyRulesVersion = "2"

// legacyRule is one kind of credential. Keywords are a cheap prefilter: the
// regexp runs only on content that holds one of them (case-insensitive).
type legacyRule struct {
	id       string
	keywords []string
	re       *regexp.Regexp
	group    int // the submatch that is the secret; 0: the whole match
	// span says how far from a keyword a match can reach; see window.
	span legacySpanKind
}

// legacySpanKind is how far a rule's matches reach around their keyword.
type legacySpanKind int

const (
	legacySpanLine   legacySpanKind = iota // within the keyword's line: the pattern matches no newline
	legacySpanAssign                       // the keyword's line, and across the blank space of "key =\n 'value'"
	legacySpanRest                         // to the end of the text (a private key's block)
)

// rules detect credentials with few false positives. They follow the
// patterns of gitleaks' default configuration for the same providers;
// gitleaks itself scans at under 1 MB/s here, too slow for whole trees.
var legacyRules = []legacyRule{
	{id: "private-key", keywords: []string{"-----begin"},
		re: regexp.MustCompile(`-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S]{64,}?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`), span: legacySpanRest},
	{id: "aws-access-key-id", keywords: []string{"akia", "asia", "abia", "acca"},
		re: regexp.MustCompile(`\b((?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16})\b`), group: 1},
	{id: "aws-secret-access-key", keywords: []string{"aws"},
		re: regexp.MustCompile(`(?i)aws.{0,20}(?:secret|private).{0,20}['"=: \t]+([A-Za-z0-9/+]{40})\b`), group: 1},
	{id: "github-token", keywords: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"},
		re: regexp.MustCompile(`\b((?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\b`), group: 1},
	{id: "gitlab-token", keywords: []string{"glpat-"},
		re: regexp.MustCompile(`\b(glpat-[A-Za-z0-9_-]{20})\b`), group: 1},
	{id: "slack-token", keywords: []string{"xox"},
		re: regexp.MustCompile(`\b(xox[baprs]-[A-Za-z0-9-]{10,72})\b`), group: 1},
	{id: "stripe-key", keywords: []string{"sk_live_", "rk_live_", "sk_test_", "rk_test_"},
		re: regexp.MustCompile(`\b((?:sk|rk)_(?:live|test)_[A-Za-z0-9]{24,99})\b`), group: 1},
	{id: "google-api-key", keywords: []string{"aiza"},
		re: regexp.MustCompile(`\b(AIza[0-9A-Za-z_-]{35})\b`), group: 1},
	{id: "openai-api-key", keywords: []string{"sk-"},
		re: regexp.MustCompile(`\b(sk-(?:proj-|ant-api03-)?[A-Za-z0-9_-]{20,}T3BlbkFJ[A-Za-z0-9_-]{20,}|sk-ant-api03-[A-Za-z0-9_-]{90,})\b`), group: 1},
	{id: "jwt", keywords: []string{"eyj"},
		re: regexp.MustCompile(`\b(eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})\b`), group: 1},
	{id: "connection-string-password", keywords: []string{"://"},
		re: regexp.MustCompile(`\b[a-zA-Z][a-zA-Z0-9+.-]{1,20}://[^\s:/@'"]{1,64}:([^\s@/'"]{3,128})@[^\s/'"]+`), group: 1},
	{id: "password-assignment", keywords: []string{"password", "passwd", "secret", "api_key", "apikey", "token"},
		re: regexp.MustCompile(`(?i)\b(?:password|passwd|secret|api_?key|access_?token|auth_?token)["']?\s*[:=]\s*["']([^"'\s$%{}<>]{8,128})["']`), group: 1, span: legacySpanAssign},
}

// redact replaces every credential in s with a marker naming its rule and
// returns the new text and what it replaced. Without findings s is
// returned as it is (no copy).
//
// Every match of a rule contains one of its keywords, so a rule's pattern
// runs only on windows around its keywords' occurrences (found in one
// ASCII-lowercased copy): from the start of the keyword's line to as far
// as a match through it can reach (its span). Windows start and end at
// line boundaries and overlapping ones are merged, so the matches found
// are those the pattern finds in the whole text
// (TestRedactWindowsFindWhatWholeTextFinds, FuzzRedactWindows) — except
// where (?i) folds a non-ASCII letter into a keyword (ſ for s, K the
// Kelvin sign for k), which the ASCII keyword scan does not see.
func legacyRedact(s string) []Finding {
	type span struct {
		start, end int
		rule       string
	}
	var spans []span
	buf := legacyLowerPool.Get().(*[]byte)
	lower := legacyASCIILower(*buf, s)
	defer func() { *buf = lower[:0]; legacyLowerPool.Put(buf) }()
	for _, r := range legacyRules {
		for _, w := range legacyWindows(s, lower, r) {
			for _, m := range r.re.FindAllStringSubmatchIndex(s[w[0]:w[1]], -1) {
				start, end := m[0], m[1]
				if r.group > 0 && len(m) > 2*r.group+1 && m[2*r.group] >= 0 {
					start, end = m[2*r.group], m[2*r.group+1]
				}
				start, end = start+w[0], end+w[0]
				if legacyPlaceholder(s[start:end]) {
					continue
				}
				spans = append(spans, span{start, end, r.id})
			}
		}
	}
	if len(spans) == 0 {
		return nil
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].start != spans[j].start {
			return spans[i].start < spans[j].start
		}
		return spans[i].end > spans[j].end
	})
	var found []Finding
	last := 0
	for _, sp := range spans {
		if sp.start < last {
			continue // inside a span already replaced
		}
		found = append(found, Finding{Rule: sp.rule, Start: sp.start, End: sp.end, Line: 1 + strings.Count(s[:sp.start], "\n")})
		last = sp.end
	}
	return found
}

var legacyLowerPool = sync.Pool{New: func() any { return new([]byte) }}

// legacyASCIILower is s with ASCII letters lowercased, in buf: the same length
// as s, so offsets in it are offsets in s.
func legacyASCIILower(buf []byte, s string) []byte {
	buf = append(buf[:0], s...)
	for i, c := range buf {
		if 'A' <= c && c <= 'Z' {
			buf[i] = c + 'a' - 'A'
		}
	}
	return buf
}

// windows returns the merged [start, end) ranges of s where r can match:
// around every occurrence of one of its keywords in lower.
func legacyWindows(s string, lower []byte, r legacyRule) [][2]int {
	var ws [][2]int
	for _, k := range r.keywords {
		kb := []byte(k)
		for from := 0; ; {
			i := bytes.Index(lower[from:], kb)
			if i < 0 {
				break
			}
			p := from + i
			from = p + len(kb)
			start := strings.LastIndexByte(s[:p], '\n') + 1
			var end int
			switch r.span {
			case legacySpanRest:
				end = len(s)
			case legacySpanAssign:
				end = legacyLineEnd(s, legacyAssignEnd(s, p+len(kb)))
			default:
				end = legacyLineEnd(s, p+len(kb))
			}
			ws = append(ws, [2]int{start, end})
			if r.span == legacySpanRest {
				break // one window to the end holds every later occurrence
			}
		}
	}
	if len(ws) < 2 {
		return ws
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i][0] < ws[j][0] })
	merged := ws[:1]
	for _, w := range ws[1:] {
		last := &merged[len(merged)-1]
		if w[0] <= last[1] {
			last[1] = max(last[1], w[1])
			continue
		}
		merged = append(merged, w)
	}
	return merged
}

// lineEnd is the index of the newline ending the line at i, or len(s).
func legacyLineEnd(s string, i int) int {
	if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
		return i + j
	}
	return len(s)
}

// assignEnd skips from just after a keyword over what may separate it from
// an assigned value, newlines included: the rest of the word, a quote,
// blank space, ':' or '=', blank space. The value and its closing quote
// are on the line where it stops.
func legacyAssignEnd(s string, i int) int {
	for i < len(s) && (s[i] == '_' || 'a' <= s[i]|0x20 && s[i]|0x20 <= 'z' || '0' <= s[i] && s[i] <= '9') {
		i++
	}
	if i < len(s) && (s[i] == '"' || s[i] == '\'') {
		i++
	}
	i = legacySkipSpace(s, i)
	if i < len(s) && (s[i] == ':' || s[i] == '=') {
		i++
	}
	return legacySkipSpace(s, i)
}

// skipSpace skips what the patterns' \s matches: ASCII blank space.
func legacySkipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v') {
		i++
	}
	return i
}

// placeholder reports values that are obviously not secrets: template
// variables and repeated characters.
func legacyPlaceholder(v string) bool {
	if strings.ContainsAny(v, "${}<>*") {
		return true
	}
	return strings.Count(v, v[:1]) == len(v)
}
