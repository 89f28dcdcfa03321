package orchestrator_test

// BenchmarkPrepareOverflow measures the governor on turns that overflow
// the window: every RAG excerpt of the question is left out, one at a time,
// then the karma block is pruned (half of it, then an entry at a time)
// until the prompt fits. It uses the orchestrator's exported API only, so
// the same file runs on older commits (scripts/bench-governor.sh runs it
// side by side with a base commit).
//
// The tokenizer makes a token of every byte (exact, as the fake one) and
// costs time in proportion to the text it is given, like a real one (see
// nsPerByte). Every turn has content of its own (its question, excerpts,
// history and karma texts), as real turns do: nothing a turn counts is
// already in the counter's caches, but the codex, counted once by the
// first turn, as the codex service counts it once per load.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/orchestrator"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/scheduler"
	"github.com/ctxd/ctxd/sigils"
	"github.com/ctxd/ctxd/tokencount"
)

// The overflow turn's shape.
const (
	benchExcerpts     = 24    // the question's excerpts, all left out
	benchExcerptBytes = 1200  // each
	benchKarma        = 24    // karma entries, 16 of them pruned
	benchKarmaPruned  = 16    // 12 (half) at the first prune, then 4 one at a time
	benchHistory      = 12    // turns the client resends
	benchTurnBytes    = 700   // each, query and answer
	benchCodexBytes   = 32000 // the RAG codex block (the working set's map)
)

// costlyTokenizer makes one token of each byte, at a cost of rounds of
// hashing per byte (a real tokenizer's merges), and counts the bytes it
// tokenized.
type costlyTokenizer struct {
	rounds int
	bytes  *atomic.Int64
	sink   *atomic.Uint32
}

func (c costlyTokenizer) Tokenize(s string) ([]int, error) {
	c.bytes.Add(int64(len(s)))
	out := make([]int, len(s))
	h := uint32(2166136261)
	for i := range len(s) {
		for range c.rounds {
			h = (h ^ uint32(s[i])) * 16777619
		}
		out[i] = int(s[i])
	}
	c.sink.Store(h)
	return out, nil
}

func (c costlyTokenizer) TokenizeText(s string) ([]int, error) { return c.Tokenize(s) }

func (c costlyTokenizer) CountText(s string) (int, error) {
	ids, err := c.Tokenize(s)
	return len(ids), err
}

// benchRetriever finds benchExcerpts excerpts of the question's own.
type benchRetriever struct{}

func (benchRetriever) Search(_ context.Context, q string, k int) ([]ctxd.Excerpt, error) {
	out := make([]ctxd.Excerpt, k)
	for i := range out {
		line := fmt.Sprintf("func f%02d() { return %q } // for %s\n", i, "value", q)
		out[i] = ctxd.Excerpt{Path: fmt.Sprintf("pkg/f%02d.go", i), Lines: "1-40", Text: pad(line, benchExcerptBytes)}
	}
	return out, nil
}

// pad repeats line to n bytes.
func pad(line string, n int) string {
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// benchKarmaStore is a karma store whose eligible traces have texts of the
// current round (a turn of its own): equal lengths, scores by age.
type benchKarmaStore struct {
	*fake.Karma
	round atomic.Int64
}

var benchEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (k *benchKarmaStore) Eligible(_ context.Context, sigil string) ([]ctxd.Trace, error) {
	r := k.round.Load()
	out := make([]ctxd.Trace, benchKarma)
	for i := range out {
		out[i] = ctxd.Trace{ID: int64(10 + i), Sigil: sigil, Status: ctxd.TraceVerified, CreatedAt: benchEpoch.Add(time.Duration(i) * time.Hour),
			Query:  fmt.Sprintf("how is thing %02d of round %06d done?", i, r),
			Answer: pad(fmt.Sprintf("thing %02d of round %06d is done this way. ", i, r), 300)}
	}
	return out, nil
}

// benchTurn is the request of round r.
func benchTurn(r int) ctxd.AskRequest {
	hist := make([]ctxd.Turn, benchHistory)
	for i := range hist {
		hist[i] = ctxd.Turn{Query: pad(fmt.Sprintf("round %06d question %02d ", r, i), benchTurnBytes/2),
			Answer: pad(fmt.Sprintf("round %06d answer %02d ", r, i), benchTurnBytes/2)}
	}
	return ctxd.AskRequest{Session: fmt.Sprintf("bench-%06d", r), Query: fmt.Sprintf("round %06d: where is the value set?", r), History: hist}
}

// newBenchOrchestrator is an orchestrator over the costly tokenizer, in
// RAG mode with karma.
func newBenchOrchestrator(b *testing.B, lim governor.Limits, tok costlyTokenizer, k *benchKarmaStore) *orchestrator.Orchestrator {
	b.Helper()
	reg, err := sigils.NewRegistry(map[string][]string{"agent": {"ask", "karma:read", "karma:write"}}, "agent")
	if err != nil {
		b.Fatal(err)
	}
	o, err := orchestrator.New(orchestrator.Config{
		Identity: runcontext.Identity{Name: "bench", Persona: "Answer from the codex."},
		Format:   runcontext.Plain{Special: []string{"<|im_start|>", "<|im_end|>", "</s>", "<s>"}},
		Limits:   lim, Sigils: reg, TopK: benchExcerpts,
		Karma: orchestrator.KarmaConfig{Store: k, Model: "bench", Options: karma.Options{TopK: benchKarma, MaxChars: 100000}},
	}, fake.NewBackend(), tokencount.New(tok, nil), fake.NewStore(), fake.NewSensor(), scheduler.New(scheduler.Options{Slots: 1}))
	if err != nil {
		b.Fatal(err)
	}
	block := runcontext.Codex{Name: "big", Mode: runcontext.ModeRAG, Body: pad("pkg/fNN.go: functions f00 to f99, their values and their callers\n", benchCodexBytes)}
	plan := ctxd.CodexPlan{Mode: runcontext.ModeRAG, Reason: "too big"}
	// scripts/bench-governor.sh builds this file at an older commit too,
	// whose SetCodex took no limits.
	switch s := any(o).(type) {
	case interface {
		SetCodex(runcontext.Codex, ctxd.CodexPlan, ctxd.Retriever, governor.Limits)
	}:
		s.SetCodex(block, plan, benchRetriever{}, o.Limits())
	case interface {
		SetCodex(runcontext.Codex, ctxd.CodexPlan, ctxd.Retriever)
	}:
		s.SetCodex(block, plan, benchRetriever{})
	default:
		b.Fatal("the orchestrator has no SetCodex this benchmark knows")
	}
	return o
}

// hashRounds is the costly tokenizer's rounds of hashing per byte: about
// 50 ns a byte on the 2-core test machine (the benchmark reports it as
// tokenizer-ns/byte), the order of llama.cpp's own tokenizers (the codex
// benchmark in docs/benchmarks.md counts 98.6 MB in 25 s at the lowest
// priority, about 250 ns a byte).
const hashRounds = 36

// tokenizerCost is the tokenizer's time per byte, in ns.
func tokenizerCost(tok costlyTokenizer) float64 {
	text := pad("a line of text to tokenize\n", 1<<18)
	start := time.Now()
	for range 4 {
		_, _ = tok.Tokenize(text)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(4*len(text))
}

func BenchmarkPrepareOverflow(b *testing.B) {
	tokenized, sink := &atomic.Int64{}, &atomic.Uint32{}
	tok := costlyTokenizer{rounds: hashRounds, bytes: tokenized, sink: sink}
	cost := tokenizerCost(tok)
	k := &benchKarmaStore{Karma: fake.NewKarma()}

	// A roomy window measures the turn, to size the window that overflows.
	roomy := newBenchOrchestrator(b, governor.Limits{NumCtx: 1 << 20, AnswerReserve: 256}, tok, k)
	k.round.Store(-1)
	full, err := roomy.Ask(b.Context(), benchTurn(-1), func(string) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	if full.Excerpts != benchExcerpts || full.Karma == nil || len(full.Karma.Traces) != benchKarma {
		b.Fatalf("the roomy turn is not the shape asked for: %d excerpts, karma %+v", full.Excerpts, full.Karma)
	}
	query := full.Budget.Blocks[runcontext.BlockQuery].Tokens
	bare := len(runcontext.RenderQuery(benchTurn(-1).Query, nil))
	entry := (full.Budget.Blocks[runcontext.BlockKarma].Tokens - len("### KARMA\n\n")) / benchKarma
	// Room for all but the excerpts and benchKarmaPruned-½ karma entries.
	prompt := full.PromptTokens - (query - bare) - (2*benchKarmaPruned-1)*entry/2
	lim := governor.Limits{NumCtx: prompt + 256, AnswerReserve: 256}

	o := newBenchOrchestrator(b, lim, tok, k)
	round := 0
	ask := func() *ctxd.Summary {
		k.round.Store(int64(round))
		sum, err := o.Ask(b.Context(), benchTurn(round), func(string) error { return nil })
		round++
		if err != nil {
			b.Fatal(err)
		}
		excerpts, pruned := 0, 0
		for _, a := range sum.Governor {
			switch a.Kind {
			case ctxd.ActionExcerpts:
				excerpts++
			case ctxd.ActionKarma:
				pruned++
			}
		}
		// 1 + 4 prunes: half the entries, then one at a time.
		if sum.Excerpts != 0 || excerpts != 1 || pruned != 1+benchKarmaPruned-benchKarma/2 || len(sum.Karma.Traces) != benchKarma-benchKarmaPruned {
			b.Fatalf("round %d: %d excerpts kept, governor %+v, karma %+v: not the overflow asked for", round, sum.Excerpts, sum.Governor, sum.Karma)
		}
		if sum.PromptTokens > lim.PromptBudget() {
			b.Fatalf("round %d: %d prompt tokens sent, over the budget of %d", round, sum.PromptTokens, lim.PromptBudget())
		}
		return sum
	}
	ask() // the codex counted once, as at load
	tokenized.Store(0)
	var governorMs float64
	b.ResetTimer()
	for range b.N {
		governorMs += ask().Timing.GovernorMs
	}
	b.StopTimer()
	b.ReportMetric(governorMs/float64(b.N), "governor-ms/op")
	b.ReportMetric(float64(tokenized.Load())/float64(b.N)/1000, "tokenized-kB/op")
	b.ReportMetric(float64(full.PromptTokens), "full-prompt-tokens")
	b.ReportMetric(float64(lim.PromptBudget()), "budget-tokens")
	b.ReportMetric(cost, "tokenizer-ns/byte")
}
