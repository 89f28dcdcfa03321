package integration

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ctxd/ctxd"
)

// slotLoad is one "loading cache slot" line of the runner's debug log: how
// many tokens the slot held, how long the prompt was, how many it reused.
type slotLoad struct{ slot, cache, prompt, used int }

var slotLoadRE = regexp.MustCompile(`msg="loading cache slot" id=(\d+) cache=(\d+) prompt=(\d+) used=(\d+)`)

// slotLoads reads the managed server's log (OLLAMA_DEBUG=1) in state.
func slotLoads(t *testing.T, state string) []slotLoad {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "ollama", "ollama.log"))
	if err != nil {
		t.Fatal(err)
	}
	var out []slotLoad
	for _, m := range slotLoadRE.FindAllStringSubmatch(string(b), -1) {
		var l slotLoad
		for i, p := range []*int{&l.slot, &l.cache, &l.prompt, &l.used} {
			*p, _ = strconv.Atoi(m[i+1])
		}
		out = append(out, l)
	}
	return out
}

// TestInterleavedSessionsOnTheRealBackend runs two sessions, A and B,
// through the socket: on one slot their turns take turns (A B A B A B); on
// two slots each round sends both at once. Every request's reuse figure is
// checked against what Ollama's runner says it reused (its debug log), so
// the scheduler's prediction of the runner's slot choice is exact. On one
// slot each turn reuses the shared stable blocks only; on two, each
// session keeps a slot and reuses its whole previous prompt.
func TestInterleavedSessionsOnTheRealBackend(t *testing.T) {
	needOllama(t)
	for _, slots := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d slots", slots), func(t *testing.T) {
			state := t.TempDir()
			cfg := baseConfig(t, state, codexDir(t, 3000))
			cfg.Backend.Slots = slots
			d := startEnv(t, cfg, true, "OLLAMA_DEBUG=1")
			prev := map[string]*ctxd.Summary{}
			var rounds [][]*ctxd.Summary
			for turn := range 3 {
				round := make([]*ctxd.Summary, 2)
				var wg sync.WaitGroup
				for i, s := range []string{"A", "B"} {
					q := fmt.Sprintf("Session %s, turn %d: which handler serves kind %d?", s, turn+1, 7*turn+i)
					if slots == 1 {
						round[i], _ = ask(t, d.client, s, q)
						continue
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						sum, err := d.client.Ask(context.Background(), ctxd.AskRequest{Session: s, Query: q}, nil)
						if err != nil {
							t.Error(err)
							return
						}
						round[i] = sum
					}()
				}
				wg.Wait()
				if t.Failed() {
					t.FailNow()
				}
				for _, sum := range round {
					s := sum.Session
					t.Logf("session %s turn %d: slot %d, %d prompt tokens, %d cached (%.1f%%), %d evaluated, ttft %.0f ms",
						s, sum.Turn, sum.Slot, sum.PromptTokens, sum.CachedTokens, sum.ReusePercent, sum.EvaluatedTokens, sum.TTFTMillis)
					if sum.BackendPromptN != sum.PromptTokens {
						t.Errorf("session %s turn %d: ctxd counted %d prompt tokens, the backend %d", s, sum.Turn, sum.PromptTokens, sum.BackendPromptN)
					}
					if p := prev[s]; p != nil {
						if slots == 2 && sum.CachedTokens != p.PromptTokens {
							t.Errorf("two slots: session %s turn %d expects %d cached tokens, want its whole previous prompt (%d)", s, sum.Turn, sum.CachedTokens, p.PromptTokens)
						}
						if slots == 1 && sum.CachedTokens >= p.PromptTokens {
							t.Errorf("one slot: session %s turn %d expects %d cached tokens, but the other session's turn took the slot", s, sum.Turn, sum.CachedTokens)
						}
						if sum.PrefixBreak != nil {
							t.Errorf("session %s turn %d broke its prefix: %+v", s, sum.Turn, sum.PrefixBreak)
						}
					}
					prev[s] = sum
				}
				rounds = append(rounds, round)
			}
			loads := slotLoads(t, state)
			if len(loads) < 2*len(rounds) {
				t.Fatalf("%d slot loads in the backend's log for %d requests (is OLLAMA_DEBUG honoured?)", len(loads), 2*len(rounds))
			}
			loads = loads[len(loads)-2*len(rounds):]
			// Per round, ctxd's (prompt, cached) pairs must be the runner's
			// (prompt, used) pairs. Slot numbers are ctxd's own labels on
			// Ollama: the runner numbers the slots in the order requests
			// reach it.
			for r, round := range rounds {
				var want, got []string
				for _, sum := range round {
					want = append(want, fmt.Sprintf("%d/%d", sum.CachedTokens, sum.PromptTokens))
				}
				for _, l := range loads[2*r : 2*r+2] {
					got = append(got, fmt.Sprintf("%d/%d", l.used, l.prompt))
				}
				slices.Sort(want)
				slices.Sort(got)
				if !slices.Equal(want, got) {
					t.Errorf("round %d: ctxd expected cached/prompt tokens %v, the runner reused %v", r+1, want, got)
				}
			}
		})
	}
}

// TestCancelMidAnswerStopsTheBackend cancels a request after its first
// tokens and checks, in the runner's own log, that the slot stopped
// growing: the next request finds the cancelled prompt plus a few tokens,
// not the hundreds the answer was allowed. It also checks that ctxd's
// expectation for the next request matches what the runner reused.
func TestCancelMidAnswerStopsTheBackend(t *testing.T) {
	needOllama(t)
	state := t.TempDir()
	cfg := baseConfig(t, state, codexDir(t, 2000))
	cfg.Limits.AnswerReserve = 600
	cfg.Backend.Temperature = 0.8 // greedy random weights repeat one token, which Ollama aborts
	cfg.Backend.Seed = 11
	d := startEnv(t, cfg, true, "OLLAMA_DEBUG=1")

	tokens := askAndCancel(t, d.client, "cancelled", "Tell me a very long story about every handler.")
	sum, _ := ask(t, d.client, "next", "Which handler serves kind 3?")
	loads := slotLoads(t, state)
	if len(loads) < 2 {
		t.Fatalf("%d slot loads in the backend's log (is OLLAMA_DEBUG honoured?)", len(loads))
	}
	cancelled, next := loads[len(loads)-2], loads[len(loads)-1]
	generated := next.cache - cancelled.prompt
	t.Logf("cancelled after %d pieces: its prompt was %d tokens; the next request found %d tokens in the slot (%d generated of %d allowed); ctxd expected %d cached, the runner reused %d",
		tokens, cancelled.prompt, next.cache, generated, cfg.Limits.AnswerReserve, sum.CachedTokens, next.used)
	if generated > cfg.Limits.AnswerReserve/3 {
		t.Errorf("the backend generated %d tokens of the cancelled answer (allowed %d): it did not stop", generated, cfg.Limits.AnswerReserve)
	}
	if sum.CachedTokens != next.used {
		t.Errorf("after the cancel ctxd expected %d cached tokens, the runner reused %d", sum.CachedTokens, next.used)
	}
	var s ctxd.SessionTurns
	if err := d.client.GetJSON(context.Background(), "/v1/sessions/cancelled", &s); err != nil || len(s.Turns) != 0 {
		t.Errorf("the cancelled answer was recorded: %+v %v", s, err)
	}
}

// TestEveryIntegrationTestNeedsOllama keeps the suite honest: every test
// here starts with needOllama (or needLlamaServer), so a missing binary
// skips (or, in make test, fails) the test itself instead of its subtests,
// which would report PASS.
func TestEveryIntegrationTestNeedsOllama(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			// A ...Helper test is another process's half of a test (run as
			// another user), which returns at once in a normal run.
			if !ok || fn.Recv != nil || fn.Name.Name == "TestMain" || fn.Name.Name == "TestEveryIntegrationTestNeedsOllama" || strings.HasSuffix(fn.Name.Name, "Helper") ||
				!strings.HasPrefix(fn.Name.Name, "Test") && !strings.HasPrefix(fn.Name.Name, "Benchmark") {
				continue
			}
			first := ""
			if len(fn.Body.List) > 0 {
				if es, ok := fn.Body.List[0].(*ast.ExprStmt); ok {
					if call, ok := es.X.(*ast.CallExpr); ok {
						if id, ok := call.Fun.(*ast.Ident); ok {
							first = id.Name
						}
					}
				}
			}
			if first != "needOllama" && first != "needLlamaServer" {
				t.Errorf("%s: %s does not start with needOllama or needLlamaServer", name, fn.Name.Name)
			}
		}
	}
}
