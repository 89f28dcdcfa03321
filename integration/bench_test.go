package integration

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ctxd/ctxd/modelgen"
)

// benchModel is the demo model of `make run`: big enough that evaluating
// a cold prompt of a few thousand tokens takes visible time on a CPU.
func benchModel() modelgen.Config {
	return modelgen.Config{
		Name: "ctxd-bench", Vocab: modelgen.VocabSPM, VocabSize: 4096,
		Embedding: 256, Layers: 4, Heads: 8, KVHeads: 4, FeedForward: 768,
		ContextLength: 16384, Seed: 1,
	}
}

// BenchmarkColdWarmTTFT measures time to first token of turn 1 (cold: a
// fresh backend evaluates the whole prompt) against turns 2 and 3 (warm:
// the backend reuses the cached prefix), through the daemon's socket.
// Each repetition starts a fresh daemon and managed Ollama.
func BenchmarkColdWarmTTFT(b *testing.B) {
	needOllama(b)
	const reps = 3
	var cold, warm, coldEval, warmEval, warmTokens []float64
	var promptTokens int
	for range b.N {
		for r := range reps {
			cfg := baseConfig(b, b.TempDir(), codexDir(b, 16000))
			cfg.Backend.GGUF = modelPath(b, benchModel())
			cfg.Backend.Model = "ctxd-bench"
			cfg.Backend.NumCtx = 16384
			cfg.Daemon.LogLevel = "warn"
			d := start(b, cfg, true)
			for turn := 1; turn <= 3; turn++ {
				sum, err := askB(d, fmt.Sprintf("rep %d turn %d: which handler serves kind %d?", r, turn, 40+turn))
				if err != nil {
					b.Fatal(err)
				}
				if turn == 1 {
					cold = append(cold, sum.TTFTMillis)
					coldEval = append(coldEval, sum.PromptEvalMs)
					promptTokens = sum.PromptTokens
				} else {
					warm = append(warm, sum.TTFTMillis)
					warmEval = append(warmEval, sum.PromptEvalMs)
					warmTokens = append(warmTokens, float64(sum.EvaluatedTokens))
				}
			}
			if err := d.stop(); err != nil {
				b.Fatal(err)
			}
		}
	}
	mc, mw := median(cold), median(warm)
	b.ReportMetric(mc, "cold-ttft-ms")
	b.ReportMetric(mw, "warm-ttft-ms")
	b.ReportMetric(mc/mw, "cold/warm")
	b.Logf("prompt %d tokens; cold TTFT median %.1f ms (all %v, backend prompt eval %v); warm TTFT median %.1f ms (all %v, backend prompt eval %v, tokens evaluated %v); cold/warm %.1fx",
		promptTokens, mc, round(cold), round(coldEval), mw, round(warm), round(warmEval), warmTokens, mc/mw)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func round(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(int(x*10)) / 10
	}
	return out
}
