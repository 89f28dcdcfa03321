package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
)

// BenchmarkSidecarOverhead is the harness's overhead measurement on the
// small test model: the client's time to first token minus ctxd's own
// measurement of the backend's, over warm turns of one session.
func BenchmarkSidecarOverhead(b *testing.B) {
	needOllama(b)
	cfg := baseConfig(b, b.TempDir(), codexDir(b, 4000))
	cfg.Daemon.LogLevel = "warn"
	cfg.Limits.AnswerReserve = 8
	d := start(b, cfg, true)
	var xs []float64
	for range b.N {
		for i := range 31 {
			t0 := time.Now()
			var ttft time.Duration
			sum, err := d.client.Ask(context.Background(), ctxd.AskRequest{Session: "overhead", Query: fmt.Sprintf("Which handler serves kind %d?", i)}, func(string) {
				if ttft == 0 {
					ttft = time.Since(t0)
				}
			})
			if err != nil {
				b.Fatal(err)
			}
			if i > 0 && ttft > 0 {
				xs = append(xs, float64(ttft.Microseconds())/1000-sum.Timing.BackendTTFTMs)
			}
		}
	}
	slices.Sort(xs)
	b.ReportMetric(xs[len(xs)/2], "p50-ms")
	b.ReportMetric(xs[len(xs)*95/100], "p95-ms")
}
