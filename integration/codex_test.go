package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/internal/llamaservertest"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/ollama"
)

// TestTokenCountsMatchBackend checks ctxd's count of a raw prompt against
// the backend's (Ollama's prompt_eval_count; llama-server's own
// tokenization, id for id, and its cache_n + prompt_n) on a SentencePiece
// and a byte-level BPE vocabulary, with text that tokenizers disagree on.
func TestTokenCountsMatchBackend(t *testing.T) {
	needOllama(t)
	prompts := []string{
		"Once upon a time",
		"func main() {\n\tfmt.Println(\"héllo, 世界 🌍\")\n}\n",
		"### USER\n  two  spaces, tabs\t\tand\n\n\nnewlines <s> </s> <|endoftext|> \\u00e9\n### ASSISTANT\n",
		strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40),
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		var srv *ollama.Server
		if b.name == "ollama" {
			srv = ollamatest.Start(t)
		}
		for _, vocab := range []string{modelgen.VocabSPM, modelgen.VocabBPE} {
			t.Run(vocab, func(t *testing.T) {
				mc := testModel()
				mc.Vocab = vocab
				path := modelPath(t, mc)
				tok, err := llamatok.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				defer tok.Close()
				var gen ctxd.Backend
				var lc *llamacpp.Client
				if srv != nil {
					c := ollama.New(srv.URL(), "count-"+vocab, ollama.Options{NumCtx: 2048})
					if err := c.Import(context.Background(), path); err != nil {
						t.Fatal(err)
					}
					gen = c
				} else {
					if lc, err = llamacpp.New(llamaservertest.Start(t, path, "-c", "2048"), llamacpp.Options{}); err != nil {
						t.Fatal(err)
					}
					gen = lc
				}
				for i, p := range prompts {
					want, err := tok.Tokenize(p)
					if err != nil {
						t.Fatal(err)
					}
					if lc != nil {
						got, err := lc.Tokenize(context.Background(), p, true, true)
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got, want) {
							t.Errorf("prompt %d: ctxd tokenizes it as %v, llama-server as %v", i, want, got)
						}
					}
					// A different first token each time, so nothing is cached.
					res, err := gen.Generate(context.Background(), ctxd.GenerateRequest{Prompt: p, MaxTokens: 1}, nil)
					if err != nil {
						t.Fatal(err)
					}
					if res.DoneReason == ctxd.DoneIncomplete {
						t.Logf("prompt %d: %s; its count is checked through /tokenize only", i, res.Note)
						continue
					}
					if res.PromptEvalCount != len(want) {
						t.Errorf("prompt %d: ctxd counts %d tokens, the backend %d", i, len(want), res.PromptEvalCount)
					}
				}
			})
		}
	})
}

func TestRAGModeOnRealBackend(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		dir := codexDir(t, 40000)
		if err := os.WriteFile(filepath.Join(dir, "secrets.env"), []byte("STRIPE_KEY=\"sk_live_4eC39HqLyjWDarjtT1zdp7dc\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := b.config(t, t.TempDir(), dir)
		cfg.Sigils["default"] = config.Sigil{Scopes: []string{"ask", "sessions:read", "codex:load"}} // no search_codex
		cfg.Sigils["coder"] = config.Sigil{Scopes: []string{"ask", "search_codex"}}
		d := start(t, cfg, true)

		// The decision needed no count (the bytes prove the tree too
		// large); the whole-tree total is counted in the background.
		var st ctxd.CodexStats
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
			if err := d.client.GetJSON(context.Background(), "/v1/codex", &st); err != nil {
				t.Fatal(err)
			}
			if st.TokensExact || time.Now().After(deadline) {
				break
			}
		}
		if st.Plan.Mode != "rag" || !st.TokensExact || st.Tokens < 4000 || st.Redactions != 1 || len(st.Largest) == 0 {
			t.Fatalf("codex stats: %+v", st)
		}
		var prev int
		for turn := 1; turn <= 3; turn++ {
			sum, _ := ask(t, d.client, "rag", fmt.Sprintf("What does Handler%d return?", 40*turn))
			ws := sum.WorkingSet
			if sum.Mode != "rag" || ws == nil || sum.Excerpts+ws.Hits+ws.ExcerptsPresent == 0 || sum.Codex.Reason == "" {
				t.Fatalf("turn %d: mode %s, %d excerpts, working set %+v, plan %+v", turn, sum.Mode, sum.Excerpts, ws, sum.Codex)
			}
			if turn == 1 && ws.Moved == "" || turn > 1 && ws.Moved != "" {
				t.Errorf("turn %d: working set moved %q", turn, ws.Moved)
			}
			if sum.BackendPromptN != sum.PromptTokens {
				t.Errorf("turn %d: ctxd counted %d, the backend %d", turn, sum.PromptTokens, sum.BackendPromptN)
			}
			if turn > 1 && sum.CachedTokens < prev {
				t.Errorf("turn %d: %d cached tokens, the previous prompt had %d", turn, sum.CachedTokens, prev)
			}
			prev = sum.PromptTokens
		}
		// Back to the first question's handler: the working set chosen then
		// holds it, so its excerpt is in the cached prefix, not added again.
		if sum, _ := ask(t, d.client, "rag", "And what does Handler40 return?"); sum.WorkingSet == nil || sum.WorkingSet.Hits == 0 || sum.BackendPromptN != sum.PromptTokens {
			t.Errorf("a follow-up on the first question's handler: working set %+v, ctxd counted %d, the backend %d", sum.WorkingSet, sum.PromptTokens, sum.BackendPromptN)
		}
		// The search_codex tool, for sigils with its scope only.
		q := url.Values{"q": {"Handler12 kind"}, "k": {"2"}, "sigil": {"coder"}}.Encode()
		status, body := raw(t, cfg.Daemon.Socket, "GET", "/v1/codex/search?"+q, "", nil)
		var res struct {
			Excerpts []struct{ Path, Lines, Text string } `json:"excerpts"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &res) != nil || len(res.Excerpts) != 2 || !strings.Contains(res.Excerpts[0].Text, "Handler12") {
			t.Errorf("search: %d %.300s", status, body)
		}
		if status, body := raw(t, cfg.Daemon.Socket, "GET", "/v1/codex/search?q=x", "", nil); status != 403 || !strings.Contains(body, "search_codex") {
			t.Errorf("search without the scope: %d %s", status, body)
		}
		if status, _ := raw(t, cfg.Daemon.Socket, "GET", "/v1/codex/search?sigil=coder", "", nil); status != 400 {
			t.Errorf("search without q: %d", status)
		}
	})
}

func TestCodexLoadThroughTheAPI(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		cfg := b.config(t, t.TempDir(), codexDir(t, 2000))
		cfg.Codex.Watch = false
		d := start(t, cfg, true)
		sock := cfg.Daemon.Socket
		other := t.TempDir()
		write := func(name, content string) {
			if err := os.WriteFile(filepath.Join(other, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		write("a.md", "# Other codex\nAbout gardens.\n")
		write("b.go", "package b\n")
		write("blob.go", "\x00\x01\x02binary")
		status, body := raw(t, sock, "POST", "/v1/codex/load", "application/json", []byte(`{"path":"`+other+`"}`))
		if status != 200 || !strings.Contains(body, `"type":"progress"`) || !strings.Contains(body, `"type":"codex"`) {
			t.Fatalf("load: %d %s", status, body)
		}
		var st ctxd.CodexStats
		if err := d.client.GetJSON(context.Background(), "/v1/codex", &st); err != nil {
			t.Fatal(err)
		}
		if st.Files != 2 || st.Plan.Mode != "cag" || len(st.Skipped) != 1 || !strings.Contains(st.Skipped[0].Reason, "binary") {
			t.Errorf("after load: %+v", st)
		}
		sum, _ := ask(t, d.client, "new", "What is this about?")
		if sum.PromptTokens != sum.BackendPromptN || sum.Mode != "cag" {
			t.Errorf("ask after load: %+v", sum)
		}
		for _, c := range []struct{ body, mention string }{
			{`{"path":"relative/dir"}`, "absolute"},
			{`{"path":"/no/such/dir"}`, "no such file"},
			{`{}`, "path: required"},
			{`{"path": 5}`, "malformed"},
		} {
			if status, body := raw(t, sock, "POST", "/v1/codex/load", "application/json", []byte(c.body)); status != 400 || !strings.Contains(body, c.mention) {
				t.Errorf("load %s: %d %s", c.body, status, body)
			}
		}
	})
}

func TestCodexReloadsWhenFilesChange(t *testing.T) {
	needOllama(t)
	forEachBackend(t, func(t *testing.T, b backend) {
		dir := codexDir(t, 2000)
		cfg := b.config(t, t.TempDir(), dir)
		d := start(t, cfg, true)
		var before ctxd.CodexStats
		if err := d.client.GetJSON(context.Background(), "/v1/codex", &before); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "new.go"), []byte("package handlers\n\nfunc Added() {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			var st ctxd.CodexStats
			return d.client.GetJSON(context.Background(), "/v1/codex", &st) == nil && st.Files == before.Files+1
		})
	})
}

// TestWorkingSetGrowsAtAnEpoch: on the real Ollama, a RAG session whose
// questions wander over a tree fills the window with its excerpts; at the
// epoch the governor leaves the history's excerpts out, and the working
// set keeps the question's own at its end. That turn is counted exactly
// and breaks the prefix at the codex block, not before; the next question
// about the same handler finds it in the working set and reuses the
// epoch's whole prompt.
func TestWorkingSetGrowsAtAnEpoch(t *testing.T) {
	needOllama(t)
	dir := codexDir(t, 40000)
	cfg := baseConfig(t, t.TempDir(), dir)
	cfg.Codex.TopK = 6
	d := start(t, cfg, true)
	var epoch *ctxd.Summary
	var q string
	for turn := 0; turn < 24 && epoch == nil; turn++ {
		q = fmt.Sprintf("What does Handler%d return?", 7+turn*53%280)
		sum, _ := ask(t, d.client, "wander", q)
		if sum.Mode != "rag" || sum.WorkingSet == nil {
			t.Fatalf("turn %d: mode %s, working set %+v", turn+1, sum.Mode, sum.WorkingSet)
		}
		if turn > 0 && sum.WorkingSet.Moved != "" && !slices.ContainsFunc(sum.Governor, func(a ctxd.Action) bool { return a.Kind == ctxd.ActionStale }) {
			t.Errorf("turn %d: the working set moved without an epoch: %q", turn+1, sum.WorkingSet.Moved)
		}
		if slices.ContainsFunc(sum.Governor, func(a ctxd.Action) bool { return a.Kind == ctxd.ActionStale }) {
			epoch = sum
		}
	}
	if epoch == nil {
		t.Fatal("24 wandering questions never filled the window: the test proves nothing")
	}
	ws := epoch.WorkingSet
	if ws.Added == 0 || !strings.Contains(ws.Moved, "grew at its end") || ws.Hits == 0 {
		t.Errorf("the epoch's working set: %+v", ws)
	}
	if epoch.BackendPromptN != epoch.PromptTokens {
		t.Errorf("the epoch's prompt: ctxd counted %d, Ollama %d", epoch.PromptTokens, epoch.BackendPromptN)
	}
	if b := epoch.PrefixBreak; b == nil || b.Block != "codex" {
		t.Errorf("the epoch's prefix break: %+v (want the codex block: the blocks before it are the same)", b)
	}
	next, _ := ask(t, d.client, "wander", "And "+q)
	if next.WorkingSet == nil || next.WorkingSet.Hits == 0 || next.PrefixBreak != nil || next.CachedTokens < epoch.PromptTokens || next.BackendPromptN != next.PromptTokens {
		t.Errorf("the next question on the same handler: working set %+v, break %+v, %d cached of the epoch's %d, counted %d vs %d",
			next.WorkingSet, next.PrefixBreak, next.CachedTokens, epoch.PromptTokens, next.PromptTokens, next.BackendPromptN)
	}
}
