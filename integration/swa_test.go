package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/ollamatest"
	"github.com/ctxd/ctxd/internal/realmodel"
)

var swaWrite = flag.String("swa-write", "", "rewrite the sliding-window table of this file (docs/models.md)")

// swaRow is what one backend did with a sliding-window model.
type swaRow struct {
	backend                    string
	prompt1, prompt2, reused2  int // the session's turns: turn 2 reused reused2 of prompt2
	expected3, reused3, prompt int // a new session over the same codex: ctxd expected expected3, the backend reused reused3
	ttft1, ttft2, ttft3        float64
	format, note               string
	appendOnly                 bool
}

// TestSlidingWindowReuse measures what each backend reuses of a
// sliding-window model's cache (Gemma 3: 512 tokens in 15 of 18 layers)
// with a codex far longer than the window: a session's second turn, and a
// new session's first over the same codex, which shares only the codex
// prefix. The reuse is the backend's own count (llama-server's cache_n;
// Ollama's runner log, "loading cache slot ... used"). On llama-server,
// which ctxd starts with --swa-full, both must reuse all ctxd expected;
// on Ollama the test reports what it does. With -swa-write it writes the
// table into docs/models.md.
func TestSlidingWindowReuse(t *testing.T) {
	needOllama(t)
	var rows []swaRow
	forEachBackend(t, func(t *testing.T, b backend) {
		model := realmodel.Gemma3Chat(t)
		state := t.TempDir()
		cfg := b.config(t, state, codexDir(t, 6000))
		cfg.Backend.GGUF, cfg.Backend.Model = model, "gemma3-chat"
		cfg.Limits.AnswerReserve = 24
		d := startEnv(t, cfg, true, "OLLAMA_DEBUG=1")
		var st httpapi.Status
		if err := d.client.GetJSON(context.Background(), "/v1/status", &st); err != nil {
			t.Fatal(err)
		}
		if st.Window == nil || st.Window.SlidingWindow != 512 {
			t.Fatalf("window plan %+v: want Gemma 3's 512-token sliding window", st.Window)
		}
		label := st.Backend.Version
		if b.name == "ollama" {
			// The pinned builds report 0.0.0: their file names say which.
			bin, _ := filepath.EvalSymlinks(ollamatest.Binary(t))
			label = "Ollama " + strings.TrimPrefix(filepath.Base(bin), "ollama-")
		}
		row := swaRow{backend: label, format: st.Backend.Format.Name, appendOnly: st.Backend.Format.AppendOnly, note: st.Backend.Format.Note}
		t.Logf("format %+v", st.Backend.Format)
		s1, _ := ask(t, d.client, "one", "What does Handler3 return?")
		s2, _ := ask(t, d.client, "one", "Which handler serves kind 7?")
		s3, _ := ask(t, d.client, "two", "Summarize the README.")
		// What the backend says it reused: llama-server's cache_n, or the
		// last slot loads of Ollama's log (these three requests).
		row.reused2, row.reused3 = -1, -1
		if b.name != "ollama" { // llama-server, or its OpenAI routes
			if s2.BackendCachedTokens == nil || s3.BackendCachedTokens == nil {
				t.Fatal("llama-server reported no reuse")
			}
			row.reused2, row.reused3 = *s2.BackendCachedTokens, *s3.BackendCachedTokens
		} else {
			used := ollamaSlotLoads(t, state)
			if len(used) < 3 {
				t.Fatalf("%d slot loads in Ollama's log for 3 requests (is OLLAMA_DEBUG honoured?)", len(used))
			}
			row.reused2, row.reused3 = used[len(used)-2], used[len(used)-1]
		}
		row.prompt1, row.prompt2 = s1.PromptTokens, s2.PromptTokens
		row.expected3, row.prompt = s3.CachedTokens, s3.PromptTokens
		row.ttft1, row.ttft2, row.ttft3 = s1.TTFTMillis, s2.TTFTMillis, s3.TTFTMillis
		t.Logf("%s: turn 2 reused %d of %d (ctxd expected %d), ttft %.0f ms after %.0f ms cold; a new session reused %d of %d (ctxd expected %d), ttft %.0f ms",
			row.backend, row.reused2, row.prompt2, s2.CachedTokens, row.ttft2, row.ttft1, row.reused3, row.prompt, row.expected3, row.ttft3)
		if s1.PromptTokens <= 2*512 || s3.CachedTokens <= 512 {
			t.Fatalf("the prompts (%d tokens, %d shared) are not longer than the window: nothing is measured", s1.PromptTokens, s3.CachedTokens)
		}
		// llama-server, with the windowed layers' cache whole, reuses all
		// ctxd expects: a session's next turn, and a new session's codex
		// prefix. Ollama's windowed cache is measured and reported.
		if b.name != "ollama" {
			if row.reused2 < s2.CachedTokens || float64(row.reused2) < 0.95*float64(row.prompt2) {
				t.Errorf("llama-server: turn 2 reused %d of %d prompt tokens, ctxd expected %d", row.reused2, row.prompt2, s2.CachedTokens)
			}
			if row.reused3 < row.expected3 {
				t.Errorf("llama-server with --swa-full reused %d tokens of a new session's prompt, ctxd expected %d", row.reused3, row.expected3)
			}
		}
		rows = append(rows, row)
	})
	if *swaWrite != "" && !t.Failed() && len(rows) > 0 {
		writeSWATable(t, *swaWrite, rows)
	}
}

// ollamaSlotLoads are the prompt tokens Ollama's runner reused for each
// request, in order, from its debug log ("loading cache slot ... used=N").
func ollamaSlotLoads(t *testing.T, state string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "ollama", "ollama.log"))
	if err != nil {
		t.Fatal(err)
	}
	var used []int
	for _, m := range regexp.MustCompile(`msg="loading cache slot".* used=(\d+)`).FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[1])
		used = append(used, n)
	}
	return used
}

// writeSWATable replaces the sliding-window block of the file at path.
func writeSWATable(t *testing.T, path string, rows []swaRow) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- swa:begin (written by `make swa-table`) -->\n", "<!-- swa:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no swa block", path)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "Measured %s by `make swa-table` (`TestSlidingWindowReuse`): Gemma 3 270M with its instruct template (realmodel.Gemma3Chat), prompts of about %s tokens, of which both sessions share %s (the window is 512), 24-token answers. Reuse is the backend's own count: llama-server's `cache_n`, Ollama's runner log (`loading cache slot … used`).\n\n", time.Now().UTC().Format("2006-01-02"), fmt.Sprintf("%d", rows[0].prompt1), fmt.Sprintf("%d", rows[0].expected3))
	sb.WriteString("| backend | prompt format | turn 1: prompt, time to first token | turn 2 of the session: reused of prompt, time to first token | a new session over the same codex: reused (ctxd expected) of prompt, time to first token |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		format := r.format + ", append-only"
		if !r.appendOnly {
			format = r.format + ", not append-only: " + r.note
		}
		fmt.Fprintf(&sb, "| %s | %s | %d tokens, %.0f ms | %d of %d, %.0f ms | %d (%d) of %d, %.0f ms |\n",
			r.backend, format, r.prompt1, r.ttft1, r.reused2, r.prompt2, r.ttft2, r.reused3, r.expected3, r.prompt, r.ttft3)
	}
	s = s[:i+len(begin)] + sb.String() + s[j:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
