package secrets

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/BurntSushi/toml"
)

// gitleaksTOML is gitleaks' default configuration, as released (see the
// header of the file and LICENSE.gitleaks).
//
//go:embed gitleaks.toml
var gitleaksTOML []byte

// gitleaksVersion is the gitleaks release gitleaks.toml was copied from.
const gitleaksVersion = "v8.30.1"

// rule is one kind of secret.
type rule struct {
	id       string
	re       *regexp.Regexp
	group    int      // the submatch that is the secret; 0: the first non-empty one, or the whole match
	entropy  float64  // a secret must have more Shannon entropy (bits per byte) than this
	keywords []string // lower case; the rule runs only near one of them (none: everywhere)
	allow    []allowlist
	// reach is how many line breaks a match can span, at most maxReach:
	// the rule runs on the keyword's line and the next reach lines.
	reach int
	pre   precheck // nil: none
	// anchored, if not nil, is the pattern anchored at the keyword, tried
	// at each one instead of searching windows (see derivePrecheck); the
	// match begins up to prefix name characters before it (-1: any
	// number), and so does the name in keyGroup. With lineAnchored it is
	// anchored at the start of the keyword's line instead.
	anchored     *regexp.Regexp
	prefix       int
	lineAnchored bool
	// block: the rule matches a "-----BEGIN …" block (see blockEnd).
	block bool
	// width is the longest a match can be, in bytes; -1: no limit.
	width int
	// keyGroup, for ctxd's own rules, is the submatch naming what the
	// secret is assigned to (0: none), and valid a further check of the
	// secret given it.
	keyGroup int
	valid    func(key, secret string) bool
	// pairs says the groups are (name, secret) pairs, alternatives: the
	// secret is the pair's that matched, its key the name.
	pairs bool
}

// allowlist says which findings of a rule (or of all rules) are not
// secrets: those whose target matches one of the patterns, or whose secret
// holds one of the stop words; with and, those that do both.
type allowlist struct {
	target target
	pats   []pattern
	stop   *keywordMatcher // the stop words (found ignoring case); nil: none
	and    bool
}

// pattern is one of an allowlist's regular expressions.
type pattern struct {
	re     *regexp.Regexp
	filter *litFilter // when re may match; nil: always
}

func newPattern(re *regexp.Regexp) pattern {
	return pattern{re: re, filter: newLitFilter(re.String())}
}

// target is the text an allowlist's patterns test.
type target int

const (
	targetSecret target = iota
	targetMatch
	targetLine
)

// The shape of gitleaks.toml. Unknown keys are errors: a release that
// adds a feature must be read before it is adopted.
type tomlConfig struct {
	Title      string          `toml:"title"`
	MinVersion string          `toml:"minVersion"`
	Allowlist  *tomlAllowlist  `toml:"allowlist"`
	Allowlists []tomlAllowlist `toml:"allowlists"`
	Rules      []tomlRule      `toml:"rules"`
}

type tomlRule struct {
	ID          string          `toml:"id"`
	Description string          `toml:"description"`
	Regex       string          `toml:"regex"`
	SecretGroup int             `toml:"secretGroup"`
	Entropy     float64         `toml:"entropy"`
	Keywords    []string        `toml:"keywords"`
	Path        string          `toml:"path"`
	Tags        []string        `toml:"tags"`
	Allowlists  []tomlAllowlist `toml:"allowlists"`
}

type tomlAllowlist struct {
	Description string   `toml:"description"`
	Condition   string   `toml:"condition"`
	Commits     []string `toml:"commits"`
	Paths       []string `toml:"paths"`
	RegexTarget string   `toml:"regexTarget"`
	Regexes     []string `toml:"regexes"`
	Stopwords   []string `toml:"stopwords"`
}

// ruleSet is a parsed configuration.
type ruleSet struct {
	rules  []rule
	global []allowlist
	// skipped names the gitleaks rules not used, with why.
	skipped map[string]string
}

// parseGitleaks reads a gitleaks configuration. ctxd redacts a text by its
// content alone (the codex caches by content hash), so what depends on a
// file's path is left out: rules scoped to paths (gitleaks runs them on
// those files only), path-only rules (SecretFile's business) and path and
// commit allowlists.
func parseGitleaks(data []byte) (ruleSet, error) {
	var cfg tomlConfig
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&cfg)
	if err != nil {
		return ruleSet{}, fmt.Errorf("secrets: gitleaks config: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return ruleSet{}, fmt.Errorf("secrets: gitleaks config: unknown keys %v", und)
	}
	rs := ruleSet{skipped: map[string]string{}}
	globals := cfg.Allowlists
	if cfg.Allowlist != nil {
		globals = append([]tomlAllowlist{*cfg.Allowlist}, globals...)
	}
	for _, a := range globals {
		al, ok, err := compileAllowlist(a)
		if err != nil {
			return ruleSet{}, fmt.Errorf("secrets: gitleaks config: global allowlist: %w", err)
		}
		if ok {
			rs.global = append(rs.global, al)
		}
	}
	for _, tr := range cfg.Rules {
		switch {
		case tr.Regex == "":
			rs.skipped[tr.ID] = "matches file paths only (see codex.SecretFile)"
			continue
		case tr.Path != "":
			rs.skipped[tr.ID] = "scoped to paths matching " + tr.Path
			continue
		}
		r, err := compileRule(tr.ID, tr.Regex, tr.SecretGroup, tr.Entropy, tr.Keywords)
		if err != nil {
			return ruleSet{}, fmt.Errorf("secrets: gitleaks config: %w", err)
		}
		r.pre, r.anchored = derivePrecheck(tr.Regex, r.keywords)
		if r.block && strings.HasPrefix(tr.Regex, privateKeyHeader) {
			r.pre = privateKeyAt
		}
		if r.anchored != nil {
			r.prefix = templateLazyPrefix
		}
		for _, a := range tr.Allowlists {
			al, ok, err := compileAllowlist(a)
			if err != nil {
				return ruleSet{}, fmt.Errorf("secrets: gitleaks config: rule %s: %w", tr.ID, err)
			}
			if ok {
				r.allow = append(r.allow, al)
			}
		}
		rs.rules = append(rs.rules, r)
	}
	// A rule's place is its precedence where findings coincide: the
	// generic rule, gitleaks' catch-all, after the providers'.
	slices.SortStableFunc(rs.rules, func(a, b rule) int {
		return cmp.Compare(boolInt(a.id == genericRule), boolInt(b.id == genericRule))
	})
	return rs, nil
}

// genericRule is gitleaks' catch-all rule.
const genericRule = "generic-api-key"

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func compileRule(id, expr string, group int, entropy float64, keywords []string) (rule, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return rule{}, fmt.Errorf("rule %s: %w", id, err)
	}
	if group > re.NumSubexp() {
		return rule{}, fmt.Errorf("rule %s: secret group %d of %d", id, group, re.NumSubexp())
	}
	reach, err := lineBreaks(expr)
	if err != nil {
		return rule{}, fmt.Errorf("rule %s: %w", id, err)
	}
	r := rule{id: id, re: re, group: group, entropy: entropy, reach: reach, width: -1}
	if p, err := syntax.Parse(expr, syntax.Perl); err == nil {
		r.width = maxWidth(p)
	}
	for _, k := range keywords {
		r.keywords = append(r.keywords, strings.ToLower(k))
		r.block = r.block || strings.HasPrefix(strings.ToLower(k), "-----begin")
	}
	// A pattern that can span any number of lines (a quoted string in a
	// curl command's arguments) runs on at most maxReach lines after its
	// keyword. A key block runs to its END line (see blockEnd).
	if reach < 0 || reach > maxReach {
		r.reach = maxReach
	}
	return r, nil
}

// maxReach is how many lines after its keyword's a match may end on,
// except a key block's.
const maxReach = 100

// compileAllowlist compiles what of a gitleaks allowlist applies to a
// text alone. ok is false if nothing does: it tests only paths or
// commits, or it must match a path as well (condition AND).
func compileAllowlist(a tomlAllowlist) (al allowlist, ok bool, err error) {
	al.and = strings.EqualFold(a.Condition, "AND")
	if al.and && (len(a.Paths) > 0 || len(a.Commits) > 0) {
		return allowlist{}, false, nil
	}
	switch a.RegexTarget {
	case "", "secret":
		al.target = targetSecret
	case "match":
		al.target = targetMatch
	case "line":
		al.target = targetLine
	default:
		return allowlist{}, false, fmt.Errorf("unknown regexTarget %q", a.RegexTarget)
	}
	for _, expr := range a.Regexes {
		re, err := regexp.Compile(expr)
		if err != nil {
			return allowlist{}, false, err
		}
		al.pats = append(al.pats, newPattern(re))
	}
	if len(a.Stopwords) > 0 {
		words := make([]string, len(a.Stopwords))
		for i, w := range a.Stopwords {
			words[i] = strings.ToLower(w)
		}
		al.stop = newKeywordMatcher(words)
	}
	return al, len(al.pats) > 0 || al.stop != nil, nil
}

// maxWidth is the length in bytes of re's longest match; -1: no limit.
func maxWidth(re *syntax.Regexp) int {
	return most(re, func(re *syntax.Regexp) int {
		switch re.Op {
		case syntax.OpLiteral:
			return len(string(re.Rune))
		case syntax.OpCharClass:
			if len(re.Rune) > 0 && re.Rune[len(re.Rune)-1] >= 0x80 {
				return utf8.UTFMax
			}
			return 1
		case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
			return utf8.UTFMax
		}
		return 0
	})
}

// most is the most that one match of re can hold of what leaf measures
// in an atom (a literal, a character class, any character); -1 when a
// match can hold any amount (an unbounded repeat of something measured).
func most(re *syntax.Regexp, leaf func(*syntax.Regexp) int) int {
	add := func(a, b int) int {
		if a < 0 || b < 0 {
			return -1
		}
		return a + b
	}
	switch re.Op {
	case syntax.OpCapture, syntax.OpQuest:
		return most(re.Sub[0], leaf)
	case syntax.OpStar, syntax.OpPlus:
		if most(re.Sub[0], leaf) != 0 {
			return -1
		}
		return 0
	case syntax.OpRepeat:
		n := most(re.Sub[0], leaf)
		switch {
		case n == 0:
			return 0
		case n < 0 || re.Max < 0:
			return -1
		}
		return n * re.Max
	case syntax.OpConcat:
		n := 0
		for _, s := range re.Sub {
			n = add(n, most(s, leaf))
		}
		return n
	case syntax.OpAlternate:
		n := 0
		for _, s := range re.Sub {
			m := most(s, leaf)
			if m < 0 {
				return -1
			}
			n = max(n, m)
		}
		return n
	}
	return leaf(re) // atoms; empty-width assertions, empty match and no match measure 0
}

// lineBreaks is how many line breaks a match of expr can span: -1 for any
// number.
func lineBreaks(expr string) (int, error) {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return 0, err
	}
	return newlines(re), nil
}

func newlines(re *syntax.Regexp) int {
	return most(re, func(re *syntax.Regexp) int {
		switch re.Op {
		case syntax.OpLiteral:
			return strings.Count(string(re.Rune), "\n")
		case syntax.OpCharClass:
			for i := 0; i+1 < len(re.Rune); i += 2 {
				if re.Rune[i] <= '\n' && '\n' <= re.Rune[i+1] {
					return 1
				}
			}
		case syntax.OpAnyChar:
			return 1
		}
		return 0
	})
}

// source is this package's own source, embedded so that the rules'
// version follows their code: a rule, an allowlist, a filter or the
// scanner changed by any hand reads every cached file again (its tests
// are left out of the hash).
//
//go:embed *.go
var source embed.FS

// rulesHash identifies the embedded configuration and ctxd's own rules:
// their data and the source of every file of this package.
func rulesHash() string { return rulesHashOf(source, gitleaksTOML) }

// rulesHashOf is rulesHash of the package source src and configuration
// conf.
func rulesHashOf(src fs.ReadFileFS, conf []byte) string {
	h := sha256.New()
	h.Write(conf)
	h.Write([]byte(ownRulesVersion))
	files, err := fs.Glob(src, "*.go")
	if err != nil {
		panic(err) // a valid pattern over an embedded tree
	}
	for _, name := range files { // in name order
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		data, _ := src.ReadFile(name)
		fmt.Fprintf(h, "%s %d\n", name, len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}
