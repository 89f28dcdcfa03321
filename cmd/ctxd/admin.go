package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/httpapi"
)

// timingParts says where an answer's time to first token went.
func timingParts(t ctxd.Timing) string {
	parts := []string{fmt.Sprintf("queue %.0f", t.QueueWaitMs), fmt.Sprintf("governor %.0f", t.GovernorMs)}
	if t.CondenseMs >= 1 {
		parts[1] += fmt.Sprintf(" of which condensing %.0f", t.CondenseMs)
	}
	if t.RestoreMs >= 1 {
		parts = append(parts, fmt.Sprintf("restore %.0f", t.RestoreMs))
	}
	parts = append(parts, fmt.Sprintf("backend %.0f", t.BackendTTFTMs))
	if t.OtherMs >= 1 {
		parts = append(parts, fmt.Sprintf("other %.0f", t.OtherMs))
	}
	return strings.Join(parts, ", ")
}

func cmdReload(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("reload", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	token := fs.String("token", "", "an admin sigil's token (default $CTXD_TOKEN; none: the daemon's default sigil)")
	asJSON := fs.Bool("json", false, "print the outcome as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var st httpapi.ReloadStatus
	if err := tokenClient(*socket, *token).Reload(context.Background(), &st); err != nil {
		return fmt.Errorf("reload refused, the daemon's configuration stays as it was: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(st)
	}
	fmt.Fprintf(stdout, "reloaded %s\n", or(st.File, "(built-in defaults)"))
	fmt.Fprintf(stdout, "  in force now: %s\n", or(strings.Join(st.Applied, ", "), "nothing changed"))
	if len(st.NeedsRestart) > 0 {
		fmt.Fprintf(stdout, "  changed, but take effect at the next start: %s\n", strings.Join(st.NeedsRestart, ", "))
	}
	return nil
}

func cmdLogLevel(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("log-level", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	token := fs.String("token", "", "an admin sigil's token (default $CTXD_TOKEN; none: the daemon's default sigil)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return errors.New("log-level: give at most one level: debug, info, warn or error")
	}
	level, err := tokenClient(*socket, *token).LogLevel(context.Background(), fs.Arg(0))
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, level)
	return nil
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// tokenClient is a client that presents token, else $CTXD_TOKEN, else
// none (acting as the daemon's default sigil).
func tokenClient(socket, token string) *client.Client { return actorClient(socket, token, "") }

// actorClient is a client that acts as a sigil: the one token (else
// $CTXD_TOKEN) authenticates, or on the socket the one sigil names (else
// $CTXD_SIGIL), else the daemon's default sigil. It is how the CLI reaches
// what an agent did through a door (its sessions, their prompts).
func actorClient(socket, token, sigil string) *client.Client {
	if token == "" {
		token = os.Getenv("CTXD_TOKEN")
	}
	if sigil == "" {
		sigil = os.Getenv("CTXD_SIGIL")
	}
	opts := daemonUIDs()
	if token != "" {
		opts = append(opts, client.WithToken(token))
	}
	if sigil != "" {
		opts = append(opts, client.WithSigil(sigil))
	}
	return client.New(socketPath(socket), opts...)
}
