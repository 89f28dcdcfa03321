package secrets

import (
	"encoding/base64"
	"regexp"
	"strings"
	"unicode"
)

// ownRulesVersion names ctxd's own rules and allowlists below: change it
// with them, so that what they found is found again.
const ownRulesVersion = "1"

// ownRules are ctxd's rules for what gitleaks' rules let pass: literal
// values assigned to password, secret and token names however short or
// plain (gitleaks' generic rule wants 10 characters, 3.5 bits of entropy
// a byte and no '$'), unquoted .env and YAML values, private keys without
// their END line, passwords in URLs, DSNs, query strings, connection
// strings, XML settings and command lines, Docker registry auth,
// Authorization headers, webhook URLs. They come after gitleaks' rules,
// so where both find a secret the marker names gitleaks' rule.
func ownRules() []rule {
	kw := func(s ...string) []string { return s }
	mk := func(id, expr string, keywords []string, f func(*rule)) rule {
		r, err := compileRule(id, expr, 0, 0, keywords)
		if err != nil {
			panic(err) // tested
		}
		if f != nil {
			f(&r)
		}
		return r
	}
	// A separator between the lines of a key's body: line breaks, real or
	// escaped, and the quotes and '+' of a string literal split in code.
	const sep = `(?:[ \t"'+,]*(?:\\r|\\n|\r?\n)[ \t"'+,]*)+`
	// Names whose value is a secret; keyOK decides from the whole name.
	const names = `pass|pwd|secret|token|credential|api[_.-]?key|access[_.-]?key|private[_.-]?key|auth[_.-]?key|master[_.-]?key`
	// After the name, an operator and a quoted value; or a name and an
	// unquoted value alone on their line.
	const quotedAssignment = `["'\x60]?[ \t]*(?:=|:=|:|=>|\?=|\|\|=)[ \t]*(?:"([^"\s]{6,200})"|'([^'\s]{6,200})'|\x60([^\x60\s]{6,200})\x60)`
	const unquotedAssignment = `[ \t]*(?:export[ \t]+|-[ \t]+)?([\w.-]*(?:` + names + `)[\w.-]*[ \t]*[:=][ \t]*)([^\s"'\x60#][^\s]{0,199})(?:[ \t]+#[^\r\n]*)?[ \t]*`
	nameKeywords := kw("pass", "pwd", "secret", "token", "credential",
		"apikey", "api_key", "api-key", "api.key", "accesskey", "access_key", "access-key", "access.key",
		"privatekey", "private_key", "private-key", "private.key", "authkey", "auth_key", "auth-key", "auth.key",
		"masterkey", "master_key", "master-key", "master.key")
	return []rule{
		mk("ctxd-private-key",
			privateKeyHeader+`(?: BLOCK)?-----(?-i:(?:`+sep+`[A-Za-z][A-Za-z-]*:[ \t][^\r\n\\]*)*(?:(?:`+sep+`|[ \t]+)[A-Za-z0-9+/=]{16,})+)`,
			kw("-----begin"), func(r *rule) {
				r.pre = privateKeyAt
				r.valid = func(_, s string) bool { return keyBody(s) >= 64 }
			}),
		mk("ctxd-aws-secret-access-key",
			`(?i)(?:aws[\w.-]{0,20}?(?:secret|private)|secret[_.-]?access)[\w.-]{0,20}["'\x60]?[ \t]{0,3}(?:=|:=|:|=>|,)[ \t]{0,3}["'\x60]?([A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+=]|$)`,
			kw("aws", "secretaccess", "secret_access", "secret-access", "secret.access"), func(r *rule) { r.entropy = 3.5 }),
		mk("ctxd-url-password",
			`\b[A-Za-z][A-Za-z0-9+.-]{1,20}://([^\s:/?#@'"\x60<>]{0,128}):([^\s@/'"\x60<>]{1,128})@[^\s/'"\x60<>@]+`,
			kw("://"), func(r *rule) { r.keyGroup, r.valid, r.pre = 1, urlPasswordOK, userinfoFollows }),
		mk("ctxd-url-query-secret",
			`(?i)[?&]([\w.-]*(?:pass|pwd|secret|token|api[_.-]?key|access[_.-]?key)[\w.-]*|sig)=([^&\s"'\x60#<>]{6,512})`,
			kw("pass", "pwd", "secret", "token", "apikey", "api_key", "api-key", "api.key", "accesskey", "access_key", "access-key", "access.key", "sig="),
			func(r *rule) {
				r.keyGroup, r.pre = 1, queryParamAt
				r.valid = func(key, v string) bool {
					return (strings.EqualFold(key, "sig") && entropy(v) > 3.5 || keyOK(key)) && valueOK(v)
				}
			}),
		mk("ctxd-connection-string-password",
			`(?i)[;"'][ \t]*((?:user )?password|pwd)[ \t]*=[ \t]*([^;"'\r\n]{1,128})`,
			kw("password", "pwd"), func(r *rule) {
				r.keyGroup, r.pre = 1, connectionStringAt
				r.valid = func(_, v string) bool { return valueOK(strings.TrimSpace(v)) }
			}),
		mk("ctxd-xml-secret",
			`(?i)<add[ \t]+key="([\w.:-]*(?:`+names+`)[\w.:-]*)"[ \t]+value="([^"\s]{6,200})"|<([\w.:-]*(?:`+names+`)[\w.:-]*)>([^<\s]{6,200})</`,
			nameKeywords, func(r *rule) {
				r.pairs = true
				r.valid = func(key, v string) bool { return keyOK(key) && valueOK(v) }
			}),
		mk("ctxd-cli-password",
			`\bsshpass[ \t]+-p[ \t]*(?:'([^'\n]+)'|"([^"\n]+)"|([^\s'"]+))|\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n|;&]*?[ \t](?:-p|--password=)(?:'([^'\n]+)'|"([^"\n]+)"|([^\s'"-][^\s'"]*))`,
			kw("sshpass", "mysql", "mariadb"), func(r *rule) { r.valid = func(_, v string) bool { return len(v) >= 4 && !placeholder(v) } }),
		mk("ctxd-webhook-url",
			`https://(?:hooks\.slack\.com/(?:services|workflows|triggers)|(?:canary\.|ptb\.)?discord(?:app)?\.com/api/webhooks)/[A-Za-z0-9/_+-]{20,}`,
			kw("hooks.slack.com", "/api/webhooks/"), nil),
		mk("ctxd-dsn-password",
			`\b([\w.-]{1,64}):([^\s@/'"\x60:]{1,128})@(?:tcp|unix|udp)\(`,
			kw("@tcp(", "@unix(", "@udp("), func(r *rule) { r.keyGroup, r.valid = 1, urlPasswordOK }),
		mk("ctxd-docker-auth",
			`"auth"[ \t]*:[ \t]*"([A-Za-z0-9+/]{8,}={0,2})"`,
			kw(`"auth"`), func(r *rule) { r.valid = func(_, s string) bool { return dockerAuthOK(s) } }),
		// A .netrc's password, on the machine's line or a later one (after a
		// login, which prose about machines and passwords rarely has).
		mk("ctxd-netrc-password",
			`(?i)\bmachine[ \t]+\S+\s+login[ \t]+\S+(?:\s+(?:account|port)[ \t]+\S+)*\s+password[ \t]+(\S{1,200})`,
			kw("machine"), func(r *rule) { r.valid = func(_, v string) bool { return !placeholder(v) } }),
		// A .pgpass line: host:port:database:user:password, found where a
		// line names the file, PostgreSQL's port or a wildcard (a rule
		// without keywords would run over every line of every file).
		mk("ctxd-pgpass-password",
			`(?m)^(?:[A-Za-z0-9_.*-]+|\[[0-9A-Fa-f:]+\]):(?:\d{1,5}|\*):[^:\s]+:[^:\s]+:(\S{1,200})\r?$`,
			kw("pgpass", ":5432:", ":*:"), func(r *rule) { r.group, r.valid = 1, func(_, v string) bool { return !placeholder(v) } }),
		// A kubeconfig's client key (base64 of a PEM private key) and
		// bearer token.
		mk("ctxd-kubeconfig-credential",
			`(?m)^[ \t]*(?:client-key-data|token)[ \t]*:[ \t]*["']?([A-Za-z0-9+/=._-]{16,})["']?[ \t]*\r?$`,
			kw("client-key-data", "token:"), func(r *rule) {
				r.valid = func(_, v string) bool { return !placeholder(v) && entropy(v) > 3 }
			}),
		mk("ctxd-authorization-header",
			`(?i)\bauthorization["'\x60]?[ \t]*(?::|=>|=|,)[ \t]*["'\x60]?(?:basic|bearer|token)[ \t]+([A-Za-z0-9+/=._~-]{8,})`,
			kw("authorization"), func(r *rule) {
				r.valid = func(_, s string) bool { return !placeholder(s) && entropy(s) > 2.5 && !basicPlaceholder(s) }
			}),
		// The two assignment rules run anchored: the quoted one at its
		// keyword, its name's beginning found by going back over name
		// characters; the unquoted one at the start of its keyword's line.
		mk("ctxd-secret-assignment",
			`(?i)([\w.-]*(?:`+names+`)[\w.-]*)`+quotedAssignment,
			nameKeywords, func(r *rule) {
				r.keyGroup, r.pre = 1, quotedAssignmentFollows
				r.anchored, r.prefix = regexp.MustCompile(`(?i)^((?:`+names+`)[\w.-]*)`+quotedAssignment), -1
				r.valid = func(key, v string) bool { return keyOK(key) && valueOK(v) }
			}),
		mk("ctxd-secret-assignment",
			`(?im)^`+unquotedAssignment+`\r?$`,
			nameKeywords, func(r *rule) {
				r.keyGroup, r.valid, r.pre = 1, unquotedOK, lineAssignmentAt
				r.anchored, r.lineAnchored = regexp.MustCompile(`(?i)^`+unquotedAssignment+`\r?\n?$`), true
			}),
	}
}

// ownAllowlists apply to every rule: well-known example credentials and
// placeholders, and lines that hold checksums (go.sum, lock files).
func ownAllowlists() []allowlist {
	as := []allowlist{
		// AWS's documented keys and RFC 7617's Basic credentials;
		// Stripe's publishable keys (public by design); jwt.io's example
		// token and unsigned ones ("alg": "none"); test values by name;
		// dotted names (config.Password, ed25519.PrivateKey, not Vault's
		// s.<token>), which gitleaks' generic rule takes for values.
		{pats: patterns(
			`^(?:AKIAIOSFODNN7EXAMPLE|wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY|je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY|QWxhZGRpbjpvcGVuIHNlc2FtZQ==)$`,
			`^pk_(?:live|test)_`, `SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c`, `^eyJhbGciOiJub25lI`,
			`^(?i:test|fake|dummy|example|sample|mock)`,
			`^[A-Za-z_][A-Za-z0-9_]{1,30}(?:\.[A-Za-z_][A-Za-z0-9_]{0,30})+$`)},
		{stop: newKeywordMatcher([]string{"example", "placeholder", "changeme", "change_me", "change-me", "changeit",
			"redacted", "dummy", "xxxxxx", "******", "your_", "your-", "yourpass", "yourtoken", "yourkey", "yoursecret",
			"yourapi", "replace_me", "replaceme", "replace-me", "insert_", "insert-", "notreal", "not_real", "not-real",
			"0123456789", "1234567890", "abcdefghij"})},
		{target: targetLine, pats: patterns(`^\S+ v\S+ h1:[A-Za-z0-9+/]{43}=$`, `"integrity":\s*"sha\d+-`, `^\s*integrity sha\d+-`, `^\s*checksum:? [0-9a-f]{64,}`)},
	}
	return as
}

// userinfoFollows is the precheck of ctxd-url-password: after "://",
// a ':' and then an '@' before any blank, quote, '/' or angle bracket.
func userinfoFollows(text string, _, end int) int {
	colon := false
	for i := end; i < len(text) && i < end+260; i++ {
		switch c := text[i]; c {
		case ':':
			colon = true
		case '@':
			if colon {
				return 0
			}
			return -1
		case ' ', '\t', '\n', '\r', '\v', '\f', '/', '\'', '"', '`', '<', '>':
			return -1
		}
	}
	return -1
}

// quotedAssignmentFollows is the precheck of the quoted
// ctxd-secret-assignment: after the keyword, the rest of the name, maybe
// a quote, blanks, an operator, blanks and an opening quote.
func quotedAssignmentFollows(text string, _, end int) int {
	i := skipName(text, end)
	if i < len(text) && (text[i] == '"' || text[i] == '\'' || text[i] == '`') {
		i++
	}
	i = skipBlanks(text, i)
	if i >= len(text) || strings.IndexByte("=:?|", text[i]) < 0 {
		return -1
	}
	for i < len(text) && strings.IndexByte("=:>?| \t", text[i]) >= 0 {
		i++
	}
	if i < len(text) && (text[i] == '"' || text[i] == '\'' || text[i] == '`') {
		return 0
	}
	return -1
}

// lineAssignmentAt is the precheck of the unquoted
// ctxd-secret-assignment: the keyword is in the first word of its line
// (after blanks and "export" or "- "), followed by the rest of the name,
// blanks, ':' or '=', blanks and something not a quote or a comment.
func lineAssignmentAt(text string, start, end int) int {
	i := skipBlanks(text, skipName(text, end))
	if i >= len(text) || text[i] != ':' && text[i] != '=' {
		return -1
	}
	i = skipBlanks(text, i+1)
	if i >= len(text) || strings.IndexByte(" \t\r\n\v\f\"'`#", text[i]) >= 0 {
		return -1
	}
	j := start
	for j > 0 && isNameByte(text[j-1]) {
		j--
	}
	lineStart := strings.LastIndexByte(text[:j], '\n') + 1
	prefix := strings.TrimLeft(text[lineStart:j], " \t")
	switch {
	case prefix == "":
	case strings.HasPrefix(prefix, "export") && strings.Trim(prefix[len("export"):], " \t") == "" && len(prefix) > len("export"):
	case prefix[0] == '-' && strings.Trim(prefix[1:], " \t") == "" && len(prefix) > 1:
	default:
		return -1
	}
	return 0
}

func isNameByte(c byte) bool { return isWordByte(c) || c == '.' || c == '-' }

func skipName(text string, i int) int {
	for i < len(text) && isNameByte(text[i]) {
		i++
	}
	return i
}

func skipBlanks(text string, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t') {
		i++
	}
	return i
}

// queryParamAt is the precheck of ctxd-url-query-secret: the keyword is
// in a parameter's name, after '?', '&' or ';'.
func queryParamAt(text string, start, _ int) int {
	j := start
	for j > 0 && isNameByte(text[j-1]) {
		j--
	}
	if j > 0 && strings.IndexByte("?&;", text[j-1]) >= 0 {
		return 0
	}
	return -1
}

// connectionStringAt is the precheck of ctxd-connection-string-password:
// the keyword begins a name after a ';' or a quote, and '=' follows it.
func connectionStringAt(text string, start, end int) int {
	j := start
	for j > 0 && (text[j-1] == ' ' || text[j-1] == '\t') {
		j--
	}
	if j >= 4 && strings.EqualFold(text[j-4:j], "user") {
		j -= 4
		for j > 0 && (text[j-1] == ' ' || text[j-1] == '\t') {
			j--
		}
	}
	if j == 0 || strings.IndexByte(";\"'", text[j-1]) < 0 {
		return -1
	}
	if i := skipBlanks(text, skipName(text, end)); i >= len(text) || text[i] != '=' {
		return -1
	}
	return 0
}

// basicPlaceholder reports HTTP Basic credentials (base64 of
// "user:password") whose password is a placeholder.
func basicPlaceholder(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return false
	}
	_, pw, ok := strings.Cut(string(b), ":")
	return ok && placeholder(pw)
}

func patterns(exprs ...string) []pattern {
	ps := make([]pattern, len(exprs))
	for i, e := range exprs {
		ps[i] = newPattern(regexp.MustCompile(e))
	}
	return ps
}

// keyBody counts the base64 characters of a private key block after its
// BEGIN line.
func keyBody(s string) int {
	i := strings.Index(s, "-----")
	if j := strings.Index(s[i+5:], "-----"); j >= 0 {
		s = s[i+5+j+5:]
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=' {
			n++
		}
	}
	return n
}

// urlPasswordOK reports whether a password in a URL or DSN is a secret:
// not a placeholder, and not the same as the user name (guest:guest,
// postgres:postgres: a product's default).
func urlPasswordOK(user, pw string) bool {
	return len(pw) >= 3 && !placeholder(pw) && !strings.EqualFold(user, pw) && !placeholder(user+pw)
}

// dockerAuthOK reports whether a Docker config's "auth" is base64 of
// "user:password" with a real password.
func dockerAuthOK(s string) bool {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return false
	}
	user, pw, ok := strings.Cut(string(b), ":")
	return ok && user != "" && pw != "" && !placeholder(pw) && printable(string(b))
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// keyOK reports whether a name is one a secret is assigned to: its last
// word (split at punctuation and case changes) is a password, secret,
// token or credential, "pass" or "pwd", or a key of some kind (api key,
// private key…). passwordHash, tokenType, secretName, public_key are not.
func keyOK(key string) bool {
	words := splitWords(key)
	if len(words) == 0 {
		return false
	}
	last := words[len(words)-1]
	for _, suf := range []string{"password", "passwd", "passphrase", "secret", "token", "credential", "credentials",
		"apikey", "secretkey", "privatekey", "accesskey", "authkey", "masterkey"} {
		if strings.HasSuffix(last, suf) {
			return true
		}
	}
	switch last {
	case "pass", "pwd":
		return true
	case "key":
		if len(words) < 2 {
			return false
		}
		switch words[len(words)-2] {
		case "api", "access", "secret", "private", "auth", "master", "signing", "encryption", "app", "client",
			"license", "service", "account", "sas", "storage", "shared", "admin", "deploy", "webhook", "consumer", "hmac", "session":
			return true
		}
	}
	return false
}

// splitWords splits a name into lower-case words at anything not a letter
// or digit and where case changes: DB_PASSWORD, dbPassword and
// APIKey give [db password], [db password] and [api key].
func splitWords(s string) []string {
	var words []string
	start := -1
	flush := func(i int) {
		if start >= 0 {
			words = append(words, strings.ToLower(s[start:i]))
			start = -1
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		isUpper, isLower := 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z'
		if !isUpper && !isLower && !('0' <= c && c <= '9') {
			flush(i)
			continue
		}
		if start >= 0 && isUpper {
			prev := s[i-1]
			prevLower := 'a' <= prev && prev <= 'z' || '0' <= prev && prev <= '9'
			nextLower := i+1 < len(s) && 'a' <= s[i+1] && s[i+1] <= 'z'
			if prevLower || ('A' <= prev && prev <= 'Z' && nextLower) {
				flush(i)
			}
		}
		if start < 0 {
			start = i
		}
	}
	flush(len(s))
	return words
}

// valueOK reports whether an assigned literal looks like a secret rather
// than a placeholder: six characters or more, some variety, none of the
// marks of a template or a made-up value.
func valueOK(v string) bool {
	return len(v) >= 6 && !placeholder(v) && entropy(v) >= 2
}

// unquotedOK reports whether an unquoted value assigned on a line of its
// own is a secret: .env, shell, YAML, properties and INI files write
// literals that way, code writes expressions. keySep is the name with the
// ':' or '=' after it and the blank space around.
func unquotedOK(keySep, v string) bool {
	key := strings.TrimRight(keySep, " \t:=")
	if !keyOK(key) || !valueOK(v) {
		return false
	}
	// Expressions, references and YAML's syntax (tags, anchors, aliases,
	// block scalars, flow collections).
	if strings.ContainsAny(v, "()[]{}") || strings.ContainsAny(v[:1], "!&*|>@%") ||
		strings.ContainsAny(v[len(v)-1:], ",;\\") || strings.Contains(v, "://") ||
		strings.HasPrefix(v, "/") || strings.HasPrefix(v, "./") || strings.HasPrefix(v, "../") || strings.HasPrefix(v, "~/") ||
		strings.Contains(v, "->") || strings.Contains(v, "::") {
		return false
	}
	if dottedName.MatchString(v) {
		return false // config.password, os.environ.TOKEN
	}
	switch strings.ToLower(v) {
	case "string", "str", "bytes", "boolean", "number", "object", "secret", "secretstr", "optional", "undefined", "required":
		return false
	}
	sep := strings.IndexAny(keySep, ":=")
	spaced := strings.ContainsAny(keySep[len(key):], " \t")
	letters := isName(v)
	switch {
	case keySep[sep] == '=' && !spaced:
		// KEY=value: a literal (.env, shell, properties).
		return true
	case keySep[sep] == '=':
		// key = value: INI, TOML-ish or code; a bare name is a variable.
		return !letters
	default:
		// key: value: YAML; a camelCase name is code (a JavaScript field).
		return !letters || !camel(v)
	}
}

// shellRef is a value that is a reference: $VAR, $1, or $VAR followed
// by a path.
var shellRef = regexp.MustCompile(`^\$(?:[A-Za-z_]\w*|\d)(?:/.*)?$`)

var dottedName = regexp.MustCompile(`^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+$`)

// isName reports whether v has only letters and underscores.
func isName(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_') {
			return false
		}
	}
	return true
}

// camel reports whether a name is words in camelCase or PascalCase
// (userPassword, PasswordInput): a field or variable, where a random
// string's case changes at random (eCSDDIpEMH).
func camel(v string) bool { return camelName.MatchString(v) }

var camelName = regexp.MustCompile(`^(?:[a-z]+|[A-Z][a-z]+)(?:[A-Z][a-z]+)+$`)

// placeholder reports values that stand for a secret rather than being
// one: references to variables and templates (${X}, $X, $(cmd), {{ x }},
// %X%, <x>), masks, runs and ellipses (****, xxxx, aaaaaa, sk-...), test
// values (test-token, fake_key, testpassword, dummy…) and common
// stand-ins (changeme, password, secret, none…). A value with a '$' inside
// (pa$$w0rd, $ecret!9) is not a reference.
func placeholder(v string) bool {
	if v == "" || strings.Count(v, v[:1]) == len(v) {
		return true
	}
	l := strings.ToLower(v)
	if shellRef.MatchString(v) {
		return true // $VAR, ${VAR}, $(cmd), $1, $VAR/path
	}
	for _, m := range []string{"${", "$(", "{{", "}}", "#{", "<%", "%(", "%s", "%v", "xxxx", "****", "...", "…", "••", "<", ">",
		"-test", "_test", "test-", "test_", "fake-", "fake_", "-fake", "_fake", "not-a-real", "not_a_real", "notreal"} {
		if strings.Contains(l, m) {
			return true
		}
	}
	for _, p := range []string{"test", "fake", "dummy", "sample", "mock", "example"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	if len(v) > 2 && (v[0] == '%' && v[len(v)-1] == '%' || v[0] == '@' && v[len(v)-1] == '@') ||
		len(v) > 4 && strings.HasPrefix(v, "__") && strings.HasSuffix(v, "__") {
		return true
	}
	switch l {
	case "password", "passwd", "secret", "token", "admin", "root", "guest", "default", "test", "testing", "none", "null",
		"nil", "true", "false", "undefined", "empty", "required", "optional", "string", "hidden", "masked", "unset",
		"notset", "todo", "tbd", "user", "username", "pass", "secret123", "password123", "password1":
		return true
	}
	return false
}
