package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/llamatok"
)

// countingTokenizer counts calls, to show that a reload re-counts only
// changed files.
type countingTokenizer struct {
	tok   *llamatok.Tokenizer
	calls atomic.Int64
}

func (c *countingTokenizer) CountText(s string) (int, error) {
	c.calls.Add(1)
	return c.tok.CountText(s)
}

// codexBenchResult is what `ctxd codex bench` measures.
type codexBenchResult struct {
	Tree         string    `json:"tree"`
	Tokenizer    string    `json:"tokenizer"`
	Files        int       `json:"files"`
	Bytes        int64     `json:"bytes"`
	Tokens       int64     `json:"tokens"`
	Redactions   int       `json:"redactions"`
	Skipped      int       `json:"skipped"`
	FirstMs      []float64 `json:"first_load_ms"`
	ReloadMs     []float64 `json:"reload_unchanged_ms"`
	ChangedMs    []float64 `json:"reload_one_changed_ms"`
	ChangedCalls []int64   `json:"recounted_files_after_one_change"`
}

func cmdCodexBench(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("codex bench", flag.ContinueOnError)
	gguf := fs.String("gguf", "", "model whose tokenizer counts (required)")
	runs := fs.Int("runs", 3, "repetitions of each measurement")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *gguf == "" {
		return errors.New("codex bench: usage: ctxd codex bench --gguf MODEL.gguf PATH")
	}
	tok, err := llamatok.Open(*gguf)
	if err != nil {
		return err
	}
	defer tok.Close()
	// Work on a copy, so one file can be changed without touching the tree.
	scratch, err := os.MkdirTemp("", "ctxd-codex-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	tree := filepath.Join(scratch, "tree")
	if err := copyTree(fs.Arg(0), tree); err != nil {
		return fmt.Errorf("codex bench: copy the tree: %w", err)
	}
	res := codexBenchResult{Tree: fs.Arg(0), Tokenizer: filepath.Base(*gguf)}
	ct := &countingTokenizer{tok: tok}
	load := func(cachePath string) (*codex.Codex, time.Duration, error) {
		cache, err := codex.OpenCache(cachePath, "bench")
		if err != nil {
			return nil, 0, err
		}
		start := time.Now()
		opts := codex.DefaultOptions()
		opts.MaxTotalBytes = 0
		opts.Counter, opts.Cache = ct, cache
		c, err := codex.Load(context.Background(), tree, opts)
		if err != nil {
			return nil, 0, err
		}
		_ = c.Body() // rendering is part of the job
		took := time.Since(start)
		return c, took, cache.Save()
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	for r := range *runs {
		cachePath := filepath.Join(scratch, fmt.Sprintf("cache-%d", r))
		c, took, err := load(cachePath)
		if err != nil {
			return err
		}
		res.FirstMs = append(res.FirstMs, ms(took))
		res.Files, res.Bytes, res.Tokens, res.Redactions, res.Skipped = len(c.Files), c.Bytes(), c.Tokens, c.Redactions(), len(c.Skipped)
		if _, took, err = load(cachePath); err != nil {
			return err
		}
		res.ReloadMs = append(res.ReloadMs, ms(took))
		// Change one file, then reload.
		target := filepath.Join(tree, filepath.FromSlash(c.Files[len(c.Files)/2].Path))
		f, err := os.OpenFile(target, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		fmt.Fprintf(f, "\n// changed by ctxd codex bench, run %d\n", r)
		f.Close()
		before := ct.calls.Load()
		if _, took, err = load(cachePath); err != nil {
			return err
		}
		res.ChangedMs = append(res.ChangedMs, ms(took))
		res.ChangedCalls = append(res.ChangedCalls, ct.calls.Load()-before)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(stdout, "tree %s: %d files, %d bytes, %d tokens (%s), %d redactions, %d skipped\n",
		res.Tree, res.Files, res.Bytes, res.Tokens, res.Tokenizer, res.Redactions, res.Skipped)
	fmt.Fprintf(stdout, "first load (empty cache)   median %8.0f ms  %v\n", median(res.FirstMs), res.FirstMs)
	fmt.Fprintf(stdout, "reload, unchanged tree     median %8.0f ms  %v\n", median(res.ReloadMs), res.ReloadMs)
	fmt.Fprintf(stdout, "reload, one file changed   median %8.0f ms  %v  (files re-counted: %v)\n", median(res.ChangedMs), res.ChangedMs, res.ChangedCalls)
	return nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// copyTree copies regular files and directories (not links) from src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(out, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return nil // unreadable files are the loader's business; the copy skips them
			}
			return os.WriteFile(out, b, 0o644)
		}
		return nil
	})
}
