package metrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/metrics"
)

func TestAnswersAndStateAreExported(t *testing.T) {
	m := metrics.New(func() metrics.Snapshot {
		return metrics.Snapshot{Ready: true, CodexMode: "rag", CodexLoadSeconds: 1.5, MemorySource: "host", MemoryTotal: 8 << 30,
			MemoryFree: 2 << 30, BackendRestarts: 2, Slots: 4, SlotsBusy: 3, QueuedForSlot: 5}
	})
	m.Request("POST /v1/ask", 200, "ok")
	m.Request("POST /v1/ask", 200, "ok")
	m.Request("POST /v1/ask", 403, "forbidden")
	m.Answer(&ctxd.Summary{Mode: "rag", TTFTMillis: 400, EvaluatedTokens: 30, CachedTokens: 300,
		Timing:      ctxd.Timing{QueueWaitMs: 100, GovernorMs: 250, CondenseMs: 200, BackendTTFTMs: 50},
		PrefixBreak: &ctxd.PrefixBreak{Block: "karma", Reason: "karma epoch 2 began: a new session"},
		Governor:    []ctxd.Action{{Kind: ctxd.ActionCondense}}})
	// Measured by the backend: its figure, not the expectation.
	measured := 1000
	m.Answer(&ctxd.Summary{Mode: "rag", EvaluatedTokens: 70, CachedTokens: 76, BackendCachedTokens: &measured})
	// A request stopped before its answer: what the backend read counts.
	m.Spent(400, 500)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`ctxd_requests_total{code="200",outcome="ok",route="POST /v1/ask"} 2`,
		`ctxd_requests_total{code="403",outcome="forbidden",route="POST /v1/ask"} 1`,
		`ctxd_prompt_tokens_total{kind="evaluated"} 500`,
		`ctxd_prompt_tokens_total{kind="reused"} 1800`,
		`ctxd_prefix_breaks_total{block="karma",cause="karma_epoch"} 1`,
		`ctxd_governor_actions_total{kind="condense"} 1`,
		`ctxd_ttft_seconds_sum 0.4`,
		`ctxd_ttft_part_seconds_sum{part="condense"} 0.2`,
		`ctxd_codex_mode{mode="rag"} 1`,
		`ctxd_codex_mode{mode="cag"} 0`,
		`ctxd_model_memory_bytes{source="host",state="free"} 2.147483648e+09`,
		`ctxd_backend_restarts_total 2`,
		`ctxd_slots_busy 3`,
		`ctxd_queued_requests{for="slot"} 5`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if n, err := testutil.GatherAndCount(m.Gatherer(), "ctxd_answers_total"); err != nil || n != 1 { // one mode
		t.Errorf("ctxd_answers_total: %d series, %v", n, err)
	}
}

func TestCauseIsBounded(t *testing.T) {
	for reason, want := range map[string]string{
		"karma epoch 3 began: refresh_karma":                                                  "karma_epoch",
		"identity block changed: the text formatter conventions injects changed":              "formatter",
		"the previous query held volatile text (clock), which the conversation does not keep": "volatile",
		"conversation was compacted or rewritten":                                             "rewritten",
		"codex block changed": "changed",
	} {
		if got := metrics.Cause(reason); got != want {
			t.Errorf("Cause(%q) = %q, want %q", reason, got, want)
		}
	}
}
