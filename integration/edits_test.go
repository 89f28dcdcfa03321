package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bench"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/internal/reporoot"
	"github.com/ctxd/ctxd/llamatok"
)

// editsSub is the directory of this repository whose history the live
// check replays: small enough for the test model's window, with several
// commits.
const editsSub = "tokencount"

// TestEditsCostWhatTheReplayPredicts runs `ctxd-bench edits`' prediction
// live: a clone of this repository checked out at the replay's epoch is
// the codex (stability order) of a daemon on llama-server; each of the
// commits replayed is checked out in turn, the watcher reloads, and the
// next question's re-evaluated codex tokens (the codex block's tokens past
// llama-server's cache_n) must be what the replay predicted for that
// commit.
func TestEditsCostWhatTheReplayPredicts(t *testing.T) {
	needLlamaServer(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git clones this repository for the check: " + err.Error())
	}
	root, err := reporoot.Find()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "--is-shallow-repository").Output(); err != nil || strings.TrimSpace(string(out)) != "false" {
		t.Skipf("this repository's history is needed (a clone with history; is-shallow: %q, %v)", out, err)
	}
	clone := filepath.Join(t.TempDir(), "repo")
	gitRun(t, "", "clone", "-q", root, clone)

	mc := testModel()
	mc.ContextLength = 32768
	model := modelPath(t, mc)
	tok, err := llamatok.Open(model)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	run, err := bench.ReplayEdits(ctx, bench.EditsConfig{Name: "ctxd", Repo: clone, Sub: editsSub, Commits: 3, Counter: tok})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Commits) < 2 {
		t.Skipf("%s has %d commits in this clone's history; the check needs 2", editsSub, len(run.Commits))
	}
	// Stability order, as the daemon runs by default; then with
	// backend.cache_reuse, where an edit moves the changed files last and
	// llama-server shifts the ones after the first change.
	for _, reuse := range []int{0, bench.DefaultReuseChunk} {
		name := "stability"
		if reuse > 0 {
			name = "cache_reuse"
		}
		t.Run(name, func(t *testing.T) { checkEditsLive(t, ctx, run, clone, model, tok, reuse) })
	}
}

// checkEditsLive serves the clone's codex from the replay's epoch on a
// daemon with backend.cache_reuse = reuse, checks out each replayed
// commit, and compares what llama-server re-evaluated of the codex with
// the replay's prediction for that arm.
func checkEditsLive(t *testing.T, ctx context.Context, run bench.EditsRun, clone, model string, tok *llamatok.Tokenizer, reuse int) {
	gitRun(t, clone, "checkout", "-q", "--detach", run.Epoch)
	dir := filepath.Join(clone, editsSub)
	cfg := llamaConfig(t, t.TempDir(), dir)
	cfg.Backend.GGUF = model
	cfg.Backend.NumCtx = 24576
	cfg.Backend.CacheReuse = reuse
	cfg.Codex.Order = ctxd.OrderStability
	cfg.Codex.Watch = true
	d := start(t, cfg, true)
	defer d.stop()

	ask := func(q string) *ctxd.Summary {
		t.Helper()
		sum, err := d.client.Ask(ctx, ctxd.AskRequest{Session: "edits", Query: q}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	ask("What does the counter count?")
	for i, c := range run.Commits {
		gitRun(t, clone, "checkout", "-q", "--detach", c.Hash)
		waitForTree(t, d, dir)
		sum := ask(fmt.Sprintf("What changed in commit %d?", i+1))
		var lp ctxd.LastPrompt
		if err := d.client.GetJSON(ctx, "/v1/sessions/edits/prompt", &lp); err != nil {
			t.Fatal(err)
		}
		end := -1
		for _, b := range lp.Blocks {
			if b.Name == "codex" {
				end = b.Offset + b.Bytes
			}
		}
		if end < 0 || sum.BackendCachedTokens == nil {
			t.Fatalf("commit %s: no codex block in the prompt (%+v) or no cache_n from llama-server (%+v)", c.Hash[:12], lp.Blocks, sum)
		}
		upToCodexEnd, err := tok.Count(lp.Prompt[:end])
		if err != nil {
			t.Fatal(err)
		}
		// Shifted chunks past the codex (a commit that only removed
		// files) count in cache_n too: nothing of the codex evaluated.
		got := max(0, upToCodexEnd-*sum.BackendCachedTokens)
		want := c.StableTokens
		if reuse > 0 {
			want = c.ReuseTokens
		}
		// The replay counts file by file; the prompt is tokenized whole,
		// which may merge a token or two across a fence.
		tolerance := 16 + want/50
		t.Logf("commit %s (%d files changed): replay predicted %d codex tokens re-evaluated, llama-server re-evaluated %d (cache_n %d of %d; path order would re-evaluate %d, stability order %d)",
			c.Hash[:12], c.Files, want, got, *sum.BackendCachedTokens, sum.PromptTokens, c.PathTokens, c.StableTokens)
		if diff := got - want; diff > tolerance || diff < -tolerance {
			var st ctxd.CodexStats
			_ = d.client.GetJSON(ctx, "/v1/codex", &st)
			t.Logf("the replay's stability order: %v from %d; the daemon's: %+v; prompt order: %v", c.Order, c.From, st.Order, bench.PromptFiles(lp.Prompt))
			t.Errorf("commit %s: llama-server re-evaluated %d codex tokens, the replay predicted %d (tolerance %d)", c.Hash[:12], got, want, tolerance)
		}
	}
}

// gitRun runs git in dir ("" for the working directory).
func gitRun(t *testing.T, dir string, args ...string) {
	t.Helper()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// waitForTree waits until the daemon's codex holds dir's files as they are
// on disk (the watcher's reload after a checkout).
func waitForTree(t *testing.T, d *running, dir string) {
	t.Helper()
	want := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(data)
			want[e.Name()] = hex.EncodeToString(sum[:])
		}
	}
	waitFor(t, func() bool {
		var files struct {
			Files []ctxd.CodexFile `json:"files"`
		}
		if err := d.client.GetJSON(context.Background(), "/v1/codex/files", &files); err != nil || len(files.Files) != len(want) {
			return false
		}
		for _, f := range files.Files {
			if want[f.Path] != f.SHA256 {
				return false
			}
		}
		return true
	})
}

var rollbackWrite = flag.String("rollback-write", "", "write the branch-switch-back measurement into this Markdown file (bench:rollback markers)")

// TestBranchSwitchBackRestoresItsSlot: a codex in a git work tree, served
// on llama-server (whose managed server saves each new stable prefix's
// slot); switching to another branch and back renders the first branch's
// codex in the order it had (codex.Order.Revisited), so its saved slot is
// restored instead of the prefix evaluated: the next question evaluates
// only its own tokens. Its time to first token against the cold first
// question is logged (and written with -rollback-write).
func TestBranchSwitchBackRestoresItsSlot(t *testing.T) {
	needLlamaServer(t)
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git makes the work tree of this test: " + err.Error())
	}
	repo := filepath.Join(t.TempDir(), "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	gitRun(t, repo, "init", "-q", "-b", "main")
	gitRun(t, repo, "config", "user.email", "t@t")
	gitRun(t, repo, "config", "user.name", "t")
	for i := range 8 {
		var sb strings.Builder
		for j := 0; sb.Len() < 3500; j++ {
			fmt.Fprintf(&sb, "// Handler%d_%d serves request kind %d of package %d.\nfunc Handler%d_%d(n int) error {\n\treturn fmt.Errorf(\"kind %%d\", n+%d)\n}\n\n", i, j, j, i, i, j, j)
		}
		if err := os.WriteFile(filepath.Join(repo, fmt.Sprintf("pkg%d.go", i)), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, repo, "add", "-A")
	gitRun(t, repo, "commit", "-q", "-m", "main")
	gitRun(t, repo, "checkout", "-q", "-b", "other")
	for _, f := range []string{"pkg2.go", "pkg5.go"} {
		if err := os.WriteFile(filepath.Join(repo, f), []byte("package p // rewritten on the other branch\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, repo, "commit", "-q", "-am", "other")
	gitRun(t, repo, "checkout", "-q", "main")

	mc := testModel()
	mc.ContextLength = 32768
	cfg := llamaConfig(t, t.TempDir(), repo)
	cfg.Backend.GGUF = modelPath(t, mc)
	cfg.Backend.NumCtx = 16384
	cfg.Codex.Order = ctxd.OrderStability
	cfg.Codex.Watch = true
	d := start(t, cfg, true)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	ask := func(session, q string) *ctxd.Summary {
		t.Helper()
		sum, err := d.client.Ask(ctx, ctxd.AskRequest{Session: session, Query: q}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	cold := ask("first", "What does Handler3_4 return?")
	if cold.EvaluatedTokens < cold.PromptTokens/2 {
		t.Fatalf("the first question evaluated %d of %d tokens: not cold", cold.EvaluatedTokens, cold.PromptTokens)
	}
	gitRun(t, repo, "checkout", "-q", "other")
	waitForTree(t, d, repo)
	other := ask("second", "What does Handler3_4 return on this branch?")
	gitRun(t, repo, "checkout", "-q", "main")
	waitForTree(t, d, repo)
	var st ctxd.CodexStats
	if err := d.client.GetJSON(ctx, "/v1/codex", &st); err != nil {
		t.Fatal(err)
	}
	if !st.Order.Revisited {
		t.Errorf("back on main, the codex order is %+v: not the version seen before", st.Order)
	}
	back := ask("third", "What does Handler3_4 return?")
	t.Logf("cold: %d of %d tokens evaluated, TTFT %.0f ms; the other branch: %d of %d, %.0f ms; back on main: %d of %d, %.0f ms (restore %.0f ms)",
		cold.EvaluatedTokens, cold.PromptTokens, cold.TTFTMillis, other.EvaluatedTokens, other.PromptTokens, other.TTFTMillis,
		back.EvaluatedTokens, back.PromptTokens, back.TTFTMillis, back.Timing.RestoreMs)
	if back.Timing.RestoreMs <= 0 || back.EvaluatedTokens > back.PromptTokens/10 {
		t.Errorf("back on main: %d of %d tokens evaluated, restore %.0f ms; want the saved slot restored and only the question evaluated",
			back.EvaluatedTokens, back.PromptTokens, back.Timing.RestoreMs)
	}
	if *rollbackWrite != "" && !t.Failed() {
		body := fmt.Sprintf("Measured %s by `integration/TestBranchSwitchBackRestoresItsSlot -rollback-write` (llama-server, the generated test model, 2 cores): a codex of %d files (%d bytes) in a git work tree; a question on `main` (cold), one after switching to a branch that rewrote 2 of its 8 files, and one after switching back to `main`.\n\n"+
			"| question | prompt tokens | evaluated | time to first token |\n|---|---|---|---|\n"+
			"| `main`, cold | %d | %d | %.0f ms |\n| the other branch | %d | %d | %.0f ms |\n| back on `main` (its saved slot restored in %.0f ms) | %d | %d | %.0f ms |\n\n"+
			"Back on `main` the first token came %.1f× sooner than cold.\n",
			time.Now().UTC().Format(time.RFC3339), st.Files, st.Bytes, cold.PromptTokens, cold.EvaluatedTokens, cold.TTFTMillis,
			other.PromptTokens, other.EvaluatedTokens, other.TTFTMillis, back.Timing.RestoreMs, back.PromptTokens, back.EvaluatedTokens, back.TTFTMillis,
			cold.TTFTMillis/max(1, back.TTFTMillis))
		if err := bench.WriteBetween(*rollbackWrite, "<!-- bench:rollback:begin (written by `make bench-rollback`) -->", "<!-- bench:rollback:end -->", body); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKarmaGoesStaleWithItsCode: a verified trace records the code it
// holds for (here, in RAG mode, the files of the working set and the
// excerpts its question carried). An edit of another file leaves it
// valid; an edit of one of its files makes it stale: listed by `stale`,
// left out of the next karma epoch's block, kept in the record; verifying
// it again against the current code restores it.
func TestKarmaGoesStaleWithItsCode(t *testing.T) {
	needLlamaServer(t)
	dir := t.TempDir()
	for i := range 8 {
		var sb strings.Builder
		for j := 0; sb.Len() < 6000; j++ {
			fmt.Fprintf(&sb, "// Handler%d_%d serves request kind %d of package %d.\nfunc Handler%d_%d(n int) error {\n\treturn fmt.Errorf(\"kind %%d\", n+%d)\n}\n\n", i, j, j, i, i, j, j)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("pkg%d.go", i)), []byte(sb.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := llamaConfig(t, t.TempDir(), dir)
	cfg.Codex.Watch = true
	d := start(t, cfg, true)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	sum, _ := ask(t, d.client, "first", "What does Handler3_4 return?")
	if sum.Mode != "rag" || sum.Trace == 0 {
		t.Fatalf("the first answer: mode %s, trace %d; want a RAG answer recorded as a trace", sum.Mode, sum.Trace)
	}
	if _, err := d.client.Judge(ctx, sum.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: "checked"}); err != nil {
		t.Fatal(err)
	}
	h, err := d.client.Trace(ctx, sum.Trace)
	if err != nil {
		t.Fatal(err)
	}
	bound := h.Trace.Bound()
	if len(bound.Files) == 0 || bound.Whole || h.Trace.Stale != "" {
		t.Fatalf("the verified trace holds for %+v (stale %q): want the files its prompt held", bound, h.Trace.Stale)
	}
	depends := map[string]bool{}
	for _, f := range bound.Files {
		depends[f.Path] = true
	}
	var other, own string
	for i := range 8 {
		if p := fmt.Sprintf("pkg%d.go", i); depends[p] && own == "" {
			own = p
		} else if !depends[p] && other == "" {
			other = p
		}
	}
	if own == "" || other == "" {
		t.Fatalf("the trace depends on %v: the test needs one file it depends on and one it does not", depends)
	}
	stale := func() []int64 {
		t.Helper()
		list, err := d.client.Karma(ctx, client.KarmaFilter{Stale: true})
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, tr := range list {
			ids = append(ids, tr.ID)
		}
		return ids
	}
	edit := func(name string) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(f, "// edited at %s\n", time.Now().Format(time.RFC3339Nano))
		f.Close()
		waitForTree(t, d, dir)
	}
	inBlock := func(session string) bool {
		t.Helper()
		s, _ := ask(t, d.client, session, "What does Handler3_4 return?")
		return s.Karma != nil && slices.Contains(s.Karma.Traces, sum.Trace)
	}

	edit(other)
	if ids := stale(); len(ids) != 0 {
		t.Errorf("after editing %s, which the trace does not depend on: stale %v", other, ids)
	}
	if !inBlock("second") {
		t.Error("a valid verified trace is not in a new session's karma block")
	}
	edit(own)
	if ids := stale(); !slices.Equal(ids, []int64{sum.Trace}) {
		t.Errorf("after editing %s, which it depends on: stale %v, want [%d]", own, ids, sum.Trace)
	}
	if h, err := d.client.Trace(ctx, sum.Trace); err != nil || !strings.Contains(h.Trace.Stale, own) || h.Trace.Status != ctxd.TraceVerified {
		t.Errorf("the stale trace: %+v, %v; want it kept, verified, stale naming %s", h, err, own)
	}
	if inBlock("third") {
		t.Error("a stale trace is in a new karma epoch's block")
	}
	if _, err := d.client.Judge(ctx, sum.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: "still right"}); err != nil {
		t.Fatal(err)
	}
	if ids := stale(); len(ids) != 0 {
		t.Errorf("after verifying it again: stale %v", ids)
	}
	if !inBlock("fourth") {
		t.Error("the trace verified again is not back in the karma block")
	}
}
