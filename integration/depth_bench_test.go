package integration

import (
	"fmt"
	"testing"
)

// BenchmarkDepthPolicies runs a 200-turn scripted session with max_depth 20
// twice on the real backend: epoch compaction (cut to 10 once past 20) and
// a rolling window (drop one turn per request once past 20). It reports the
// prefix breaks and the prompt tokens the backend had to evaluate.
func BenchmarkDepthPolicies(b *testing.B) {
	needOllama(b)
	const turns, depth = 200, 20
	type result struct {
		breaks, evaluated int
		evalMs            float64
	}
	run := func(compactTo int) result {
		cfg := baseConfig(b, b.TempDir(), codexDir(b, 3000))
		cfg.Limits.MaxDepth, cfg.Limits.CompactTo = depth, compactTo
		cfg.Limits.AnswerReserve = 8
		cfg.Daemon.LogLevel = "warn"
		d := start(b, cfg, true)
		defer d.stop()
		var r result
		for i := range turns {
			sum, err := askB(d, fmt.Sprintf("Turn %d: which handler serves kind %d, and what does it return?", i, i%50))
			if err != nil {
				b.Fatal(err)
			}
			if sum.PrefixBreak != nil {
				r.breaks++
			}
			if i > 0 { // turn 1 is cold either way
				r.evaluated += sum.EvaluatedTokens
				r.evalMs += sum.PromptEvalMs
			}
		}
		return r
	}
	for range b.N {
		epoch := run(0)
		rolling := run(depth)
		b.ReportMetric(float64(epoch.breaks), "epoch-breaks")
		b.ReportMetric(float64(rolling.breaks), "rolling-breaks")
		b.ReportMetric(float64(epoch.evaluated), "epoch-eval-tokens")
		b.ReportMetric(float64(rolling.evaluated), "rolling-eval-tokens")
		b.ReportMetric(float64(rolling.evaluated)/float64(epoch.evaluated), "eval-ratio")
		b.Logf("200 turns, max_depth 20: epoch compaction %d prefix breaks, %d tokens evaluated (backend prompt eval %.0f ms); rolling window %d breaks, %d tokens (%.0f ms); rolling/epoch %.1fx tokens, %.1fx time",
			epoch.breaks, epoch.evaluated, epoch.evalMs, rolling.breaks, rolling.evaluated, rolling.evalMs,
			float64(rolling.evaluated)/float64(epoch.evaluated), rolling.evalMs/epoch.evalMs)
	}
}
