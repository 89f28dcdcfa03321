package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/modelgen"
)

// RealModel is a trained model the real-models phase measures, in a
// window of NumCtx, at the codex sizes Sizes (tokens).
type RealModel struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	NumCtx int    `json:"num_ctx"`
	Sizes  []int  `json:"sizes"`
}

// RealRun is the llama-server phase's sizes on one trained model.
type RealRun struct {
	Model  string      `json:"model"`
	File   string      `json:"file"`
	NumCtx int         `json:"num_ctx"`
	Server string      `json:"server"`
	Sizes  []LlamaSize `json:"sizes"`
}

// realPhase measures cold and warm turns and ctxd's overhead on each
// trained model, as llamaPhase does on the generated one.
func realPhase(ctx context.Context, cfg Config) ([]RealRun, error) {
	var runs []RealRun
	for _, rm := range cfg.RealModels {
		path, err := filepath.Abs(rm.Path)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("bench: real models: %s: %w (make models fetches it)", rm.Name, err)
		}
		run, err := realRun(ctx, cfg, rm, path)
		if err != nil {
			return nil, fmt.Errorf("bench: real models: %s: %w", rm.Name, err)
		}
		runs = append(runs, run)
	}
	return runs, nil
}

func realRun(ctx context.Context, cfg Config, rm RealModel, path string) (RealRun, error) {
	run := RealRun{Model: rm.Name, File: filepath.Base(path), NumCtx: rm.NumCtx}
	tok, err := llamatok.Open(path)
	if err != nil {
		return run, err
	}
	defer tok.Close()
	work, err := os.MkdirTemp("", "ctxd-bench-real-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(work)
	cfg.Log("real models: %s, window %d, codex sizes %v", rm.Name, rm.NumCtx, rm.Sizes)
	run.Sizes, run.Server, err = llamaSizes(ctx, cfg, modelgen.Config{Name: rm.Name}, path, tok, work, rm.NumCtx, rm.Sizes)
	return run, err
}

// realMarkdown writes the trained models' section.
func (r *Report) realMarkdown(b *strings.Builder) {
	if len(r.Real) == 0 {
		return
	}
	fmt.Fprintf(b, "### The same figures on trained models\n\nMeasured %s (`make bench BENCH_FLAGS=\"--phases real-models\"`), as the section above measures the generated model: cold (a session's first turn after the codex loaded) and warm (its next three turns) time to first token through ctxd on llama-server and on Ollama %s, and ctxd − raw llama-server for the same token ids (%d pairs each).\n\n",
		r.ranAt(PhaseReal), r.Machine.Ollama, r.Config.LlamaPairs)
	b.WriteString("| model (window) | codex + stable blocks | llama-server cold | llama-server warm (tokens evaluated) | Ollama cold | Ollama warm | ctxd − raw llama-server, p50 | ctxd inside, p50 (governor) |\n|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Real {
		for _, s := range run.Sizes {
			var ev []float64
			for _, e := range s.LlamaWarmEvaluated {
				ev = append(ev, float64(e))
			}
			fmt.Fprintf(b, "| %s (%s) | %s tokens | %s | %s (%.0f) | %s | %s | %.2f ms | %.2f ms (%.2f ms) |\n", run.Model, thousands(run.NumCtx), thousands(s.StableTokens),
				msLabel(s.LlamaColdMs), msLabel(percentile(s.LlamaWarmMs, 0.5)), percentile(ev, 0.5), msLabel(s.OllamaColdMs), msLabel(percentile(s.OllamaWarmMs, 0.5)), s.OverheadP50, s.OwnP50, s.GovernorP50)
		}
	}
	b.WriteString("\nThe models as published: SmolLM2 in its ChatML template; Gemma 3 270M, which has none, in ctxd's plain format. The governor's share is counting: ctxd counts a prompt as the stable prefix's cached count plus the rest, except for a tokenizer whose merges cross the end of the stable prefix (Gemma 3's does, on this prefix), whose prompts it counts whole: the governor column shows what that costs beside a warm turn.s time to first token.\n\n")
}
