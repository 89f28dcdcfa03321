package codex

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The rules themselves are tested in package secrets, with its corpus;
// here, how loading uses them.

func TestRedact(t *testing.T) {
	cases := []struct {
		name, text, rule string
	}{
		{"private key", "-----BEGIN RSA PRIVATE KEY-----\n" + strings.Repeat("MIIEowIBAAKCAQEAx9vQ2mX8pL4nR7sW\n", 4) + "-----END RSA PRIVATE KEY-----", "private-key"},
		{"aws key id", `aws_access_key_id = "AKIAZ3MSJ7PQWERTY2XA"`, "aws-access-token"},
		{"password in .env", "DB_PASSWORD=hunter2hunter", "ctxd-secret-assignment"},
		{"connection string", "DATABASE_URL=postgres://admin:s3cr3tP4ss@db.internal:5432/app", "ctxd-url-password"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, found := redact("line one\n" + c.text + "\nline three\n")
			if len(found) != 1 || found[0].Rule != c.rule || found[0].Line != 2 {
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

// TestCacheRereadsWhenRulesChange: what was found with other redaction
// rules (an older ctxd's) is not used: the file is read and redacted
// again, and the stale entry is dropped on saving.
func TestCacheRereadsWhenRulesChange(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "app.yaml", "db:\n  password: hunter2hunter\n")
	old := time.Now().Add(-time.Hour)
	must(t, os.Chtimes(filepath.Join(dir, "app.yaml"), old, old))
	cachePath := filepath.Join(t.TempDir(), "cache")
	load := func() *Codex {
		t.Helper()
		cache, err := OpenCache(cachePath, "tok")
		if err != nil {
			t.Fatal(err)
		}
		c, err := Load(t.Context(), dir, Options{Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		if err := cache.Save(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	if first := load(); first.Read != 1 || first.Redactions() != 1 {
		t.Fatalf("first load: %d read, %d redactions", first.Read, first.Redactions())
	}
	if again := load(); again.Read != 0 || again.Redactions() != 1 {
		t.Fatalf("unchanged reload: %d read, %d redactions", again.Read, again.Redactions())
	}

	// Make the cache an older ctxd's: its entries found by other rules,
	// which found nothing.
	data, err := os.ReadFile(cachePath)
	if err != nil {
		t.Fatal(err)
	}
	var cf cacheFile
	if err := cf.decode(data); err != nil {
		t.Fatal(err)
	}
	stale := map[cacheKey]cacheEntry{}
	for k, e := range cf.Entries {
		k.Rules, e.Redactions = "gitleaks-v0.0.0+ctxd-0+000000000000", nil
		stale[k] = e
	}
	cf.Entries = stale
	if err := os.WriteFile(cachePath, cf.encode(), 0o600); err != nil {
		t.Fatal(err)
	}

	upgraded := load()
	if upgraded.Read != 1 || upgraded.Redactions() != 1 {
		t.Errorf("after a rules change: %d read, %d redactions; want the file read again and redacted", upgraded.Read, upgraded.Redactions())
	}
	cache, err := OpenCache(cachePath, "tok")
	if err != nil {
		t.Fatal(err)
	}
	for k := range cache.entries {
		if k.Rules != redactRules {
			t.Errorf("entry for rules %q kept", k.Rules)
		}
	}
	if cache.Len() != 1 {
		t.Errorf("cache holds %d contents, want 1", cache.Len())
	}
}
