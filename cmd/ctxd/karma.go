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
  ctxd karma list [--session S] [--status recorded|verified|rejected] [--pinned] [--q TEXT] [--at TIME] [--json]
  ctxd karma show ID
  ctxd karma verify ID [--note TEXT]
  ctxd karma reject ID [--note TEXT]
  ctxd karma pin ID | unpin ID
  ctxd karma supersede ID --by ID2 [--note TEXT]
  ctxd karma epochs SESSION
Each acts as the daemon's default sigil, or as the sigil of $CTXD_TOKEN.`

// cmdKarma lists and judges the traces of the client's sigil.
func cmdKarma(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(karmaUsage)
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("karma "+cmd, flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	asJSON := fs.Bool("json", false, "print JSON")
	var (
		note, session, status, text, at *string
		by                              *int64
		pinned                          *bool
	)
	switch cmd {
	case "list":
		session = fs.String("session", "", "only this session's traces")
		status = fs.String("status", "", "only traces in this status: recorded, verified, rejected")
		pinned = fs.Bool("pinned", false, "only pinned traces")
		text = fs.String("q", "", "full-text match over query, answer and note")
		at = fs.String("at", "", "the record as it stood at this RFC 3339 time")
	case ctxd.KarmaVerify, ctxd.KarmaReject, ctxd.KarmaSupersede:
		note = fs.String("note", "", "why")
		if cmd == ctxd.KarmaSupersede {
			by = fs.Int64("by", 0, "the trace that replaces this one")
		}
	case "show", "epochs", ctxd.KarmaPin, ctxd.KarmaUnpin:
	default:
		return fmt.Errorf("unknown karma command %q\n%s", cmd, karmaUsage)
	}
	// The id (or session) may come before the flags.
	var arg string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		arg, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if arg == "" && fs.NArg() > 0 {
		arg = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q\n%s", fs.Args(), karmaUsage)
	}
	ctx := context.Background()
	var opts []client.Option
	if tok := os.Getenv("CTXD_TOKEN"); tok != "" {
		opts = append(opts, client.WithToken(tok))
	}
	c := client.New(socketPath(*socket), append(opts, daemonUIDs()...)...)
	print := func(v any) error {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	if cmd == "list" {
		if arg != "" {
			return fmt.Errorf("karma list takes no argument %q\n%s", arg, karmaUsage)
		}
		f := client.KarmaFilter{Session: *session, Status: *status, Pinned: *pinned, Text: *text}
		if *at != "" {
			t, err := time.Parse(time.RFC3339Nano, *at)
			if err != nil {
				return fmt.Errorf("--at %q must be an RFC 3339 time, such as 2026-11-25T10:00:00Z", *at)
			}
			f.At = t
		}
		list, err := c.Karma(ctx, f)
		if err != nil || *asJSON {
			if err == nil {
				err = print(list)
			}
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATUS\tPIN\tSESSION\tWHEN\tQUERY")
		for _, t := range list {
			state := t.Status
			if t.SupersededBy != 0 {
				state += fmt.Sprintf(" (superseded by %d)", t.SupersededBy)
			}
			pin := ""
			if t.Pinned {
				pin = "pinned"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, state, pin, t.Session, t.CreatedAt.Local().Format(time.DateTime), clip(t.Query, 60))
		}
		return tw.Flush()
	}
	if arg == "" {
		return fmt.Errorf("karma %s needs an argument\n%s", cmd, karmaUsage)
	}
	if cmd == "epochs" {
		snaps, err := c.SessionKarma(ctx, arg)
		if err == nil {
			err = print(snaps)
		}
		return err
	}
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("trace id %q must be a positive number", arg)
	}
	if cmd == "show" {
		h, err := c.Trace(ctx, id)
		if err == nil {
			err = print(h)
		}
		return err
	}
	j := ctxd.KarmaJudgement{}
	if note != nil {
		j.Note = *note
	}
	if by != nil {
		if *by <= 0 {
			return errors.New("supersede needs --by ID2, the trace that replaces it")
		}
		j.By = *by
	}
	t, err := c.Judge(ctx, id, cmd, j)
	if err != nil {
		return err
	}
	if *asJSON {
		return print(t)
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

func clip(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
