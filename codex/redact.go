package codex

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/secrets"
)

// redactRules names the redaction rules (package secrets: gitleaks' rules
// and ctxd's own, by their data and source) and this file, which applies
// them. What reading a content found is cached under it (cacheKey), so
// other rules read every file again.
var redactRules = secrets.Version() + "+" + func() string {
	sum := sha256.Sum256(redactSource)
	return hex.EncodeToString(sum[:6])
}()

//go:embed redact.go
var redactSource []byte

// redact replaces every credential in s with a marker naming its rule,
// "[REDACTED:rule]", and returns the new text and what it replaced, by
// rule and line. Text that is not a credential is left as it is, and the
// same s always gives the same result. Without findings s is returned as
// it is (no copy).
func redact(s string) (string, []ctxd.Redaction) {
	out, found := secrets.Default().Redact(s)
	if len(found) == 0 {
		return s, nil
	}
	rs := make([]ctxd.Redaction, len(found))
	for i, f := range found {
		rs[i] = ctxd.Redaction{Rule: f.Rule, Line: f.Line}
	}
	return out, rs
}
