package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/daemon"
)

// TestLlamaServerSession runs a 3-turn session through the socket on a
// managed llama-server: the prompt goes as token ids, and ctxd's expected
// reuse matches the server's measured cache_n turn by turn.
func TestLlamaServerSession(t *testing.T) {
	needLlamaServer(t)
	for _, mc := range append(templatedModels(), testModel()) {
		t.Run(mc.Name, func(t *testing.T) {
			state := t.TempDir()
			cfg := llamaConfig(t, state, codexDir(t, 4500))
			defer func() {
				if t.Failed() {
					b, _ := os.ReadFile(filepath.Join(state, "llamacpp", "llama-server.log"))
					t.Logf("llama-server log:\n%s", tail(string(b), 3000))
				}
			}()
			cfg.Backend.GGUF, cfg.Backend.Model = modelPath(t, mc), mc.Name
			d := start(t, cfg, true)
			var st daemon.Status
			if err := d.client.GetJSON(context.Background(), "/v1/status", &st); err != nil {
				t.Fatal(err)
			}
			t.Logf("backend %+v", st.Backend)
			var prev *ctxd.Summary
			for i, q := range []string{"What does Handler3 return?", "Which handler serves kind 7?", "Summarize the README."} {
				sum, _ := ask(t, d.client, "ls", q)
				measured := -1
				if sum.BackendCachedTokens != nil {
					measured = *sum.BackendCachedTokens
				}
				t.Logf("turn %d: %s, %d prompt tokens, %d cached, measured %d (%s), ttft %.1f ms", sum.Turn, sum.Format, sum.PromptTokens, sum.CachedTokens, measured, sum.ReuseNote, sum.TTFTMillis)
				if sum.DoneReason == ctxd.DoneIncomplete {
					t.Logf("turn %d: incomplete: %s", i+1, sum.DoneNote)
				} else if sum.BackendPromptN != sum.PromptTokens {
					t.Errorf("turn %d: ctxd counted %d prompt tokens, the server %d", i+1, sum.PromptTokens, sum.BackendPromptN)
				}
				if sum.DoneReason != ctxd.DoneIncomplete && measured < sum.CachedTokens {
					t.Errorf("turn %d: the server reused %d tokens, ctxd expected %d", i+1, measured, sum.CachedTokens)
				}
				if i > 0 && (sum.CachedTokens != prev.PromptTokens || sum.ReusePercent < 95) {
					t.Errorf("turn %d: %d cached of %d, want the previous prompt's %d", i+1, sum.CachedTokens, sum.PromptTokens, prev.PromptTokens)
				}
				prev = sum
			}
		})
	}
}
