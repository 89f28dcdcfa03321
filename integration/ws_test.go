package integration

import (
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
)

// TestWSSessionReusesPrefix runs two turns of one session over one
// WebSocket connection on the real Ollama: the answers stream, and the
// second turn's prompt extends the first's, so the backend reuses it.
func TestWSSessionReusesPrefix(t *testing.T) {
	needOllama(t)
	d := start(t, baseConfig(t, t.TempDir(), codexDir(t, 4500)), true)
	conn, err := d.client.Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	var prev *ctxd.Summary
	for i, q := range []string{"What does Handler3 return?", "Which handler serves kind 7?"} {
		var sb strings.Builder
		tokens := 0
		sum, err := conn.Ask(t.Context(), ctxd.AskRequest{Session: "ws", Query: q}, func(s string) {
			tokens++
			sb.WriteString(s)
		})
		if err != nil {
			t.Fatalf("turn %d over the WebSocket: %v", i+1, err)
		}
		t.Logf("turn %d: %d prompt tokens, %d cached (%.1f%%), %d answer tokens in %d messages, ttft %.1f ms, answer %q",
			sum.Turn, sum.PromptTokens, sum.CachedTokens, sum.ReusePercent, sum.AnswerTokens, tokens, sum.TTFTMillis, sb.String())
		if sum.Turn != i+1 || sum.Session != "ws" || tokens == 0 {
			t.Fatalf("turn %d: summary %+v after %d token messages", i+1, sum, tokens)
		}
		if sum.BackendPromptN != sum.PromptTokens {
			t.Errorf("turn %d: ctxd counted %d prompt tokens, the backend %d", i+1, sum.PromptTokens, sum.BackendPromptN)
		}
		if i == 1 {
			if sum.CachedTokens == 0 || sum.CachedTokens != prev.PromptTokens || sum.PrefixBreak != nil {
				t.Errorf("turn 2: %d cached tokens of the previous prompt's %d, prefix break %+v", sum.CachedTokens, prev.PromptTokens, sum.PrefixBreak)
			}
			if sum.ReusePercent < 50 {
				t.Errorf("turn 2 reuses %.1f%% of its prompt, want most of it", sum.ReusePercent)
			}
		}
		prev = sum
	}
	select {
	case <-conn.Done():
		t.Fatalf("the connection ended between asks: %v", conn.Err())
	default:
	}
}
