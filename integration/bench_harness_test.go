package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/bench"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/realmodel"
)

// TestBenchHarnessSmoke runs the harness end to end, small, and checks the
// report it writes is complete; it asserts no times.
func TestBenchHarnessSmoke(t *testing.T) {
	needOllama(t)
	cfg := bench.DefaultConfig()
	cfg.OllamaBin = ollamatest.Binary(t)
	cfg.Model = testModel()
	cfg.ModelPath = modelPath(t, cfg.Model)
	cfg.NumCtx, cfg.Turns, cfg.Overhead, cfg.ColdRepeats = 2048, 3, 3, 2
	cfg.ScalingPcts = []int{20, 85}
	cfg.Agents, cfg.AgentTurns, cfg.AgentSlots = 3, 2, []int{1, 2}
	cfg.AgentModel, cfg.AgentModelPath = cfg.Model, cfg.ModelPath
	// The phases on the trained models have their smoke test of their own.
	cfg.Phases = slices.DeleteFunc(slices.Clone(bench.AllPhases), func(p string) bool { return p == bench.PhaseQuality || p == bench.PhaseReal })
	r, err := bench.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	mt := r.MultiTurn
	t.Logf("overhead: paired %v (ctxd %v, direct %v, backend eval %.1f / %.1f ms); own %v",
		r.Overhead.Samples, r.Overhead.CtxdTTFTMs, r.Overhead.DirectTTFTMs, r.Overhead.CtxdEvalMs, r.Overhead.DirectEvalMs, r.Overhead.OwnSamples)
	if len(mt.Ctxd.Turns) != 3 || len(mt.Naive.Turns) != 3 || len(mt.Floor.Turns) != 3 {
		t.Fatalf("multi-turn: %+v", mt)
	}
	if len(mt.ColdMs) != 2 || mt.ColdMs[0] != mt.Ctxd.Turns[0].TTFTMs || mt.ColdP50 <= 0 || mt.ColdOverWarm <= 0 {
		t.Errorf("cold samples %v, median %v, cold/warm %v", mt.ColdMs, mt.ColdP50, mt.ColdOverWarm)
	}
	if mt.Ctxd.Turns[1].EvaluatedTokens >= mt.Naive.Turns[1].EvaluatedTokens {
		t.Errorf("turn 2: ctxd evaluated %d tokens, the naive order %d", mt.Ctxd.Turns[1].EvaluatedTokens, mt.Naive.Turns[1].EvaluatedTokens)
	}
	if o := r.Overhead; len(o.Samples) != 3 || len(o.DirectTTFTMs) != 3 || len(o.OwnSamples) != 3 || o.PromptTokens == 0 || r.Compose.Runs == 0 {
		t.Errorf("overhead %+v compose %+v", r.Overhead, r.Compose)
	}
	if len(r.Scaling) != 2 || r.Scaling[0].Mode != "cag" || r.Scaling[1].Mode != "rag" {
		t.Errorf("scaling: %+v", r.Scaling)
	}
	for _, s := range r.Scaling {
		if len(s.ColdMs) != 2 || len(s.WarmMs) != 2 {
			t.Errorf("scaling %d%%: want 2 cold and 2 warm samples, got %v and %v", s.TargetPct, s.ColdMs, s.WarmMs)
		}
	}
	if p := r.Scaling[0].Pct; p > 25 {
		t.Errorf("scaling: the 20%% point landed at %.0f%% of the prompt budget", p)
	}
	if len(r.Agents) != 2 {
		t.Fatalf("agents: %d runs, want one per slot count", len(r.Agents))
	}
	for _, a := range r.Agents {
		if len(a.PerAgent) != 3 || len(a.All.TTFTMs) != 6 || a.All.TTFTP50 <= 0 || a.Concurrency != a.Slots {
			t.Errorf("agents on %d slot(s): %d agents, %d requests, TTFT p50 %.0f, %d at once", a.Slots, len(a.PerAgent), len(a.All.TTFTMs), a.All.TTFTP50, a.Concurrency)
		}
	}
	// A run of one phase keeps the others and compares the overhead.
	cfg.Phases = []string{bench.PhaseOverhead}
	again, err := bench.Run(context.Background(), cfg, r)
	if err != nil {
		t.Fatal(err)
	}
	if again.PreviousOverhead == nil || len(again.Agents) != 2 || len(again.Scaling) != 2 || again.Ran[bench.PhaseAgents] != r.Ran[bench.PhaseAgents] {
		t.Errorf("a run of the overhead phase alone lost or mislabelled the others: %+v", again.Ran)
	}
	dir := t.TempDir()
	doc := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(doc, []byte("# Benchmarks\n\nHand-written part.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("# ctxd\n\n<!-- bench:readme:begin (written by `ctxd-bench`) -->\nold figures\n<!-- bench:readme:end -->\n\nMore.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // rewriting replaces the section, it does not append another
		if err := again.Write(filepath.Join(dir, "bench"), doc, readme); err != nil {
			t.Fatal(err)
		}
	}
	text, _ := os.ReadFile(doc)
	if strings.Count(string(text), "bench:begin") != 1 || !strings.Contains(string(text), "Hand-written part.") || !strings.Contains(string(text), "| 3 |") ||
		!strings.Contains(string(text), "Many agents at once") || !strings.Contains(string(text), "The run before") {
		t.Errorf("doc:\n%s", text)
	}
	text, _ = os.ReadFile(readme)
	if strings.Contains(string(text), "old figures") || !strings.Contains(string(text), "With 3 agents sharing one daemon") || !strings.HasSuffix(string(text), "More.\n") {
		t.Errorf("README:\n%s", text)
	}
	for _, f := range []string{"results.json", bench.ScalingPlot, bench.TurnsPlot} {
		if info, err := os.Stat(filepath.Join(dir, "bench", f)); err != nil || info.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestBenchTrainedModelSmoke runs the answer-quality and real-models
// phases small, on SmolLM2 (one question of one set, four ways; one
// codex size, two pairs), on Ollama and llama-server, and checks every part is
// reported; it asserts no times and no accuracy.
func TestBenchTrainedModelSmoke(t *testing.T) {
	needLlamaServer(t)
	needOllama(t)
	model := realmodel.Path(t, realmodel.SmolLM2)
	cfg := bench.DefaultConfig()
	cfg.OllamaBin, cfg.LlamaServerBin = ollamatest.Binary(t), llamaservertest.Binary(t)
	cfg.Phases = []string{bench.PhaseQuality, bench.PhaseReal}
	// One set of the three (the smallest codex), one question of it.
	sets := t.TempDir()
	abs, err := filepath.Abs(filepath.Join("..", "testdata", "quality", "handbook"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(abs, filepath.Join(sets, "handbook")); err != nil {
		t.Fatal(err)
	}
	cfg.QualityDir, cfg.QualityMax = sets, 1
	cfg.QualityModels = []bench.QualityModel{{Name: "smollm2", Path: model, NumCtx: 8192, RAGNumCtx: 2048}}
	cfg.RealModels = []bench.RealModel{{Name: "smollm2", Path: model, NumCtx: 4096, Sizes: []int{800}}}
	cfg.LlamaPairs = 2
	cfg.Log = t.Logf
	r, err := bench.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Quality) != 2 {
		t.Fatalf("quality: %d runs, want Ollama's and llama-server's", len(r.Quality))
	}
	for _, run := range r.Quality {
		if len(run.Ways) != 4 || len(run.Codices) != 1 {
			t.Fatalf("quality on %s: %d ways, %d codices", run.Backend, len(run.Ways), len(run.Codices))
		}
		for _, w := range run.Ways {
			if w.Asked != 1 || len(w.Answers) != 1 || w.TTFTP50 <= 0 || w.High < w.Low {
				t.Errorf("quality on %s, %s: %+v", run.Backend, w.Way, w)
			}
		}
		for _, c := range run.Codices {
			if c.RAGMode != "rag" || c.Tokens <= 0 {
				t.Errorf("quality on %s: codex %+v", run.Backend, c)
			}
		}
	}
	if len(r.Real) != 1 || len(r.Real[0].Sizes) != 1 {
		t.Fatalf("real models: %+v", r.Real)
	}
	if s := r.Real[0].Sizes[0]; len(s.LlamaWarmMs) != 3 || len(s.OllamaWarmMs) != 3 || len(s.PairedCtxdMs) != 2 || s.StableTokens <= 0 {
		t.Errorf("real models, size %d: %+v", s.TargetTokens, s)
	}
	md := r.Markdown("bench")
	for _, want := range []string{"### Answer quality", "### The same figures on trained models", "question alone"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// TestBenchLlamaPhaseSmoke runs the llama-server phase small and checks
// every part is reported; it asserts no times.
func TestBenchLlamaPhaseSmoke(t *testing.T) {
	needLlamaServer(t)
	needOllama(t)
	cfg := bench.DefaultConfig()
	cfg.OllamaBin, cfg.LlamaServerBin = ollamatest.Binary(t), llamaservertest.Binary(t)
	cfg.AgentModel = templatedModels()[0]
	cfg.AgentModelPath = modelPath(t, cfg.AgentModel)
	cfg.Phases = []string{bench.PhaseLlama}
	cfg.LlamaNumCtx, cfg.LlamaSizes, cfg.LlamaInterleaveTurns, cfg.LlamaRestartTokens, cfg.LlamaPairs = 4096, []int{500, 1500}, 3, 1000, 4
	cfg.Log = t.Logf
	r, err := bench.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := r.Llama
	if l == nil || len(l.Sizes) != 2 || len(l.Interleave) != 2 || l.Restart.ColdMs <= 0 || l.Restart.RestoredMs <= 0 {
		t.Fatalf("llama phase: %+v", l)
	}
	for _, s := range l.Sizes {
		if len(s.LlamaWarmMs) != 3 || len(s.OllamaWarmMs) != 3 || len(s.PairedCtxdMs) != 4 || len(s.PairedRawMs) != 4 || len(s.OwnMs) != 4 || s.StableTokens <= 0 {
			t.Errorf("size %d: %+v", s.TargetTokens, s)
		}
	}
	for _, ir := range l.Interleave {
		if len(ir.TTFTMs) != 6 || len(ir.Evaluated) != 6 {
			t.Errorf("interleave on %d slots: %+v", ir.Slots, ir)
		}
	}
	// On two slots each agent's later turns find its conversation: they
	// evaluate fewer tokens than on one shared slot.
	one, two := l.Interleave[0].Evaluated, l.Interleave[1].Evaluated
	if two[len(two)-1] >= one[len(one)-1] {
		t.Errorf("last turn evaluated %d tokens on two slots, %d on one", two[len(two)-1], one[len(one)-1])
	}
	if !strings.Contains(r.Markdown("bench"), "llama-server and Ollama, one model") {
		t.Error("the report lacks the llama-server section")
	}
}
