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
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codexsvc"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/tokencount"
)

// benchSink takes the codex the service publishes.
type benchSink struct{ r ctxd.Retriever }

func (b *benchSink) SetCodex(_ runcontext.Codex, _ ctxd.CodexPlan, r ctxd.Retriever, _ governor.Limits) {
	b.r = r
}

// codexBenchResult is what `ctxd codex bench` measures.
type codexBenchResult struct {
	Tree          string    `json:"tree"`
	Tokenizer     string    `json:"tokenizer"`
	LongestToken  int       `json:"longest_token_bytes"`
	NumCtx        int       `json:"num_ctx"`
	Files         int       `json:"files"`
	Bytes         int64     `json:"bytes"`
	Lines         int64     `json:"lines"`
	Tokens        int64     `json:"tokens"`
	TokensExact   bool      `json:"tokens_exact"`
	Redactions    int       `json:"redactions"`
	Skipped       int       `json:"skipped"`
	Mode          string    `json:"mode"`
	Reason        string    `json:"reason"`
	FirstMs       []float64 `json:"first_load_ms"`
	ReloadMs      []float64 `json:"reload_unchanged_ms"`
	ReloadRead    []int     `json:"reload_unchanged_files_read"`
	ChangedMs     []float64 `json:"reload_one_changed_ms"`
	ChangedRead   []int     `json:"reload_one_changed_files_read"`
	ChangedIndex  []int     `json:"reload_one_changed_files_reindexed"`
	CountAllMs    float64   `json:"background_count_ms"`
	SearchMs      float64   `json:"search_ms"`
	IndexBytes    int64     `json:"index_bytes"`
	StateDirBytes int64     `json:"state_dir_bytes"`
}

func cmdCodexBench(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("codex bench", flag.ContinueOnError)
	gguf := fs.String("gguf", "", "model whose tokenizer counts (required)")
	runs := fs.Int("runs", 3, "repetitions of each measurement")
	numCtx := fs.Int("num-ctx", 16384, "the window the codex is planned against")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *gguf == "" {
		return errors.New("codex bench: usage: ctxd codex bench --gguf MODEL.gguf PATH")
	}
	lt, err := llamatok.Open(*gguf)
	if err != nil {
		return err
	}
	defer lt.Close()
	tok := lt
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
	time.Sleep(100 * time.Millisecond) // past the timestamps' granularity: the copy is not racily clean
	res := codexBenchResult{Tree: fs.Arg(0), Tokenizer: filepath.Base(*gguf), LongestToken: lt.MaxTokenBytes(), NumCtx: *numCtx}
	cc := config.Default(config.Env{Home: scratch}).Codex
	cc.MaxTotalBytes = 0
	cc.Watch = false // the watcher's start is not part of reading the tree
	limits := governor.Limits{NumCtx: *numCtx, AnswerReserve: 128}
	// service starts the codex service as a daemon (re)start does: nothing
	// in memory, the state directory as the last run left it.
	service := func(stateDir string) *codexsvc.Service {
		return codexsvc.New(codexsvc.Config{
			Settings: codexsvc.Settings{Walk: cc.WalkOptions(), CAGRatio: cc.CAGRatio}, StateDir: stateDir, Limits: limits,
			Tokenizer: tok, TokenizerID: "bench", Counter: tokencount.New(tok, nil),
			Stable: func(c runcontext.Codex) (runcontext.Rendered, error) {
				return runcontext.Plain{}.Render(&runcontext.RunContext{
					Identity: runcontext.Identity{Name: "ctxd", Persona: "bench"}, Codex: c,
					Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
					Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
				})
			},
			Sink: &benchSink{},
		})
	}
	ctx := context.Background()
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	timed := func(s *codexsvc.Service) (ctxd.CodexStats, float64, error) {
		start := time.Now()
		st, err := s.Load(ctx, tree, nil)
		return st, ms(time.Since(start)), err
	}
	if p := os.Getenv("ZZPROF"); p != "" {
		pf, _ := os.Create(p)
		pprof.StartCPUProfile(pf)
		defer pprof.StopCPUProfile()
	}
	for r := range *runs {
		stateDir := filepath.Join(scratch, fmt.Sprintf("state-%d", r))
		s := service(stateDir)
		st, took, err := timed(s)
		if err != nil {
			s.Close()
			return err
		}
		res.FirstMs = append(res.FirstMs, took)
		res.Files, res.Bytes, res.Lines, res.Redactions, res.Skipped = st.Files, st.Bytes, st.Lines, st.Redactions, len(st.Skipped)
		res.Mode, res.Reason = st.Plan.Mode, st.Plan.Reason
		if r == 0 {
			start := time.Now()
			if _, err := s.Search(ctx, "parse the JSON encoding of a struct field tag", 5); err != nil && st.Plan.Mode == runcontext.ModeRAG {
				s.Close()
				return err
			}
			res.SearchMs = ms(time.Since(start))
			// The whole-tree count, as the background count does it (at
			// low priority there; here waited for, to time it).
			start = time.Now()
			for {
				cur, _ := s.Stats()
				if cur.TokensExact || (cur.Counting != nil && cur.Counting.Error != "") {
					res.Tokens, res.TokensExact = cur.Tokens, cur.TokensExact
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			res.CountAllMs = ms(time.Since(start))
		}
		s.Close()
		// Restart: an unchanged tree reloads from the stat index.
		s = service(stateDir)
		st, took, err = timed(s)
		if err != nil {
			s.Close()
			return err
		}
		res.ReloadMs = append(res.ReloadMs, took)
		res.ReloadRead = append(res.ReloadRead, st.Read)
		// Change one file, then reload.
		target := filepath.Join(tree, "zz-ctxd-bench-changed.go")
		if f, err := pickFile(tree); err == nil {
			target = f
		}
		f, err := os.OpenFile(target, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			s.Close()
			return err
		}
		fmt.Fprintf(f, "\n// changed by ctxd codex bench, run %d\n", r)
		f.Close()
		time.Sleep(100 * time.Millisecond) // as an editor's save is, before the watcher's reload
		st, took, err = timed(s)
		s.Close()
		if err != nil {
			return err
		}
		res.ChangedMs = append(res.ChangedMs, took)
		res.ChangedRead = append(res.ChangedRead, st.Read)
		res.ChangedIndex = append(res.ChangedIndex, st.Reindexed)
		res.IndexBytes = fileSize(filepath.Join(stateDir, "codex-index.db")) + fileSize(filepath.Join(stateDir, "codex-index.db-wal"))
		res.StateDirBytes = dirSize(stateDir)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	fmt.Fprintf(stdout, "tree %s: %d files, %d lines, %d bytes, %d tokens (exact %t; %s, longest token %d bytes), %d redactions, %d skipped\n",
		res.Tree, res.Files, res.Lines, res.Bytes, res.Tokens, res.TokensExact, res.Tokenizer, res.LongestToken, res.Redactions, res.Skipped)
	fmt.Fprintf(stdout, "mode %s: %s\n", res.Mode, res.Reason)
	fmt.Fprintf(stdout, "first load (empty state)   median %8.0f ms  %v\n", median(res.FirstMs), res.FirstMs)
	fmt.Fprintf(stdout, "reload, unchanged tree     median %8.0f ms  %v  (files read: %v)\n", median(res.ReloadMs), res.ReloadMs, res.ReloadRead)
	fmt.Fprintf(stdout, "reload, one file changed   median %8.0f ms  %v  (files read: %v, re-indexed: %v)\n", median(res.ChangedMs), res.ChangedMs, res.ChangedRead, res.ChangedIndex)
	fmt.Fprintf(stdout, "whole-tree count (background) %.0f ms; a search %.1f ms; index %d bytes\n", res.CountAllMs, res.SearchMs, res.IndexBytes)
	return nil
}

// pickFile is a file in the middle of the tree, in path order.
func pickFile(root string) (string, error) {
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(p, ".go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil || len(files) == 0 {
		return "", errors.New("no Go file")
	}
	return files[len(files)/2], nil
}

func fileSize(p string) int64 {
	if fi, err := os.Stat(p); err == nil {
		return fi.Size()
	}
	return 0
}

func dirSize(root string) int64 {
	var n int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n += fileSize(p)
		}
		return nil
	})
	return n
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
