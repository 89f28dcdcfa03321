package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/sigils"
)

// TestSigilTokenSetsUpTheDoors follows the README's set-up of the front
// doors on ctxd.toml literally: the [sigils.agent] lines `ctxd sigil token
// agent` prints, added at the end of the file, with tcp_listen uncommented, make a valid
// configuration in which the printed token authenticates as sigil "agent".
func TestSigilTokenSetsUpTheDoors(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"sigil", "token", "agent"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	token := regexp.MustCompile(`(?m)^ctxd_[A-Za-z0-9_-]{43}$`).FindString(out.String())
	if token == "" {
		t.Fatalf("no token in the output:\n%s", out.String())
	}
	repo, err := os.ReadFile(filepath.Join("..", "..", "ctxd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	const commented = `# tcp_listen = "127.0.0.1:11435"`
	if !bytes.Contains(repo, []byte(commented)) {
		t.Fatalf("ctxd.toml has no %s line for the README's set-up", commented)
	}
	i := strings.Index(out.String(), "[sigils.agent]")
	if i < 0 {
		t.Fatalf("no [sigils.agent] table in the output:\n%s", out.String())
	}
	cfgText := strings.Replace(string(repo), commented, strings.TrimPrefix(commented, "# "), 1) + "\n" + out.String()[i:]
	path := filepath.Join(t.TempDir(), "ctxd.toml")
	if err := os.WriteFile(path, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, config.Env{UID: os.Getuid(), Home: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Daemon.TCPListen != "127.0.0.1:11435" {
		t.Errorf("tcp_listen %q", cfg.Daemon.TCPListen)
	}
	reg := registryOf(t, cfg)
	// An agent offers its tools: the printed sigil may (the agent preset).
	if s, err := reg.Authenticate(token); err != nil || s.Name != "agent" || !sigils.Allows(s, sigils.ScopeAsk) || !sigils.AllowsTool(s, "bash") {
		t.Errorf("the printed token: %+v %v", s, err)
	}
	if strings.Contains(cfgText, token) {
		t.Error("the configuration holds the token itself, not only its hash")
	}
	if code := run([]string{"sigil", "token", "Bad Name"}, &out, &errOut); code == 0 {
		t.Error("a bad sigil name was accepted")
	}
}

func registryOf(t *testing.T, cfg config.Config) *sigils.Registry {
	t.Helper()
	defs := map[string]sigils.Def{}
	for name, s := range cfg.Sigils {
		defs[name] = sigils.Def{Scopes: s.Scopes, TokenSHA256: s.TokenSHA256, RevokedSHA256: s.RevokedSHA256,
			UIDs: s.UIDs, GIDs: s.GIDs, Revoked: s.Revoked}
	}
	reg, err := sigils.New(defs, cfg.Daemon.DefaultSigil)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestSigilAddAndRevoke: `ctxd sigil add --config` appends a sigil whose
// printed token authenticates; `ctxd sigil revoke` prints the line that,
// put in place of its token_sha256, makes the same token refused as revoked.
func TestSigilAddAndRevoke(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ctxd.toml")
	if err := os.WriteFile(path, []byte("# mine\n[sigils.default]\nscopes = [\"ask\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	args := []string{"sigil", "add", "ci", "--scopes", "ask,karma:read", "--description", "the CI bot\x00 \"quoted\" \\ tab\t", "--uid", "1000", "--config", path}
	if code := run(args, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	token := regexp.MustCompile(`(?m)^ctxd_[A-Za-z0-9_-]{43}$`).FindString(out.String())
	cfg, err := config.Load(path, config.Env{UID: os.Getuid(), Home: dir})
	if err != nil {
		t.Fatal(err)
	}
	ci := cfg.Sigils["ci"]
	if token == "" || ci.Description != "the CI bot\x00 \"quoted\" \\ tab\t" || len(ci.UIDs) != 1 || ci.UIDs[0] != 1000 || strings.Join(ci.Scopes, " ") != "ask karma:read" {
		t.Fatalf("sigil ci %+v, token %q", ci, token)
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "# mine\n") || strings.Contains(string(data), token) {
		t.Errorf("config file after add:\n%s", data)
	}
	if s, err := registryOf(t, cfg).Authenticate(token); err != nil || s.Name != "ci" {
		t.Fatalf("the added token: %+v %v", s, err)
	}
	if code := run(args, &out, &errOut); code == 0 {
		t.Error("adding the same sigil twice was accepted")
	}
	for _, bad := range [][]string{
		{"sigil", "add", "x", "--scopes", "root"},
		{"sigil", "add", "x", "--preset", "root"},
		{"sigil", "add", "x", "--preset", "agent", "--scopes", "ask"},
		{"sigil", "add", "Bad Name"},
		{"sigil", "revoke", "ci"},
		{"sigil", "revoke", "nobody", "--config", path},
		{"sigil", "frobnicate"},
	} {
		errOut.Reset()
		if code := run(bad, &out, &errOut); code == 0 || errOut.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", bad, code, errOut.String())
		}
	}

	out.Reset()
	if code := run([]string{"sigil", "add", "coder", "--preset", "agent", "--config", path}, &out, &errOut); code != 0 {
		t.Fatalf("add --preset agent: exit %d: %s", code, errOut.String())
	}
	if cfg, err = config.Load(path, config.Env{UID: os.Getuid(), Home: dir}); err != nil || strings.Join(cfg.Sigils["coder"].Scopes, " ") != "ask karma:read search_codex sessions:read tools" {
		t.Errorf("--preset agent: scopes %v (%v)", cfg.Sigils["coder"].Scopes, err)
	}

	out.Reset()
	if code := run([]string{"sigil", "revoke", "ci", "--config", path}, &out, &errOut); code != 0 {
		t.Fatalf("revoke: exit %d: %s", code, errOut.String())
	}
	line := regexp.MustCompile(`(?m)^revoked_sha256 = .*$`).FindString(out.String())
	if line == "" {
		t.Fatalf("no revoked_sha256 line:\n%s", out.String())
	}
	revoked := regexp.MustCompile(`(?m)^token_sha256 = .*$`).ReplaceAllString(string(data), line)
	if err := os.WriteFile(path, []byte(revoked), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = config.Load(path, config.Env{UID: os.Getuid(), Home: dir})
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registryOf(t, cfg).Authenticate(token); !errors.Is(err, sigils.ErrRevoked) {
		t.Errorf("the revoked token: %v", err)
	}
}
