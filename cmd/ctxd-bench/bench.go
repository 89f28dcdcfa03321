package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/ctxd/ctxd/bench"
)

func cmdBench(args []string, stdout, stderr io.Writer) error {
	cfg := bench.DefaultConfig()
	fs := flag.NewFlagSet("ctxd-bench", flag.ContinueOnError)
	fs.StringVar(&cfg.OllamaBin, "ollama", "bin/ollama", "the ollama binary to run")
	fs.StringVar(&cfg.OllamaLabel, "ollama-version", "", "Ollama version to report when the binary reports 0.0.0")
	fs.StringVar(&cfg.ModelPath, "model", "var/models/ctxd-bench.gguf", "bench model (written if missing or stale)")
	out := fs.String("out", "docs/bench", "directory for results.json and the plots ("+bench.ScalingPlot+", "+bench.TurnsPlot+")")
	doc := fs.String("doc", "docs/benchmarks.md", "Markdown file whose harness section is rewritten")
	readme := fs.String("readme", "", "README whose figures (between the bench:readme markers) are rewritten")
	phases := fs.String("phases", "", "comma-separated phases to run ("+strings.Join(bench.AllPhases, ", ")+"); the others keep the results in DIR/results.json")
	fs.StringVar(&cfg.AgentModelPath, "agent-model", "var/models/ctxd-demo.gguf", "model of the many-agents phase (written if missing or stale)")
	fs.IntVar(&cfg.Agents, "agents", cfg.Agents, "agents of the many-agents phase")
	fs.IntVar(&cfg.AgentTurns, "agent-turns", cfg.AgentTurns, "turns per agent")
	fs.StringVar(&cfg.LlamaServerBin, "llama-server", os.Getenv("CTXD_LLAMA_SERVER"), "llama.cpp's llama-server, for the llamacpp phase (default $CTXD_LLAMA_SERVER; none: the phase is skipped)")
	fs.StringVar(&cfg.CtxdBin, "ctxd", "", "the ctxd binary, for the dashboard phase (none: the phase is skipped)")
	fs.IntVar(&cfg.Turns, "turns", cfg.Turns, "turns of the multi-turn session")
	fs.IntVar(&cfg.ColdRepeats, "cold-repeats", cfg.ColdRepeats, "cold first turns to measure (the session's own included)")
	fs.IntVar(&cfg.NumCtx, "num-ctx", cfg.NumCtx, "context window")
	fs.StringVar(&cfg.RAGTree, "rag-tree", cfg.RAGTree, "tree of the rag phase")
	fs.StringVar(&cfg.RAGPackage, "rag-package", cfg.RAGPackage, "directory of the rag tree its questions are about")
	fs.StringVar(&cfg.QualityDir, "quality-dir", cfg.QualityDir, "question sets of the quality phase (NAME/questions.json, NAME/codex)")
	fs.IntVar(&cfg.QualityMax, "quality-max", 0, "ask only the first N questions of each quality set (0: all)")
	fs.IntVar(&cfg.CacheReuse, "cache-reuse", bench.DefaultReuseChunk, "the reuse phase's backend.cache_reuse: the smallest chunk, in tokens, llama-server shifts")
	qualityModel := fs.String("quality-model", "", "the quality and reuse phases' model instead of SmolLM2: NAME=GGUF:NUM_CTX:RAG_NUM_CTX")
	from := fs.String("from", "", "rewrite the outputs from an earlier results.json instead of running")
	replot := fs.Bool("replot", false, "only redraw the plots in DIR from DIR/results.json (or --from), without running")
	driftBase := fs.String("drift-baseline", "", "LABEL=FILE: show the drift phase beside the one in FILE (a results.json an earlier daemon's ctxd-bench wrote just before, with the same settings)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run (the in-process daemons included) to FILE, for `go tool pprof`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every setting is a flag (ctxd-bench --help)", fs.Arg(0))
	}
	if *replot {
		src := *from
		if src == "" {
			src = filepath.Join(*out, "results.json")
		}
		r, err := bench.ReadReport(src)
		if err != nil {
			return fmt.Errorf("bench --replot: %w", err)
		}
		paths, err := r.WritePlots(*out)
		for _, p := range paths {
			fmt.Fprintln(stdout, p)
		}
		return err
	}
	if *from != "" {
		r, err := bench.ReadReport(*from)
		if err != nil {
			return err
		}
		return r.Write(*out, *doc, *readme)
	}
	if *qualityModel != "" {
		var m bench.QualityModel
		name, rest, ok := strings.Cut(*qualityModel, "=")
		parts := strings.Split(rest, ":")
		if !ok || name == "" || len(parts) != 3 {
			return fmt.Errorf("--quality-model %q: want NAME=GGUF:NUM_CTX:RAG_NUM_CTX", *qualityModel)
		}
		m.Name, m.Path = name, parts[0]
		if _, err := fmt.Sscan(parts[1], &m.NumCtx); err != nil {
			return fmt.Errorf("--quality-model: NUM_CTX %q: %w", parts[1], err)
		}
		if _, err := fmt.Sscan(parts[2], &m.RAGNumCtx); err != nil {
			return fmt.Errorf("--quality-model: RAG_NUM_CTX %q: %w", parts[2], err)
		}
		cfg.QualityModels = []bench.QualityModel{m}
	}
	if *phases != "" {
		cfg.Phases = strings.Split(*phases, ",")
	}
	// The last run's results: the phases not run now keep them, and the
	// overhead is compared with them.
	prev, err := bench.ReadReport(filepath.Join(*out, "results.json"))
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	cfg.Log = func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	baseline, err := driftBaseline(*driftBase)
	if err != nil {
		return err
	}
	r, err := bench.Run(ctx, cfg, prev)
	if err != nil {
		return err
	}
	if baseline != nil {
		r.DriftBaseline = baseline
	}
	if err := r.Write(*out, *doc, *readme); err != nil {
		return err
	}
	fmt.Fprint(stdout, r.Markdown(*out))
	return nil
}

// driftBaseline reads --drift-baseline LABEL=FILE (nil if not given).
func driftBaseline(flag string) (*bench.DriftBaseline, error) {
	if flag == "" {
		return nil, nil
	}
	label, file, ok := strings.Cut(flag, "=")
	if !ok || label == "" || file == "" {
		return nil, fmt.Errorf("--drift-baseline %q: want LABEL=FILE", flag)
	}
	base, err := bench.ReadReport(file)
	if err != nil {
		return nil, fmt.Errorf("--drift-baseline: %w", err)
	}
	if len(base.Drift) == 0 {
		return nil, fmt.Errorf("--drift-baseline: %s holds no drift phase", file)
	}
	return &bench.DriftBaseline{Label: label, Runs: base.Drift}, nil
}
