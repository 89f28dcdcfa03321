package integration

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/modelgen"
)

// kvSelfSize reads the KV cache size llama.cpp logged when it loaded the
// model ("CPU KV buffer size =    32.00 MiB", in the runner's output of
// Ollama v0.6.5 and v0.17.4 alike) from the managed server's log.
func kvSelfSize(t *testing.T, stateDir string) float64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stateDir, "ollama", "ollama.log"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`KV buffer size\s*=\s*([0-9.]+) MiB`).FindAllSubmatch(b, -1)
	if len(m) == 0 {
		t.Fatalf("the backend log has no KV buffer size line")
	}
	mib, err := strconv.ParseFloat(string(m[len(m)-1][1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return mib * (1 << 20)
}

func TestKVEstimateMatchesBackend(t *testing.T) {
	needOllama(t)
	models := []modelgen.Config{
		testModel(),
		{Name: "kv-b", Vocab: modelgen.VocabBPE, VocabSize: 1024, Embedding: 128, Layers: 3, Heads: 8, KVHeads: 2,
			FeedForward: 256, ContextLength: 8192, Seed: 2},
	}
	for _, mc := range models {
		t.Run(mc.Name, func(t *testing.T) {
			state := t.TempDir()
			cfg := baseConfig(t, state, "")
			cfg.Backend.GGUF = modelPath(t, mc)
			cfg.Backend.NumCtx = 0 // let the governor plan it
			cfg.Backend.MaxNumCtx = 3072
			d := start(t, cfg, true)
			var st httpapi.Status
			if err := d.client.GetJSON(context.Background(), "/v1/status", &st); err != nil {
				t.Fatal(err)
			}
			if st.Window == nil || st.Window.NumCtx != 3072 || st.Backend.NumCtx != 3072 {
				t.Fatalf("window plan %+v backend %+v", st.Window, st.Backend)
			}
			logged := kvSelfSize(t, state)
			est := float64(st.Window.KVBytes)
			t.Logf("%s: estimated %d bytes (%.2f MiB), backend allocated %.2f MiB; q8_0 would be %d, q4_0 %d",
				mc.Name, st.Window.KVBytes, est/(1<<20), logged/(1<<20),
				st.Model.KVBytes(governor.CacheQ8_0, 3072), st.Model.KVBytes(governor.CacheQ4_0, 3072))
			if diff := math.Abs(est-logged) / logged; diff > 0.02 {
				t.Errorf("KV estimate %.0f is %.1f%% off the backend's %.0f", est, 100*diff, logged)
			}
		})
	}
}

func TestOverflowIsCondensedNeverCut(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		cfg := b.config(t, t.TempDir(), codexDir(t, 1500))
		cfg.Backend.NumCtx = 1280
		cfg.Limits.MaxDepth = 0 // no depth limit: only the window forces the governor's hand
		d := start(t, cfg, true)
		condensed := false
		for i := range 40 {
			sum, _ := ask(t, d.client, "long", "Tell me about handler number "+strconv.Itoa(i)+" and what it returns.")
			if sum.BackendPromptN != sum.PromptTokens {
				t.Fatalf("turn %d: the backend evaluated %d prompt tokens, ctxd sent %d: something was cut", sum.Turn, sum.BackendPromptN, sum.PromptTokens)
			}
			if sum.PromptTokens+sum.Budget.AnswerReserve > sum.Budget.NumCtx {
				t.Fatalf("turn %d: %d tokens + %d reserve over num_ctx %d", sum.Turn, sum.PromptTokens, sum.Budget.AnswerReserve, sum.Budget.NumCtx)
			}
			for _, a := range sum.Governor {
				t.Logf("turn %d: governor %s: %s (turns %d, tokens %d, epoch %d)", sum.Turn, a.Kind, a.Reason, a.TurnsDropped, a.TokensDropped, a.Epoch)
				if a.Kind == "condense" {
					condensed = true
				}
			}
			if condensed {
				if sum.Epoch < 1 || sum.PrefixBreak == nil || sum.PrefixBreak.Block != "state" {
					t.Errorf("condensation not visible: epoch %d break %+v", sum.Epoch, sum.PrefixBreak)
				}
				// The condensation ran on the backend before this answer: its
				// time is the client's, counted in ttft_ms and named.
				tm := sum.Timing
				t.Logf("turn %d: ttft %.0f ms = queue %.0f + governor %.0f (condensing %.0f) + backend %.0f + other %.0f",
					sum.Turn, sum.TTFTMillis, tm.QueueWaitMs, tm.GovernorMs, tm.CondenseMs, tm.BackendTTFTMs, tm.OtherMs)
				if tm.CondenseMs <= 0 || tm.GovernorMs < tm.CondenseMs || sum.TTFTMillis < tm.GovernorMs+tm.BackendTTFTMs {
					t.Errorf("the condensation's time is not in the time to first token: ttft %.1f ms, timing %+v", sum.TTFTMillis, tm)
				}
				break
			}
		}
		if !condensed {
			t.Fatal("40 turns in a 1280-token window never needed condensing")
		}
		status, body := raw(t, cfg.Daemon.Socket, "POST", "/v1/ask", "application/json",
			[]byte(`{"session":"long","query":"`+strings.Repeat("handler kind ", 600)+`"}`))
		if status != 422 || !strings.Contains(body, "reserved for the answer") || !strings.Contains(body, "query=") {
			t.Errorf("a query larger than the window: %d %s", status, body)
		}
	})
}

func TestDepthCompactionOnRealBackend(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		cfg := b.config(t, t.TempDir(), codexDir(t, 3000))
		cfg.Limits.MaxDepth = 4
		d := start(t, cfg, true)
		for turn := 1; turn <= 7; turn++ {
			sum, _ := ask(t, d.client, "depth", "Question "+strconv.Itoa(turn)+" about the handlers?")
			switch {
			case turn == 6:
				if len(sum.Governor) != 1 || sum.Governor[0].Kind != "compact" || sum.Governor[0].TurnsDropped != 3 || sum.Epoch != 1 {
					t.Fatalf("turn 6: governor %+v epoch %d", sum.Governor, sum.Epoch)
				}
				if sum.PrefixBreak == nil || sum.PrefixBreak.Block != "state" {
					t.Errorf("turn 6: break %+v", sum.PrefixBreak)
				}
				// The stable blocks before the conversation stay cached.
				if sum.CachedTokens < sum.Budget.Blocks[0].Tokens+sum.Budget.Blocks[1].Tokens {
					t.Errorf("turn 6 re-evaluates the stable blocks: %d cached", sum.CachedTokens)
				}
			case turn > 1:
				if len(sum.Governor) != 0 || sum.PrefixBreak != nil || sum.ReusePercent < 90 {
					t.Errorf("turn %d: governor %+v break %+v reuse %.1f%%", turn, sum.Governor, sum.PrefixBreak, sum.ReusePercent)
				}
			}
		}
	})
}
