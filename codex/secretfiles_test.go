package codex

import "testing"

func TestSecretFile(t *testing.T) {
	for p, want := range map[string]bool{
		".env":                     true,
		"deploy/.env":              true,
		".env.local":               true,
		".env.production":          true,
		".ENV.Production":          true,
		".env.example":             false,
		"app/.env.sample":          false,
		".env.template":            false,
		".env.dist":                false,
		".envrc":                   true,
		"environment.go":           false,
		"dotenv.env.go":            false,
		".npmrc":                   true,
		"web/.npmrc":               true,
		".pypirc":                  true,
		".netrc":                   true,
		".git-credentials":         true,
		".dockercfg":               true,
		"home/.docker/config.json": true,
		"config.json":              false,
		".aws/credentials":         true,
		"credentials.go":           false,
		".kube/config":             true,
		"tls/server.pem":           true,
		"tls/server.key":           true,
		"keyboard.go":              false,
		"certs/client.p12":         true,
		"certs/client.pfx":         true,
		"ca.crt":                   false,
		"AuthKey_ABC123.p8":        true,
		"release.jks":              true,
		"vault.kdbx":               true,
		"id_rsa":                   true,
		".ssh/id_ed25519":          true,
		"keys/id_ecdsa_sk":         true,
		"id_rsa.pub":               false,
		"id_test.go":               false,
		"id_":                      false,
		"credentials.json":         true,
		"client_secret_1234.apps.googleusercontent.com.json": true,
		"infra/terraform.tfstate":                            true,
		"infra/terraform.tfstate.backup":                     true,
		"infra/main.tf":                                      false,
		`win\path\.env`:                                      true,
		"README.md":                                          false,
		".pem":                                               false,
	} {
		reason, got := SecretFile(p)
		if got != want {
			t.Errorf("SecretFile(%q) = %q, %v; want %v", p, reason, got, want)
		}
		if got && reason == "" {
			t.Errorf("SecretFile(%q) gives no reason", p)
		}
	}
}
