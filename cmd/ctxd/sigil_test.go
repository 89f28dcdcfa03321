package main

import (
	"bytes"
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
	scopes := map[string][]string{}
	for name, s := range cfg.Sigils {
		scopes[name] = s.Scopes
	}
	reg, err := sigils.NewRegistry(scopes, cfg.Daemon.DefaultSigil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.SetToken("agent", cfg.Sigils["agent"].TokenSHA256); err != nil {
		t.Fatal(err)
	}
	if s, err := reg.Authenticate(token); err != nil || s.Name != "agent" || !sigils.Allows(s, sigils.ScopeAsk) {
		t.Errorf("the printed token: %+v %v", s, err)
	}
	if strings.Contains(cfgText, token) {
		t.Error("the configuration holds the token itself, not only its hash")
	}
	if code := run([]string{"sigil", "token", "Bad Name"}, &out, &errOut); code == 0 {
		t.Error("a bad sigil name was accepted")
	}
}
