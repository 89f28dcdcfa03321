package secrets

import (
	"strings"
	"testing"
)

// TestRedactsWhatRoundTwoFoundMissing: the passwords of .netrc and
// .pgpass files and a kubeconfig's client key and token, which the trust
// round's corpus found redaction missing (issue 27, finding 3), are
// redacted; look-alikes are not.
func TestRedactsWhatRoundTwoFoundMissing(t *testing.T) {
	const clientKey = "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpNSUlFb3dJQkFBS0NBUUVBdGVzdGtleWRhdGE="
	for _, c := range []struct{ name, text, secret string }{
		{"netrc one line", "machine api.example.com login bob password hunter2xyz\n", "hunter2xyz"},
		{"netrc lines", "machine git.example.org\n  login alice\n  password s3cr3t-Pw0rd\n", "s3cr3t-Pw0rd"},
		{"pgpass", "db.internal:5432:app:appuser:Zq8!pw-77x\n", "Zq8!pw-77x"},
		{"pgpass wildcards", "*:*:*:postgres:N0tTheDefault9\n", "N0tTheDefault9"},
		{"kubeconfig client key", "users:\n- name: admin\n  user:\n    client-certificate-data: TUlJQ2xUQ0NBWDBDQ\n    client-key-data: " + clientKey + "\n", clientKey},
		{"kubeconfig token", "users:\n- name: ci\n  user:\n    token: eyJhbGciOiJSUzI1NiIsImtpZCI6IjFhYjIifQ.abc\n", "eyJhbGciOiJSUzI1NiIsImtpZCI6IjFhYjIifQ.abc"},
	} {
		out, found := Default().Redact(c.text)
		if strings.Contains(out, c.secret) || len(found) == 0 {
			t.Errorf("%s: not redacted: %q", c.name, out)
		}
	}
	for _, c := range []struct{ name, text string }{
		{"prose", "The machine learning password policy is described below.\n"},
		{"time", "12:30:45:00:99\n"},
		{"ipv6", "fe80::1ff:fe23:4567:890a\n"},
		{"token field", "    token: string\n"},
	} {
		if out, found := Default().Redact(c.text); len(found) != 0 {
			t.Errorf("%s: redacted a look-alike: %q (%v)", c.name, out, found)
		}
	}
}
