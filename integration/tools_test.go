package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/sigils"
)

// toolModel answers a question with a call to grep, and a tool's result
// with text: what a model trained for tools does, which the random-weight
// test models cannot.
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

// TestOpenAIToolCalls: the official openai client's tool calling, plain
// and through its stream helper, round-trips through the OpenAI door, with
// the tools the sigil's scopes allow. The backend is a scripted model: no
// model small enough for the suite calls tools.
func TestOpenAIToolCalls(t *testing.T) {
	node := needNode(t)
	tok, hash, err := sigils.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: t.TempDir()})
	cfg.Daemon.Socket = filepath.Join(socketDir(t), "ctxd.sock")
	cfg.Daemon.StateDir = t.TempDir()
	cfg.Daemon.TCPListen = "127.0.0.1:0"
	cfg.Limits.AnswerReserve = 64
	cfg.Sigils = map[string]config.Sigil{"default": {Scopes: []string{"ask"}}, "agent": {Scopes: []string{"ask", "tool:grep"}, TokenSHA256: hash}}
	open := func(context.Context, func()) (*daemon.Model, error) {
		return &daemon.Model{
			Backend: toolModel{fake.NewBackend()}, Tokenizer: fake.Tokenizer{}, TokenizerID: "fake",
			Info:   daemon.BackendInfo{Kind: "fake", Mode: "fake", Model: "scripted", NumCtx: 8192, Slots: 1},
			Window: governor.WindowPlan{NumCtx: 8192, Slots: 1, CacheType: governor.CacheF16},
			Close:  func() error { return nil },
		}, nil
	}
	r := startWith(t, cfg, daemon.Options{Open: open, Store: fake.NewStore(), Sensor: fake.NewSensor()})
	var out struct {
		Plain, Stream toolCallChoice
		After         struct {
			FinishReason string `json:"finish_reason"`
			Content      string
			Ctxd         ctxd.Summary
		}
	}
	runNode(t, node, "openai-tools.mjs", []string{"CTXD_BASE_URL=http://" + r.daemon.TCPAddr() + "/v1", "CTXD_TOKEN=" + tok}, &out)
	for name, c := range map[string]struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
	}{"plain": out.Plain, "stream": out.Stream} {
		if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "grep" ||
			c.Message.ToolCalls[0].Function.Arguments != `{"pattern":"Listen"}` || c.Message.ToolCalls[0].ID == "" {
			b, _ := json.Marshal(c)
			t.Errorf("%s: %s", name, b)
		}
	}
	if out.After.FinishReason != "stop" || !strings.Contains(out.After.Content, "daemon/listen.go") || out.After.Ctxd.Turn != 3 || out.After.Ctxd.PrefixNote != "" {
		t.Errorf("after the tool's result: %+v", out.After)
	}
	s, err := client.New(cfg.Daemon.Socket).Sessions(t.Context())
	if err != nil || len(s) != 1 {
		t.Errorf("one conversation, one session: %+v %v", s, err)
	}
}
