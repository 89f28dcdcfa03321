package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
)

const karmaUsage = `usage:
  ctxd karma list [--session S] [--status recorded|verified|rejected] [--pinned] [--stale] [--q TEXT] [--at TIME] [--json]
  ctxd karma show ID
  ctxd karma verify ID [--note TEXT]
  ctxd karma reject ID [--note TEXT]
  ctxd karma pin ID | unpin ID
  ctxd karma supersede ID --by ID2 [--note TEXT]
  ctxd karma epochs SESSION
Each acts as the daemon's default sigil, or as the sigil of $CTXD_TOKEN.`

// cmdKarma lists and judges the traces of the client's sigil.
func cmdKarma(args []string, stdout io.Writer) error {
	k, err := parseKarma(args)
	if err != nil {
		return err
	}
	ctx, c := context.Background(), karmaClient(k.socket)
	switch k.cmd {
	case "list":
		return k.list(ctx, c, stdout)
	case "epochs":
		return k.epochs(ctx, c, stdout)
	case "show":
		return k.show(ctx, c, stdout)
	default:
		return k.judge(ctx, c, stdout)
	}
}

// karmaArgs is a `ctxd karma` command line, parsed.
type karmaArgs struct {
	cmd       string // list, show, epochs, or a judging action (verify, pin…)
	arg       string // the trace id or the session; "" when none was given
	socket    string
	asJSON    bool
	filter    client.KarmaFilter  // list: which traces (At comes from at)
	at        string              // list: --at, as written
	judgement ctxd.KarmaJudgement // a judging action's note, and supersede's --by
}

// parseKarma parses the subcommand, its flags and its one argument.
func parseKarma(args []string) (karmaArgs, error) {
	if len(args) == 0 {
		return karmaArgs{}, errors.New(karmaUsage)
	}
	k := karmaArgs{cmd: args[0]}
	fs := flag.NewFlagSet("karma "+k.cmd, flag.ContinueOnError)
	fs.StringVar(&k.socket, "socket", "", "daemon socket")
	fs.BoolVar(&k.asJSON, "json", false, "print JSON")
	if err := k.defineFlags(fs); err != nil {
		return k, err
	}
	arg, err := parseKarmaFlags(fs, args[1:])
	k.arg = arg
	return k, err
}

// defineFlags defines the flags of k's subcommand on fs, which fills k's
// fields as it parses; an unknown subcommand is an error.
func (k *karmaArgs) defineFlags(fs *flag.FlagSet) error {
	switch k.cmd {
	case "list":
		fs.StringVar(&k.filter.Session, "session", "", "only this session's traces")
		fs.StringVar(&k.filter.Status, "status", "", "only traces in this status: recorded, verified, rejected")
		fs.BoolVar(&k.filter.Pinned, "pinned", false, "only pinned traces")
		fs.BoolVar(&k.filter.Stale, "stale", false, "only the traces the karma block may hold whose code changed since they were verified: what to verify again")
		fs.StringVar(&k.filter.Text, "q", "", "full-text match over query, answer and note")
		fs.StringVar(&k.at, "at", "", "the record as it stood at this RFC 3339 time")
	case ctxd.KarmaVerify, ctxd.KarmaReject, ctxd.KarmaSupersede:
		fs.StringVar(&k.judgement.Note, "note", "", "why")
		if k.cmd == ctxd.KarmaSupersede {
			fs.Int64Var(&k.judgement.By, "by", 0, "the trace that replaces this one")
		}
	case "show", "epochs", ctxd.KarmaPin, ctxd.KarmaUnpin:
	default:
		return fmt.Errorf("unknown karma command %q\n%s", k.cmd, karmaUsage)
	}
	return nil
}

// parseKarmaFlags parses rest with fs and returns the one argument (a
// trace id or a session), which may come before the flags, after them or
// between them: the flags after it count too (flag stops at the first
// argument), and a second argument is an error.
func parseKarmaFlags(fs *flag.FlagSet, rest []string) (string, error) {
	var arg string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		arg, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return "", err
	}
	if arg == "" && fs.NArg() > 0 {
		arg = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return "", err
		}
	}
	if fs.NArg() > 0 {
		return "", fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), karmaUsage)
	}
	return arg, nil
}

// needArg is the error for a subcommand given no argument.
func (k karmaArgs) needArg() error {
	if k.arg == "" {
		return fmt.Errorf("karma %s needs an argument\n%s", k.cmd, karmaUsage)
	}
	return nil
}

// traceID is the argument as a trace id.
func (k karmaArgs) traceID() (int64, error) {
	if err := k.needArg(); err != nil {
		return 0, err
	}
	id, err := strconv.ParseInt(k.arg, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("trace id %q must be a positive number", k.arg)
	}
	return id, nil
}

// karmaClient is the daemon's client, acting as the sigil of $CTXD_TOKEN
// if it is set.
func karmaClient(socket string) *client.Client {
	var opts []client.Option
	if tok := os.Getenv("CTXD_TOKEN"); tok != "" {
		opts = append(opts, client.WithToken(tok))
	}
	return client.New(socketPath(socket), append(opts, daemonUIDs()...)...)
}

// list is `ctxd karma list`: the traces the filter matches, as a table or
// JSON.
func (k karmaArgs) list(ctx context.Context, c *client.Client, stdout io.Writer) error {
	if k.arg != "" {
		return fmt.Errorf("karma list takes no argument %q\n%s", k.arg, karmaUsage)
	}
	f := k.filter
	if k.at != "" {
		t, err := time.Parse(time.RFC3339Nano, k.at)
		if err != nil {
			return fmt.Errorf("--at %q must be an RFC 3339 time, such as 2026-11-25T10:00:00Z", k.at)
		}
		f.At = t
	}
	list, err := c.Karma(ctx, f)
	if err != nil {
		return err
	}
	if k.asJSON {
		return printKarmaJSON(stdout, list)
	}
	return writeTraceTable(stdout, list)
}

// writeTraceTable writes one line per trace: its id, status, pin,
// session, time and the start of its query.
func writeTraceTable(w io.Writer, list []ctxd.Trace) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tPIN\tSESSION\tWHEN\tQUERY")
	for _, t := range list {
		state := t.Status
		if t.SupersededBy != 0 {
			state += fmt.Sprintf(" (superseded by %d)", t.SupersededBy)
		}
		if t.Stale != "" {
			state += ", stale"
		}
		pin := ""
		if t.Pinned {
			pin = "pinned"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, state, pin, t.Session, t.CreatedAt.Local().Format(time.DateTime), clip(t.Query, 60))
	}
	return tw.Flush()
}

// epochs is `ctxd karma epochs SESSION`: the karma the session was shown,
// epoch by epoch, as JSON.
func (k karmaArgs) epochs(ctx context.Context, c *client.Client, stdout io.Writer) error {
	if err := k.needArg(); err != nil {
		return err
	}
	snaps, err := c.SessionKarma(ctx, k.arg)
	if err != nil {
		return err
	}
	return printKarmaJSON(stdout, snaps)
}

// show is `ctxd karma show ID`: the trace and its events, as JSON.
func (k karmaArgs) show(ctx context.Context, c *client.Client, stdout io.Writer) error {
	id, err := k.traceID()
	if err != nil {
		return err
	}
	h, err := c.Trace(ctx, id)
	if err != nil {
		return err
	}
	return printKarmaJSON(stdout, h)
}

// judge is `ctxd karma verify|reject|pin|unpin|supersede ID`: the
// judgement sent, and the trace as it stands after it.
func (k karmaArgs) judge(ctx context.Context, c *client.Client, stdout io.Writer) error {
	id, err := k.traceID()
	if err != nil {
		return err
	}
	if k.cmd == ctxd.KarmaSupersede && k.judgement.By <= 0 {
		return errors.New("supersede needs --by ID2, the trace that replaces it")
	}
	t, err := c.Judge(ctx, id, k.cmd, k.judgement)
	if err != nil {
		return err
	}
	if k.asJSON {
		return printKarmaJSON(stdout, t)
	}
	fmt.Fprintf(stdout, "trace %d: %s", t.ID, t.Status)
	if t.Pinned {
		fmt.Fprint(stdout, ", pinned")
	}
	if t.SupersededBy != 0 {
		fmt.Fprintf(stdout, ", superseded by %d", t.SupersededBy)
	}
	fmt.Fprintln(stdout, " (sessions take it in at their next karma epoch)")
	return nil
}

// printKarmaJSON writes v as indented JSON.
func printKarmaJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
