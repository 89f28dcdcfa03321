package main

import (
	"errors"
	"fmt"
	"io"
	"regexp"

	"github.com/ctxd/ctxd/sigils"
)

var sigilNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// cmdSigil is `ctxd sigil token NAME`: a new token for the sigil, shown
// once, and the line that configures its hash. The daemon stores only the
// hash, so a lost token is replaced, never recovered.
func cmdSigil(args []string, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "token" {
		return errors.New("usage: ctxd sigil token NAME")
	}
	name := args[1]
	if !sigilNameRE.MatchString(name) {
		return fmt.Errorf("sigil name %q must match %s", name, sigilNameRE)
	}
	tok, hash, err := sigils.NewToken()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, `# The token for sigil %q, shown this once: give it to the agent
# (Authorization: Bearer, or the OpenAI/Ollama client's API key).
%s

# Add these lines at the end of the daemon's config file (only the hash is
# kept), then restart the daemon:
[sigils.%s]
scopes = ["ask"]     # keep the sigil's own scopes if it has them
token_sha256 = %q
`, name, tok, name, hash)
	return nil
}
