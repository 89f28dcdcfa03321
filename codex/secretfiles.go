package codex

import (
	"path"
	"strings"
)

// SecretFile reports whether a file is, by its path alone, one that holds
// credentials — environment files, package-manager and network
// credentials, private keys and keystores, cloud and cluster credentials,
// Terraform state — and so is not read unless the operator's include
// patterns name it. reason says what kind of file it is, for the skip
// report. relPath is relative to the tree's root and '/'-separated ('\'
// is taken for a separator too); case does not matter.
//
// Redaction would catch most of what such a file holds, but all of it is
// secret, its formats vary (a keystore is binary, a .netrc line names no
// password) and none of it helps a model read code. Files that document
// the variables rather than hold their values are read: .env.example,
// .env.sample, .env.template, .env.dist, .env.tpl. So are public keys and
// certificates (*.pub, *.crt, *.cer); *.pem is not, though it may hold a
// certificate only.
func SecretFile(relPath string) (reason string, ok bool) {
	p := strings.ToLower(strings.ReplaceAll(relPath, `\`, "/"))
	base := path.Base(p)
	if r, ok := secretNames[base]; ok {
		return r, true
	}
	if r, ok := secretInDir[path.Base(path.Dir(p))+"/"+base]; ok {
		return r, true
	}
	switch {
	case base == ".env" || strings.HasPrefix(base, ".env.") && !envDocs[strings.TrimPrefix(base, ".env.")]:
		return "an environment file (.env*): variables with their secret values", true
	case strings.HasPrefix(base, "id_") && len(base) > len("id_") && !strings.Contains(base, "."):
		return "an SSH private key (id_*)", true
	case strings.HasPrefix(base, "client_secret") && strings.HasSuffix(base, ".json"):
		return "an OAuth client secret (client_secret*.json)", true
	}
	for _, e := range secretExts {
		if strings.HasSuffix(base, e.ext) && len(base) > len(e.ext) {
			return e.reason, true
		}
	}
	return "", false
}

// envDocs are the suffixes of .env files that document variables rather
// than hold their values.
var envDocs = map[string]bool{"example": true, "sample": true, "template": true, "dist": true, "tpl": true}

// secretNames are files that hold credentials, by name.
var secretNames = map[string]string{
	".envrc":                               "a direnv file (.envrc): exported variables, secrets among them",
	".npmrc":                               "an npm configuration (.npmrc): registry auth tokens",
	".pypirc":                              "a PyPI configuration (.pypirc): upload tokens and passwords",
	".netrc":                               "a .netrc: logins and passwords",
	"_netrc":                               "a .netrc: logins and passwords",
	".git-credentials":                     "git's credential store (.git-credentials): tokens in URLs",
	".dockercfg":                           "a Docker registry configuration (.dockercfg): registry auth",
	".pgpass":                              "a PostgreSQL password file (.pgpass)",
	".my.cnf":                              "a MySQL option file (.my.cnf): passwords",
	".s3cfg":                               "an s3cmd configuration (.s3cfg): access keys",
	".boto":                                "a boto configuration (.boto): cloud credentials",
	".htpasswd":                            "an .htpasswd: password hashes",
	".vault-token":                         "a Vault token (.vault-token)",
	"credentials.json":                     "a credentials file (credentials.json)",
	"application_default_credentials.json": "Google Cloud application default credentials",
	"kubeconfig":                           "a kubeconfig: cluster credentials",
}

// secretInDir are files that hold credentials, by directory and name.
var secretInDir = map[string]string{
	".docker/config.json": "a Docker configuration (.docker/config.json): registry auth",
	".aws/credentials":    "AWS credentials (.aws/credentials)",
	".kube/config":        "a kubeconfig (.kube/config): cluster credentials",
	"gh/hosts.yml":        "GitHub CLI hosts (gh/hosts.yml): OAuth tokens",
}

// secretExts are files that hold credentials, by extension.
var secretExts = []struct{ ext, reason string }{
	{".pem", "a PEM file (*.pem): private keys, or certificates"},
	{".key", "a private key (*.key)"},
	{".p12", "a PKCS #12 bundle (*.p12): private keys"},
	{".pfx", "a PKCS #12 bundle (*.pfx): private keys"},
	{".p8", "a PKCS #8 private key (*.p8)"},
	{".ppk", "a PuTTY private key (*.ppk)"},
	{".jks", "a Java keystore (*.jks): private keys"},
	{".keystore", "a keystore (*.keystore): private keys"},
	{".kdbx", "a KeePass database (*.kdbx)"},
	{".tfstate", "Terraform state (*.tfstate): secrets in plain text"},
	{".tfstate.backup", "Terraform state (*.tfstate.backup): secrets in plain text"},
}
