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
	"time"

	"github.com/ctxd/ctxd/bench"
	"github.com/ctxd/ctxd/llamatok"
)

// editsBegin and editsEnd mark the section `ctxd-bench edits` writes.
const (
	editsBegin = "<!-- bench:edits:begin (written by `ctxd-bench edits`; make bench-edits) -->"
	editsEnd   = "<!-- bench:edits:end -->"
)

// repoFlags are the --repo flags: NAME=DIR[:SUB].
type repoFlags []bench.EditsConfig

func (r *repoFlags) String() string { return fmt.Sprint(len(*r)) }

func (r *repoFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return fmt.Errorf("--repo %q: want NAME=DIR or NAME=DIR:SUBDIR", v)
	}
	dir, sub, _ := strings.Cut(rest, ":")
	*r = append(*r, bench.EditsConfig{Name: name, Repo: dir, Sub: sub})
	return nil
}

func cmdEdits(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ctxd-bench edits", flag.ContinueOnError)
	var repos repoFlags
	fs.Var(&repos, "repo", "a history to replay: NAME=DIR[:SUBDIR] (a git work tree or bare repository; the codex is SUBDIR, default all of it); repeat for several")
	gguf := fs.String("gguf", "var/models/smollm2-135m-instruct-q4_1.gguf", "model whose tokenizer counts the codex")
	commits := fs.Int("commits", 200, "the newest first-parent commits that touch the codex, per history")
	reuse := fs.Int("cache-reuse", bench.DefaultReuseChunk, "the smallest chunk, in tokens, the backend.cache_reuse arm's backend shifts")
	doc := fs.String("doc", "", "Markdown file whose bench:edits section is rewritten (none: print the table)")
	jsonOut := fs.String("json", "", "also write the replays, commit by commit, to FILE")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "ctxd-bench edits: replay real histories commit by commit and count what each commit makes the next question re-evaluate, path order against stability order\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(repos) == 0 {
		return errors.New("edits: no --repo given")
	}
	if *commits <= 0 {
		return fmt.Errorf("edits: --commits %d must be positive", *commits)
	}
	if *reuse <= 0 {
		return fmt.Errorf("edits: --cache-reuse %d must be positive", *reuse)
	}
	tok, err := llamatok.Open(*gguf)
	if err != nil {
		return fmt.Errorf("edits: the tokenizer (--gguf): %w", err)
	}
	defer tok.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var runs []bench.EditsRun
	for _, r := range repos {
		r.Commits, r.Counter, r.ReuseChunk = *commits, tok, *reuse
		fmt.Fprintf(stderr, "replaying %s (%s)...\n", r.Name, r.Repo)
		run, err := bench.ReplayEdits(ctx, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "  %d commits in %.1f s\n", len(run.Commits), run.Took)
		runs = append(runs, run)
	}
	body := editsSection(runs, filepath.Base(*gguf), *commits)
	if *jsonOut != "" {
		data, err := json.MarshalIndent(runs, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("edits: %w", err)
		}
	}
	if *doc == "" {
		fmt.Fprint(stdout, body)
		return nil
	}
	return bench.WriteBetween(*doc, editsBegin, editsEnd, body)
}

// editsSection is the section's text.
func editsSection(runs []bench.EditsRun, model string, commits int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured %s by `ctxd-bench edits` (tokens counted with %s's tokenizer; up to %d commits per history).\n\n",
		time.Now().UTC().Format(time.RFC3339), model, commits)
	sb.WriteString(bench.EditsTable(runs))
	sb.WriteString("\n")
	sb.WriteString(bench.EditsNotes(runs))
	sb.WriteString("\nWith `backend.cache_reuse` (an experiment, off by default): the same stability order, but an edit moves only the changed files, to the end, and llama-server shifts the cached files after the first change instead of evaluating them:\n\n")
	sb.WriteString(bench.EditsReuseTable(runs))
	return sb.String()
}
