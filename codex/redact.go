package codex

import (
	"regexp"
	"sort"
	"strings"

	"github.com/ctxd/ctxd"
)

// rule is one kind of credential. Keywords are a cheap prefilter: the
// regexp runs only on content that holds one of them (case-insensitive).
type rule struct {
	id       string
	keywords []string
	re       *regexp.Regexp
	group    int // the submatch that is the secret; 0: the whole match
}

// rules detect credentials with few false positives. They follow the
// patterns of gitleaks' default configuration for the same providers;
// gitleaks itself scans at under 1 MB/s here, too slow for whole trees.
var rules = []rule{
	{id: "private-key", keywords: []string{"-----begin"},
		re: regexp.MustCompile(`-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S]{64,}?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`)},
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
	{id: "stripe-key", keywords: []string{"sk_live_", "rk_live_", "sk_test_"},
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
		re: regexp.MustCompile(`(?i)\b(?:password|passwd|secret|api_?key|access_?token|auth_?token)["']?\s*[:=]\s*["']([^"'\s$%{}<>]{8,128})["']`), group: 1},
}

// redact replaces every credential in s with a marker naming its rule and
// returns the new text and what it replaced. Without findings s is
// returned as it is (no copy).
func redact(s string) (string, []ctxd.Redaction) {
	lower := ""
	type span struct {
		start, end int
		rule       string
	}
	var spans []span
	for _, r := range rules {
		hit := false
		for _, k := range r.keywords {
			if lower == "" {
				lower = strings.ToLower(s)
			}
			if strings.Contains(lower, k) {
				hit = true
				break
			}
		}
		if !hit {
			continue
		}
		for _, m := range r.re.FindAllStringSubmatchIndex(s, -1) {
			start, end := m[0], m[1]
			if r.group > 0 && len(m) > 2*r.group+1 && m[2*r.group] >= 0 {
				start, end = m[2*r.group], m[2*r.group+1]
			}
			if placeholder(s[start:end]) {
				continue
			}
			spans = append(spans, span{start, end, r.id})
		}
	}
	if len(spans) == 0 {
		return s, nil
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].start != spans[j].start {
			return spans[i].start < spans[j].start
		}
		return spans[i].end > spans[j].end
	})
	var sb strings.Builder
	var found []ctxd.Redaction
	last := 0
	for _, sp := range spans {
		if sp.start < last {
			continue // inside a span already replaced
		}
		sb.WriteString(s[last:sp.start])
		sb.WriteString("[REDACTED:" + sp.rule + "]")
		found = append(found, ctxd.Redaction{Rule: sp.rule, Line: 1 + strings.Count(s[:sp.start], "\n")})
		last = sp.end
	}
	sb.WriteString(s[last:])
	return sb.String(), found
}

// placeholder reports values that are obviously not secrets: template
// variables and repeated characters.
func placeholder(v string) bool {
	if strings.ContainsAny(v, "${}<>*") {
		return true
	}
	return strings.Count(v, v[:1]) == len(v)
}
