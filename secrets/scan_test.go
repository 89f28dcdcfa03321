package secrets

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// findWhole is the reference Find: every rule whose keyword the text holds
// runs its pattern over the whole text, as gitleaks runs a rule over a
// whole file.
func findWhole(s *Scanner, text string) []Finding {
	sc := s.scratch.Get().(*scratch)
	defer s.putScratch(sc)
	lower := strings.ToLower(text)
	for ri := range s.rules {
		r := &s.rules[ri]
		holds := len(r.keywords) == 0
		for _, k := range r.keywords {
			holds = holds || strings.Contains(lower, k)
		}
		if !holds {
			continue
		}
		for _, m := range r.re.FindAllStringSubmatchIndex(text, -1) {
			s.consider(text, 0, m, m[0], ri, r, sc)
		}
	}
	return s.resolve(text, sc)
}

func TestFindMatchesWholeText(t *testing.T) {
	t.Parallel()
	s := Default()
	check := func(name, text string) {
		t.Helper()
		if got, want := s.Find(text), findWhole(s, text); !slices.Equal(got, want) {
			t.Errorf("%s %q:\nFind       %v\nwhole text %v", name, text, got, want)
		}
	}
	for _, c := range loadCorpus(t) {
		check("corpus", c.text)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		var sb strings.Builder
		for range 1 + rng.IntN(24) {
			sb.WriteString(fragments[rng.IntN(len(fragments))])
		}
		check("fragments", sb.String())
	}
}

func TestFindMatchesWholeTextOnSource(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs every pattern over every file")
	}
	t.Parallel()
	s := Default()
	files, _ := mixedTree(t)
	for _, f := range files {
		if got, want := s.Find(f), findWhole(s, f); !slices.Equal(got, want) {
			t.Errorf("Find %v\nwhole text %v\nin %.200q…", got, want, f)
		}
	}
}

// fragments build adversarial texts: keywords, separators, line breaks in
// odd places, and credentials of many rules.
var fragments = []string{
	"password", "PASSWORD", "passwd", "secret", "api_key", "ApiKey", "access_token", "auth_token", "token", "aws", "AWS_SECRET",
	"key", "Key", "ey", "sk", "SK", "auth", "client_secret", "DB_PASS", "export ", "- ", "  ", "#", "# note",
	" ", "\t", "\n", "\r\n", "\n\n", "=", ":", " = ", ": ", ":=", "=>", ",", "\"", "'", "`", "x", "_", "://", "@", "/", ";", "&", "?",
	"\"hunter2hunter2\"", "'s3cr3tvalue!'", "correcthorsebattery", "pa$$w0rd!", "${SECRET}", "<token>", "changeme",
	"AKIAIOSFODNN7EXAMPLE", "AKIAZ3MSJ7PQWERTY2XA", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "kT9vQ2mX8pL4nR7sW1yB3cF6hJ0dG5aE9uZ2xY/+",
	"ghp_" + strings.Repeat("a1B2", 9), "glpat-" + strings.Repeat("x1Y2", 5), "xoxb-123456789012-1234567890123-" + strings.Repeat("aB3", 8),
	"sk_live_" + strings.Repeat("Z9q", 8), "AIza" + strings.Repeat("b7Kq", 8) + "x_Z", "SK" + strings.Repeat("0a9f", 8),
	"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
	"postgres://admin:hunter22@db.internal:5432/app", "https://user:pw@", "redis://:Xk9qL2mPz@cache:6379",
	"-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----",
	strings.Repeat("MIIEowIBAAKCAQEAx9", 4), "\\n", "\"auth\": \"ZGVwbG95OnMzY3JldFBhc3M=\"", "Authorization: Bearer ",
	"Qx7vT2mK9pL4nR8s", "3f8a9c2e1b7d4f60a5c3e9b8d7f6a1c2", "?password=", "&token=", ";Password=", "<password>", "</password>",
	"curl -u admin:", "mysql -p", "sshpass -p ", "hooks.slack.com/services/", "https://", "@tcp(",
}

func FuzzFindMatchesWholeText(f *testing.F) {
	for _, s := range fragments {
		f.Add(s + " = \n" + s)
	}
	s := Default()
	f.Fuzz(func(t *testing.T, text string) {
		if got, want := s.Find(text), findWhole(s, text); !slices.Equal(got, want) {
			for _, r := range text {
				if r >= 0x80 {
					t.Skip("non-ASCII text: (?i) folds ſ and K into keywords the prefilter does not see")
				}
			}
			t.Fatalf("%q: Find %v, whole text %v", text, got, want)
		}
	})
}

func TestRedact(t *testing.T) {
	s := Default()
	cases := []struct {
		name, text, rule string
	}{
		{"aws key id", `aws_access_key_id = "AKIAZ3MSJ7PQWERTY2XA"`, "aws-access-token"},
		{"aws secret ending in /", "AWS_SECRET_ACCESS_KEY=kT9vQ2mX8pL4nR7sW1yB3cF6hJ0dG5aE9uZ2xY/", "generic-api-key"},
		// Token-shaped strings are split, so that no scanner takes this
		// file for a leak.
		{"github", `token := "ghp_` + `Qx7vT2mK9pL4nR8sWc3Jf6Hd1Gb5Ze0Ya2Ux"`, "github-pat"},
		{"gitlab runner", "glrt-" + "t1_Qx7vT2mK9pL4nR8sWc3Jf6Hd1Gb5Ze0Y.01kq7z2m9", "gitlab-runner-authentication-token-routable"},
		{"slack app", "xapp-" + "1-A04QX7VT2MK-7390518264071-9f3c1a7e5b2d8c4f6a0e9b3d7c1f5a8e2b6d0c4f8a3e7b1d5c9f2a6e0b4d8c3f", "slack-app-token"},
		{"anthropic admin", "sk-ant-admin01-" + strings.Repeat("Ab3_x", 18) + "Ab3AA", "anthropic-admin-api-key"},
		{"password in .env", "DB_PASSWORD=hunter2hunter", "ctxd-secret-assignment"},
		{"password with $", `password: "pa$word!2024"`, "ctxd-secret-assignment"},
		{"yaml client secret", "client_secret: Qx7vT2mK9pL4nR8s", "generic-api-key"},
		{"url password", "DATABASE_URL=postgres://admin:s3cr3tP4ss@db.internal:5432/app", "ctxd-url-password"},
		{"private key without END", "-----BEGIN PRIVATE KEY-----\n" + strings.Repeat("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n", 4), "ctxd-private-key"},
		{"docker auth", `{"auths": {"r.acme.dev": {"auth": "ZGVwbG95OnMzY3JldFBhc3M="}}}`, "generic-api-key"},
		{"docker auth, low entropy", `{"auths": {"r.acme.dev": {"auth": "dTpwdzEyMzQ="}}}`, "ctxd-docker-auth"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			text := "line one\n" + c.text + "\nline three\n"
			out, found := s.Redact(text)
			if len(found) != 1 || found[0].Rule != c.rule || found[0].Line != 2 {
				t.Fatalf("found %+v, want one of rule %s on line 2", found, c.rule)
			}
			f := found[0]
			if want := text[:f.Start] + "[REDACTED:" + c.rule + "]" + text[f.End:]; out != want {
				t.Errorf("redacted to %q, want %q", out, want)
			}
			if !strings.HasPrefix(out, "line one\n") || !strings.HasSuffix(out, "\nline three\n") {
				t.Errorf("redaction touched other lines: %q", out)
			}
		})
	}
}

func TestRedactLeavesOrdinaryTextAlone(t *testing.T) {
	s := Default()
	for _, text := range []string{
		"",
		"func password(p string) error { return check(p) }",
		`password := os.Getenv("PASSWORD")`,
		`secret = "${VAULT_SECRET}"`,
		"DB_PASSWORD=$DB_PASSWORD",
		`password = "changeme"`,
		"see https://example.org/docs:8080/path",
		`token: "xxxxxxxxxxxx"`,
		"aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
	} {
		if out, found := s.Redact(text); len(found) != 0 || out != text {
			t.Errorf("%q redacted as %+v", text, found)
		}
	}
}

func TestFindIsDeterministicAndOrdered(t *testing.T) {
	s := Default()
	for _, c := range loadCorpus(t) {
		a, b := s.Find(c.text), s.Find(c.text)
		if !slices.Equal(a, b) {
			t.Fatalf("corpus.txt:%d: %v then %v", c.line, a, b)
		}
		for i, f := range a {
			if f.Start >= f.End || i > 0 && f.Start < a[i-1].End || f.Line != 1+strings.Count(c.text[:f.Start], "\n") {
				t.Fatalf("corpus.txt:%d: findings out of order or overlapping: %v", c.line, a)
			}
		}
	}
}

func TestKeywordMatcherFindsEveryOccurrence(t *testing.T) {
	t.Parallel()
	keywords := []string{"key", "ey", "sk", "api_key", "-----begin", "a", "token", "oken", "hooks.slack.com"}
	m := newKeywordMatcher(keywords)
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := "keyKEYsaptoinAPI_-b.gh \n"
	for range 2000 {
		b := make([]byte, rng.IntN(2000))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		text := string(b)
		var want []hit
		lower := strings.ToLower(text)
		for i := range lower {
			for id, k := range keywords {
				if strings.HasPrefix(lower[i:], k) {
					want = append(want, hit{i, id})
				}
			}
		}
		var quarters [4][]hit
		got := m.appendHits(text, nil, &quarters)
		cmp := func(a, b hit) int {
			if a.start != b.start {
				return a.start - b.start
			}
			return a.id - b.id
		}
		slices.SortFunc(got, cmp)
		slices.SortFunc(want, cmp)
		if !slices.Equal(got, want) {
			t.Fatalf("%q: got %v, want %v", text, got, want)
		}
	}
}

// TestLitFilterNeverHidesAMatch runs every allowlist pattern on texts
// made of its own words: where the pattern matches, the filter must
// allow it.
func TestLitFilterNeverHidesAMatch(t *testing.T) {
	t.Parallel()
	s := Default()
	var pats []pattern
	for _, r := range s.rules {
		for _, a := range r.allow {
			pats = append(pats, a.pats...)
		}
	}
	for _, a := range s.global {
		pats = append(pats, a.pats...)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	checked := 0
	for _, p := range pats {
		if p.filter == nil {
			continue
		}
		words := slices.Clone(fragments)
		for _, w := range strings.FieldsFunc(p.re.String(), func(r rune) bool { return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || r == '_' || r == '-') }) {
			words = append(words, w, strings.ToUpper(w))
		}
		for range 300 {
			var sb strings.Builder
			for range 1 + rng.IntN(6) {
				sb.WriteString(words[rng.IntN(len(words))])
			}
			text := sb.String()
			if p.re.MatchString(text) {
				checked++
				if !p.filter.mayMatch(text) {
					t.Fatalf("%s matches %q but its filter says it cannot", p.re, text)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no text matched any pattern: the test tests nothing")
	}
}

func TestGitleaksConfig(t *testing.T) {
	rs, err := parseGitleaks(gitleaksTOML)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.rules) < 200 {
		t.Errorf("%d rules, want the 200 and more of gitleaks' config", len(rs.rules))
	}
	if rs.rules[len(rs.rules)-1].id != genericRule {
		t.Errorf("last rule %s, want %s (the catch-all comes after the providers')", rs.rules[len(rs.rules)-1].id, genericRule)
	}
	// Where gitleaks runs by path, ctxd does not run at all.
	for _, id := range []string{"pkcs12-file", "kubernetes-secret-yaml", "hashicorp-tf-password"} {
		if rs.skipped[id] == "" {
			t.Errorf("%s not among the skipped rules %v", id, rs.skipped)
		}
	}
	withPre := 0
	for _, r := range rs.rules {
		if r.pre != nil {
			withPre++
		}
	}
	t.Logf("%d rules, %d with a precheck, skipped %v", len(rs.rules), withPre, rs.skipped)
	if _, err := parseGitleaks([]byte("[[rules]]\nid = \"x\"\nregex = 'x'\nsurprise = 1\n")); err == nil {
		t.Error("a config with an unknown key parsed")
	}
}

func TestLineBreaks(t *testing.T) {
	for _, c := range []struct {
		expr string
		want int
	}{
		{`abc`, 0},
		{`a[^\n]*b`, 0},
		{`a\s{0,3}b`, 3},
		{`a(?:\n|\r\n){1,2}b`, 2},
		{`a[\s\S]+b`, -1},
		{`a(?s:.)*b`, -1},
		{`a.*b`, 0},
	} {
		if got, err := lineBreaks(c.expr); err != nil || got != c.want {
			t.Errorf("lineBreaks(%q) = %d, %v; want %d", c.expr, got, err, c.want)
		}
	}
}

func TestKeyNames(t *testing.T) {
	for key, want := range map[string]bool{
		"DB_PASSWORD": true, "dbPassword": true, "PGPASSWORD": true, "client_secret": true, "clientSecret": true,
		"APIKey": true, "api_key": true, "x-api-key": true, "SMTP_PASS": true, "AWS_SECRET_ACCESS_KEY": true,
		"passwordHash": false, "tokenType": false, "secretName": false, "public_key": false, "bypass": false,
		"PASSWORD_MIN_LENGTH": false, "tokenEOF": false, "key": false,
	} {
		if got := keyOK(key); got != want {
			t.Errorf("keyOK(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	for v, want := range map[string]bool{
		"${DB_PASSWORD}": true, "$DB_PASSWORD": true, "$(cat /run/secrets/x)": true, "{{ .Values.pw }}": true, "<your-key>": true,
		"%PASSWORD%": true, "********": true, "xxxxxxxx": true, "sk-ant-...": true, "password": true, "test-token": true,
		"pa$$w0rd!": false, "$ecret!9x": false, "Summer2024!": false, "hunter2hunter": false, "Xk9$mP2#vL": false,
	} {
		if got := placeholder(v); got != want {
			t.Errorf("placeholder(%q) = %v, want %v", v, got, want)
		}
	}
}
