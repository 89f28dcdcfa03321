package httpapi

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/sigils"
)

// nodeClients is where make test installs the official npm clients.
var nodeClients = filepath.Join("..", "integration", "node")

// toolModel answers a question with a call to grep, and a tool's result
// with text: what a model trained for tools does, which no model small
// enough for the suite does.
type toolModel struct{ *fake.Backend }

func (m toolModel) Generate(ctx context.Context, req ctxd.GenerateRequest, onToken func(string) error) (ctxd.Generation, error) {
	answer := `{"name": "grep", "arguments": {"pattern": "Listen"}}`
	if i := strings.LastIndex(req.Prompt, "### USER\n"); i >= 0 && strings.HasPrefix(req.Prompt[i+len("### USER\n"):], "[tool result") {
		answer = "Listen is defined in daemon/listen.go, line 12."
	}
	for _, piece := range strings.SplitAfter(answer, " ") {
		if err := onToken(piece); err != nil {
			return ctxd.Generation{}, err
		}
	}
	return ctxd.Generation{Text: answer, DoneReason: ctxd.DoneStop, BackendCached: -1, EvalCount: 8}, nil
}

// toolCallChoice is a chat completion's choice as the openai client
// returns it.
type toolCallChoice struct {
	FinishReason string `json:"finish_reason"`
	Message      struct {
		Content   *string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
}

// TestOpenAIClientToolCalls: the official openai client's tool calling,
// plain and through its stream helper, round-trips through the OpenAI
// door on the TCP listener, with the tools the sigil's scopes allow, and
// the tool's result extends the same session. The model is scripted; the
// client is the real npm package (skipped without it, required by make
// test).
func TestOpenAIClientToolCalls(t *testing.T) {
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeClients, "node_modules", "openai", "package.json"))
	}
	if err != nil {
		if os.Getenv("CTXD_REQUIRE_NODE") != "" {
			t.Fatal(err)
		}
		t.Skipf("Node.js and the npm clients are needed (make test installs them): %v", err)
	}
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, fixtureOptions{
		model: toolModel{fake.NewBackend()},
		config: func(c *config.Config) {
			c.Daemon.TCPListen = "127.0.0.1:0"
			c.Sigils["agent"] = config.Sigil{Scopes: []string{"ask", "tool:grep", "sessions:read"}, TokenSHA256: hash}
		},
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "openai-tools.mjs")
	cmd.Dir = nodeClients
	cmd.Env = append(os.Environ(), "CTXD_BASE_URL=http://"+f.srv.TCPAddr()+"/v1", "CTXD_TOKEN="+tok)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var out struct {
		Plain, Stream toolCallChoice
		After         struct {
			FinishReason string `json:"finish_reason"`
			Content      string
			Ctxd         ctxd.Summary
		}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	for name, c := range map[string]toolCallChoice{"plain": out.Plain, "stream": out.Stream} {
		if c.FinishReason != "tool_calls" || c.Message.Content != nil || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "grep" ||
			c.Message.ToolCalls[0].Function.Arguments != `{"pattern":"Listen"}` || c.Message.ToolCalls[0].ID == "" {
			js, _ := json.Marshal(c)
			t.Errorf("%s: %s", name, js)
		}
	}
	// The plain and the streamed request each began a conversation; the
	// tool's result goes on in the one whose call it answers (both made
	// the same call: the later).
	if out.After.FinishReason != "stop" || !strings.Contains(out.After.Content, "daemon/listen.go") || out.After.Ctxd.Turn != 2 || out.After.Ctxd.PrefixNote != "" {
		t.Errorf("after the tool's result: %+v", out.After)
	}
	s, err := client.New(f.cfg.Daemon.Socket, client.WithToken(tok)).Sessions(t.Context())
	if err != nil || len(s) != 2 || !slices.ContainsFunc(s, func(x ctxd.SessionInfo) bool { return x.ID == out.After.Ctxd.Session && x.Turns == 2 }) {
		t.Errorf("two conversations, two sessions (agent's), the tool loop in one: %+v %v", s, err)
	}
}
