package codex

import (
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	cases := []struct {
		name, text, rule string
	}{
		{"private key", "-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("MIIEowIBAAKCAQEAx", 8) + "\n-----END RSA PRIVATE KEY-----\n", "private-key"},
		{"aws key id", `aws_access_key_id = "AKIAZ3MSJ7PQWERTY2XA"`, "aws-access-key-id"},
		{"aws secret", `AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKE`, "aws-secret-access-key"},
		{"github", "token := \"ghp_" + strings.Repeat("aB3", 12) + "\"", "github-token"},
		{"gitlab", "glpat-" + "x1Y2z3W4v5U6t7S8r9Q0", "gitlab-token"},
		{"slack", "xoxb-1234567890-abcdefghij", "slack-token"},
		{"stripe", "sk_live_" + strings.Repeat("4eC39HqLyjWDarjtT1zdp7dc", 1), "stripe-key"},
		{"google", "AIza" + strings.Repeat("SyA1b2C3d4E5f6G7", 2) + "h8I", "google-api-key"},
		{"jwt", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"},
		{"connection string", "DATABASE_URL=postgres://admin:s3cr3tP4ss@db.internal:5432/app", "connection-string-password"},
		{"password assignment", `password: "hunter2hunter2"`, "password-assignment"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, found := redact("line one\n" + c.text + "\nline three\n")
			if len(found) == 0 || found[0].Rule != c.rule || found[0].Line != 2 {
				t.Fatalf("found %+v, want rule %s on line 2", found, c.rule)
			}
			if !strings.Contains(out, "[REDACTED:"+c.rule+"]") {
				t.Errorf("no marker naming %s in %q", c.rule, out)
			}
			if !strings.HasPrefix(out, "line one\n") || !strings.HasSuffix(out, "\nline three\n") {
				t.Errorf("redaction touched other lines: %q", out)
			}
		})
	}
}

func TestRedactLeavesOrdinaryCodeAlone(t *testing.T) {
	for _, s := range []string{
		"func password(p string) error { return check(p) }",
		`password := os.Getenv("PASSWORD")`,
		`secret = "${VAULT_SECRET}"`,
		"see https://example.org/docs:8080/path",
		`token: "xxxxxxxxxxxx"`,
	} {
		if out, found := redact(s); len(found) != 0 || out != s {
			t.Errorf("%q redacted as %+v", s, found)
		}
	}
}

func TestLoadRedactsByDefaultAndReports(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "config.env", "API_KEY=\"sk_live_4eC39HqLyjWDarjtT1zdp7dc\"\nDEBUG=1\n")
	c, err := Load(t.Context(), dir, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if c.Redactions() != 1 || strings.Contains(c.Body(), "4eC39HqLyjWD") || len(c.Files[0].Redactions) != 1 {
		t.Errorf("redactions %d, body %q", c.Redactions(), c.Body())
	}
	off, err := Load(t.Context(), dir, Options{NoRedact: true})
	if err != nil {
		t.Fatal(err)
	}
	if off.Redactions() != 0 || !strings.Contains(off.Body(), "4eC39HqLyjWD") {
		t.Errorf("redaction off still redacted: %q", off.Body())
	}
}
