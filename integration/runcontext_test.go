package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/hostenv"
)

// wobble is host memory whose use the test sets, for a probe on a fake
// clock: the environment of a machine whose memory pressure wobbles.
type wobble struct {
	mu       sync.Mutex // guards used and now
	total    uint64
	used     float64 // fraction of total in use
	now      time.Time
	readings int
}

func (w *wobble) memory() (uint64, uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.readings++
	return w.total, w.total - uint64(w.used*float64(w.total)), nil
}

func (w *wobble) clock() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.now
}

// set moves the pressure to used and the clock on by step.
func (w *wobble) set(used float64, step time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.used, w.now = used, w.now.Add(step)
}

// TestRunContextKeepsItsPrefixUntilTheEpoch runs one session on the real
// Ollama while its environment wobbles (memory pressure crossing the
// moderate threshold and back within the hold time, between every turn)
// and one of its answers is verified mid-session. The environment block
// never changes and the karma block keeps its first choice, so every turn
// extends the last (the summaries' cached tokens prove it), until the
// governor's compaction begins a new epoch: there the karma block takes in
// the verified trace, the break is reported at the karma block with its
// reason, and the turn after extends the new prefix again.
func TestRunContextKeepsItsPrefixUntilTheEpoch(t *testing.T) {
	needOllama(t)
	root := t.TempDir()
	for rel, content := range map[string]string{
		"sys/class/power_supply/AC/type":   "Mains\n",
		"sys/class/power_supply/AC/online": "1\n",
		"proc/net/route":                   "Iface\tDestination\tGateway\tFlags\nlo\t0000007F\t00000000\t0001\neth0\t00000000\t0102A8C0\t0003\n",
	} {
		path := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w := &wobble{total: 64 << 30, used: 0.50, now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	probe := hostenv.New(hostenv.Config{HostMemory: w.memory, SysRoot: root, Now: w.clock, Load: func() (float64, error) { return 0.5, nil }})
	ctx := context.Background()
	if env, _ := probe.Tick(ctx); env.VRAM != "low" || env.Power != "ac" || env.Connectivity != "online" {
		t.Fatalf("first reading: %+v", env)
	}

	cfg := baseConfig(t, t.TempDir(), codexDir(t, 40))
	cfg.Limits.MaxDepth, cfg.Limits.CompactTo = 4, 2
	r := startOpts(t, cfg, true, daemon.Options{Sensor: probe, BackendEnv: []string{"PATH=" + os.Getenv("PATH")}})
	c := r.client

	// Between turns: pressure up past moderate's entry (0.60) for 3 s and
	// back, read once a second: shorter than the hold, so no band changes.
	wobbleOnce := func() {
		for _, u := range []float64{0.57, 0.62, 0.64, 0.61, 0.53, 0.49} {
			w.set(u, time.Second)
			probe.Tick(ctx)
		}
	}

	type turn struct {
		sum    *ctxd.Summary
		prompt string
	}
	var turns []turn
	askTurn := func(q string) turn {
		t.Helper()
		sum, err := c.Ask(ctx, ctxd.AskRequest{Session: "grounded", Query: q}, nil)
		if err != nil {
			t.Fatalf("ask %q: %v", q, err)
		}
		lp, err := c.LastPrompt(ctx, "grounded")
		if err != nil {
			t.Fatal(err)
		}
		tn := turn{sum, lp.Prompt}
		turns = append(turns, tn)
		t.Logf("turn %d: prompt %d tokens, cached %d (%.1f%%), epoch %d, karma %+v, break %+v, governor %+v",
			sum.Turn, sum.PromptTokens, sum.CachedTokens, sum.ReusePercent, sum.Epoch, sum.Karma, sum.PrefixBreak, sum.Governor)
		return tn
	}

	first := askTurn("What does Handler1 return?")
	if first.sum.Trace == 0 || first.sum.Karma == nil || first.sum.Karma.Epoch != 1 || len(first.sum.Karma.Traces) != 0 {
		t.Fatalf("turn 1: trace %d karma %+v", first.sum.Trace, first.sum.Karma)
	}
	if !strings.Contains(first.prompt, "vram_pressure: low") || !strings.Contains(first.prompt, "### KARMA\n(none)") {
		t.Fatalf("turn 1 prompt lacks the environment or karma block:\n%s", first.prompt[:min(len(first.prompt), 400)])
	}
	verified, err := c.Judge(ctx, first.sum.Trace, ctxd.KarmaVerify, ctxd.KarmaJudgement{Note: "checked against the codex"})
	if err != nil || verified.Status != ctxd.TraceVerified {
		t.Fatalf("verify: %+v %v", verified, err)
	}

	// Until the epoch ends: each turn extends the one before.
	boundary := -1
	for i := 2; i <= 7 && boundary < 0; i++ {
		wobbleOnce()
		prev := turns[len(turns)-1]
		cur := askTurn("And Handler" + string(rune('0'+i)) + "?")
		compacted := false
		for _, a := range cur.sum.Governor {
			compacted = compacted || a.Kind == ctxd.ActionCompact
		}
		if compacted {
			boundary = i
			break
		}
		if cur.sum.PrefixBreak != nil || cur.sum.Karma.Epoch != 1 || len(cur.sum.Karma.Traces) != 0 {
			t.Fatalf("turn %d (mid-epoch): break %+v karma %+v", i, cur.sum.PrefixBreak, cur.sum.Karma)
		}
		if !strings.HasPrefix(cur.prompt, prev.prompt) || cur.sum.CachedTokens < prev.sum.PromptTokens {
			t.Fatalf("turn %d does not extend turn %d: cached %d of %d, previous prompt %d tokens",
				i, i-1, cur.sum.CachedTokens, cur.sum.PromptTokens, prev.sum.PromptTokens)
		}
		if strings.Contains(cur.prompt, "checked against the codex") || !strings.Contains(cur.prompt, "vram_pressure: low") {
			t.Fatalf("turn %d: the karma or environment block changed mid-epoch", i)
		}
	}
	if boundary < 0 {
		t.Fatal("the governor never compacted: no epoch boundary within 7 turns")
	}

	// At the boundary: the new karma is in, and the break is at its block.
	at := turns[len(turns)-1]
	before := turns[len(turns)-2]
	if at.sum.Karma.Epoch != 2 || len(at.sum.Karma.Traces) != 1 || at.sum.Karma.Traces[0] != first.sum.Trace || !strings.Contains(at.sum.Karma.Began, "epoch") {
		t.Fatalf("boundary: karma %+v", at.sum.Karma)
	}
	if at.sum.PrefixBreak == nil || at.sum.PrefixBreak.Block != "karma" || !strings.Contains(at.sum.PrefixBreak.Reason, "karma epoch 2 began") {
		t.Errorf("boundary: break %+v", at.sum.PrefixBreak)
	}
	if !strings.Contains(at.prompt, "note: checked against the codex") {
		t.Error("boundary: the verified trace is not in the karma block")
	}
	karmaAt := strings.Index(at.prompt, "### KARMA")
	if karmaAt < 0 || at.prompt[:karmaAt] != before.prompt[:karmaAt] {
		t.Error("boundary: the blocks before karma changed")
	}
	if at.sum.CachedTokens == 0 || at.sum.CachedTokens >= before.sum.PromptTokens {
		t.Errorf("boundary: cached %d tokens; want the blocks before karma only (previous prompt %d)", at.sum.CachedTokens, before.sum.PromptTokens)
	}

	// After it: the new prefix holds again.
	wobbleOnce()
	after := askTurn("One more?")
	if after.sum.PrefixBreak != nil || after.sum.Karma.Epoch != 2 || !strings.HasPrefix(after.prompt, at.prompt) || after.sum.CachedTokens < at.sum.PromptTokens {
		t.Errorf("after the boundary: break %+v karma %+v cached %d (previous prompt %d)", after.sum.PrefixBreak, after.sum.Karma, after.sum.CachedTokens, at.sum.PromptTokens)
	}
	if n := probe.Counters(); n.Environment != 0 || n.Readings < 6*boundary {
		t.Errorf("probe counters %+v: the environment should never have changed over %d readings", n, 6*boundary)
	}
}
