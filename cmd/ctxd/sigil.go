package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/sigils"
)

const sigilUsage = `usage:
  ctxd sigil add NAME [--preset agent | --scopes ask,karma:read] [--description TEXT] [--uid N]... [--gid N]... [--config FILE]
  ctxd sigil token NAME [--preset agent | --scopes S]   a new token, and the sigil's lines for the config
presets: agent (ask, tools, search_codex, sessions:read, karma:read: what a coding agent needs), ask
  ctxd sigil revoke NAME --config FILE [--all]`

// cmdSigil manages sigils. The daemon stores only a token's hash, so a
// token is shown once, when it is made; a lost token is replaced, never
// recovered.
func cmdSigil(args []string, stdout io.Writer) error {
	if len(args) < 1 {
		return errors.New(sigilUsage)
	}
	switch args[0] {
	case "add":
		return cmdSigilAdd(args[1:], stdout)
	case "token":
		return cmdSigilToken(args[1:], stdout)
	case "revoke":
		return cmdSigilRevoke(args[1:], stdout)
	}
	return fmt.Errorf("unknown sigil command %q\n%s", args[0], sigilUsage)
}

// sigilName takes the NAME argument off the front of args (so flags may
// follow it) and checks it.
func sigilName(args []string) (string, []string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", nil, errors.New(sigilUsage)
	}
	if !sigils.NameRE.MatchString(args[0]) {
		return "", nil, fmt.Errorf("sigil name %q must match %s", args[0], sigils.NameRE)
	}
	return args[0], args[1:], nil
}

type intList []int

func (l *intList) String() string { return fmt.Sprint(*l) }
func (l *intList) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a uid/gid", s)
	}
	*l = append(*l, n)
	return nil
}

// cmdSigilAdd is `ctxd sigil add NAME`: a new sigil with a new token. The
// token is printed once; the [sigils.NAME] table is printed, or appended
// to --config.
func cmdSigilAdd(args []string, stdout io.Writer) error {
	name, rest, err := sigilName(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("sigil add", flag.ContinueOnError)
	scopes := fs.String("scopes", "", "comma-separated scopes: ask, search_codex, tools, tool:NAME, karma:read, karma:write (default: ask)")
	preset := fs.String("preset", "", "a preset set of scopes: agent, ask")
	desc := fs.String("description", "", "what the sigil is for")
	cfgPath := fs.String("config", "", "append the sigil to this config file (default: print it)")
	var uids, gids intList
	fs.Var(&uids, "uid", "a uid allowed to act as the sigil on the socket (repeatable; default: any)")
	fs.Var(&gids, "gid", "a gid allowed to act as the sigil on the socket (repeatable; default: any)")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), sigilUsage)
	}
	sc, err := scopesOf(*preset, *scopes, "ask")
	if err != nil {
		return err
	}
	tok, hash, err := sigils.NewToken()
	if err != nil {
		return err
	}
	var table bytes.Buffer
	fmt.Fprintf(&table, "[sigils.%s]\n", name)
	if *desc != "" {
		fmt.Fprintf(&table, "description = %s\n", tomlQuote(*desc))
	}
	fmt.Fprintf(&table, "scopes = %s\n", tomlStrings(sc))
	if len(uids) > 0 {
		fmt.Fprintf(&table, "uids = %s\n", tomlInts(uids))
	}
	if len(gids) > 0 {
		fmt.Fprintf(&table, "gids = %s\n", tomlInts(gids))
	}
	fmt.Fprintf(&table, "token_sha256 = %q\n", hash)

	fmt.Fprintf(stdout, "# The token for sigil %q, shown this once: give it to the agent\n# (Authorization: Bearer, or the OpenAI/Ollama client's API key).\n%s\n\n", name, tok)
	if *cfgPath == "" {
		fmt.Fprintf(stdout, "# Add these lines at the end of the daemon's config file (only the hash is\n# kept), then restart the daemon:\n%s", table.String())
		return nil
	}
	if err := appendSigil(*cfgPath, name, table.String()); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "# Added [sigils.%s] to %s; restart the daemon to use it.\n", name, *cfgPath)
	return nil
}

// scopesOf is the scopes a preset or a comma-separated list names (one of
// them, not both), sorted; neither: the preset def.
func scopesOf(preset, list, def string) ([]string, error) {
	if preset != "" && list != "" {
		return nil, errors.New("--preset and --scopes: give one of them")
	}
	if preset == "" && list == "" {
		preset = def
	}
	if preset != "" {
		sc, ok := sigils.Presets[preset]
		if !ok {
			return nil, fmt.Errorf("--preset %q: not a preset; the presets are agent and ask", preset)
		}
		return slices.Sorted(slices.Values(sc)), nil
	}
	var sc []string
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if err := sigils.CheckScope(s); err != nil {
			return nil, err
		}
		sc = append(sc, s)
	}
	slices.Sort(sc)
	return slices.Compact(sc), nil
}

// appendSigil appends a sigil's table to a config file, after checking
// that the file does not define it already and that the result is valid.
func appendSigil(path, name, table string) error {
	cfg, err := config.Load(path, processEnv())
	if err != nil {
		return err
	}
	if _, ok := cfg.Sigils[name]; ok {
		return fmt.Errorf("%s already defines sigil %q: use `ctxd sigil token %s` for a new token", path, name, name)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		data = append(data, '\n')
	}
	data = append(data, "\n"+table...)
	tmp, err := os.CreateTemp(dirOf(path), ".ctxd-config-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	next, err := config.Load(tmp.Name(), processEnv())
	if err == nil {
		err = next.Validate()
	}
	if err != nil {
		return fmt.Errorf("the config with sigil %q added would not be valid (nothing written): %w", name, err)
	}
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), info.Mode().Perm()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func dirOf(path string) string {
	if i := strings.LastIndex(path, "/"); i >= 0 {
		return path[:i+1]
	}
	return "."
}

// cmdSigilToken is `ctxd sigil token NAME`: a new token for a sigil, shown
// once, and the line that configures its hash.
func cmdSigilToken(args []string, stdout io.Writer) error {
	name, rest, err := sigilName(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("sigil token", flag.ContinueOnError)
	scopes := fs.String("scopes", "", "comma-separated scopes for the printed lines")
	preset := fs.String("preset", "", "a preset set of scopes for the printed lines: agent (default), ask")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), sigilUsage)
	}
	sc, err := scopesOf(*preset, *scopes, "agent")
	if err != nil {
		return err
	}
	tok, hash, err := sigils.NewToken()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, `# The token for sigil %q, shown this once: give it to the agent
# (Authorization: Bearer, or the OpenAI/Ollama client's API key).
%s

# Add these lines at the end of the daemon's config file (only the hash is
# kept), then restart the daemon. If the sigil is defined already, set its
# token_sha256 to this hash instead, and list the old hash in its
# revoked_sha256 (`+"`ctxd sigil revoke %s --config FILE`"+` prints the line).
[sigils.%s]
scopes = %s     # keep the sigil's own scopes if it has them
token_sha256 = %q
`, name, tok, name, name, tomlStrings(sc), hash)
	return nil
}

// cmdSigilRevoke is `ctxd sigil revoke NAME`: the lines that revoke the
// sigil's current token (a new token is then made with `ctxd sigil
// token`), or with --all the whole sigil.
func cmdSigilRevoke(args []string, stdout io.Writer) error {
	name, rest, err := sigilName(args)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("sigil revoke", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "the daemon's config file (required)")
	all := fs.Bool("all", false, "revoke the sigil itself: every request acting as it is refused")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if *cfgPath == "" {
		return errors.New("--config FILE is required: revoking needs the sigil's current token hash")
	}
	cfg, err := config.Load(*cfgPath, processEnv())
	if err != nil {
		return err
	}
	s, ok := cfg.Sigils[name]
	if !ok {
		return fmt.Errorf("%s defines no sigil %q", *cfgPath, name)
	}
	if *all {
		fmt.Fprintf(stdout, "# In [sigils.%s] of %s, add this line, then restart the daemon:\nrevoked = true\n", name, *cfgPath)
		return nil
	}
	if s.TokenSHA256 == "" {
		return fmt.Errorf("sigil %q has no token to revoke", name)
	}
	revoked := append(slices.Clone(s.RevokedSHA256), s.TokenSHA256)
	fmt.Fprintf(stdout, `# In [sigils.%s] of %s, replace the token_sha256 line (and any
# revoked_sha256 line) with this one, then restart the daemon. The old token
# is then refused as revoked; `+"`ctxd sigil token %s`"+` makes a new one.
revoked_sha256 = %s
`, name, *cfgPath, name, tomlStrings(revoked))
	return nil
}

// tomlQuote is s as a TOML basic string: quotes and backslashes escaped,
// control characters as \uXXXX (Go's strconv.Quote writes escapes TOML
// does not have, such as \x00).
func tomlQuote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, "\\u%04X", r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = tomlQuote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func tomlInts(ns []int) string {
	q := make([]string, len(ns))
	for i, n := range ns {
		q[i] = strconv.Itoa(n)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
