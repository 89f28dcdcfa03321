package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/ctxd/ctxd"
)

func cmdCodex(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("codex: give a subcommand: load PATH, or stats")
	}
	switch args[0] {
	case "load":
		return cmdCodexLoad(args[1:], stdout, stderr)
	case "stats":
		return cmdCodexStats(args[1:], stdout)
	case "bench":
		return cmdCodexBench(args[1:], stdout)
	}
	return fmt.Errorf("codex: unknown subcommand %q (load, stats, bench)", args[0])
}

func cmdCodexLoad(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("codex load", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("codex load: give the path of a directory or file")
	}
	path, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var bar *progressbar.ProgressBar
	stage := ""
	tty := false
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		tty = true
	}
	st, err := clientFor(*socket).LoadCodex(ctx, path, func(p ctxd.CodexProgress) {
		if !tty {
			if p.Stage == ctxd.CodexStageIndexing {
				fmt.Fprintf(stderr, "codex: indexing %d/%d files\n", p.Files, p.TotalFiles)
			} else {
				fmt.Fprintf(stderr, "codex: reading %d/%d files, %d/%d bytes\n", p.Files, p.TotalFiles, p.Bytes, p.TotalBytes)
			}
			return
		}
		if bar == nil || stage != p.Stage {
			if bar != nil {
				_ = bar.Finish()
			}
			stage = p.Stage
			total, unit := p.TotalBytes, progressbar.OptionShowBytes(true)
			if p.Stage == ctxd.CodexStageIndexing {
				total, unit = int64(p.TotalFiles), progressbar.OptionShowCount()
			}
			bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(stderr), unit,
				progressbar.OptionSetDescription("codex: "+p.Stage), progressbar.OptionClearOnFinish())
		}
		if p.Stage == ctxd.CodexStageIndexing {
			_ = bar.Set64(int64(p.Files))
			bar.Describe(fmt.Sprintf("codex: indexing %d/%d files", p.Files, p.TotalFiles))
			return
		}
		_ = bar.Set64(p.Bytes)
		bar.Describe(fmt.Sprintf("codex: reading %d/%d files", p.Files, p.TotalFiles))
	})
	if bar != nil {
		_ = bar.Finish()
	}
	if err != nil {
		return fmt.Errorf("codex load: %w", err)
	}
	printCodexStats(stdout, st)
	return nil
}

func cmdCodexStats(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("codex stats", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var st ctxd.CodexStats
	if err := clientFor(*socket).GetJSON(context.Background(), "/v1/codex", &st); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printCodexStats(stdout, &st)
	return nil
}

func printCodexStats(w io.Writer, st *ctxd.CodexStats) {
	fmt.Fprintf(w, "codex %s (%s)\n", st.Name, st.Root)
	tokens := fmt.Sprintf("%d tokens", st.Tokens)
	switch {
	case st.TokensExact:
	case st.Counting != nil && st.Counting.Error != "":
		tokens = fmt.Sprintf("tokens not counted (%s)", st.Counting.Error)
	case st.Counting != nil:
		tokens = fmt.Sprintf("tokens counting, %.0f%%", st.Counting.Percent)
	}
	fmt.Fprintf(w, "  %d files, %d lines, %d bytes, %s; loaded in %.0f ms (%d files read)\n", st.Files, st.Lines, st.Bytes, tokens, st.LoadMillis, st.Read)
	fmt.Fprintf(w, "  mode %s: %s\n", st.Plan.Mode, st.Plan.Reason)
	if o := st.Order; o.Kind != "" {
		fmt.Fprintf(w, "  order: %s\n", orderLine(o))
	}
	if len(st.Largest) > 0 {
		fmt.Fprintln(w, "  largest files by tokens:")
		for _, f := range st.Largest {
			fmt.Fprintf(w, "    %8d  %s\n", f.Tokens, f.Path)
		}
	}
	if !st.Redacting {
		fmt.Fprintln(w, "  secret redaction is OFF for this codex")
	}
	fmt.Fprintf(w, "  %d credentials redacted\n", st.Redactions)
	for _, f := range st.Redacted {
		for _, r := range f.Redactions {
			fmt.Fprintf(w, "    %s:%d  %s\n", f.Path, r.Line, r.Rule)
		}
	}
	if len(st.Skipped) > 0 {
		fmt.Fprintf(w, "  %d skipped:\n", len(st.Skipped))
		for i, s := range st.Skipped {
			if i == 20 {
				fmt.Fprintf(w, "    ... and %d more (ctxd codex stats --json)\n", len(st.Skipped)-20)
				break
			}
			fmt.Fprintf(w, "    %s: %s\n", s.Path, s.Reason)
		}
	}
}

// orderLine says in a line what order the files render in and what the
// last load did to it.
func orderLine(o ctxd.CodexOrder) string {
	s := o.Kind
	if o.Kind == ctxd.OrderStability {
		s += ", the files that change least first (" + o.Source + ")"
	}
	if !o.Kept {
		return s + "; made at this load"
	}
	if len(o.Changed) == 0 && len(o.Removed) == 0 {
		return s + "; kept, nothing changed"
	}
	if o.EditsLast {
		s += fmt.Sprintf("; kept to file %d, then the others in their order and the %d changed or new file(s) at the end (backend.cache_reuse)", o.From+1, len(o.Changed))
	} else {
		s += fmt.Sprintf("; kept to file %d, the rest arranged again with %d changed or new file(s)", o.From+1, len(o.Changed))
	}
	if len(o.Removed) > 0 {
		s += fmt.Sprintf(", %d removed", len(o.Removed))
	}
	if len(o.Changed) > 0 {
		s += ": " + strings.Join(o.Changed[:min(5, len(o.Changed))], ", ")
		if len(o.Changed) > 5 {
			s += ", …"
		}
	}
	return s
}
