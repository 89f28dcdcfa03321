package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/load"
	"github.com/shirou/gopsutil/v4/mem"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/runcontext"
)

// Turn is one measured request.
type Turn struct {
	TTFTMs          float64 `json:"ttft_ms"`
	PromptTokens    int     `json:"prompt_tokens"`
	EvaluatedTokens int     `json:"evaluated_tokens"`
	PromptEvalMs    float64 `json:"backend_prompt_eval_ms"`
	Answer          string  `json:"-"`
}

// Series is one way of sending the same session.
type Series struct {
	Name   string  `json:"name"`
	Turns  []Turn  `json:"turns"`
	P50    float64 `json:"median_ttft_ms_turns_2_on"`
	Min    float64 `json:"min_ttft_ms_turns_2_on"`
	Max    float64 `json:"max_ttft_ms_turns_2_on"`
	Eval   float64 `json:"median_evaluated_tokens_turns_2_on"`
	EvalMs float64 `json:"median_backend_prompt_eval_ms_turns_2_on"`
}

func (s *Series) summarize() {
	var t, ev, evMs []float64
	for _, x := range s.Turns[1:] {
		t = append(t, x.TTFTMs)
		ev = append(ev, float64(x.EvaluatedTokens))
		evMs = append(evMs, x.PromptEvalMs)
	}
	s.P50, s.Min, s.Max = percentile(t, 0.5), percentile(t, 0), percentile(t, 1)
	s.Eval, s.EvalMs = percentile(ev, 0.5), percentile(evMs, 0.5)
}

// MultiTurn compares ctxd's order with a naive one and with no codex.
type MultiTurn struct {
	Ctxd, Naive, Floor Series
	// ColdMs are ctxd's cold turn 1: the session's own, then the same
	// first turn on fresh sessions after an unrelated prompt took the
	// backend's slot, so the cold side of the ratio has a median too.
	ColdMs        []float64 `json:"ctxd_cold_ttft_ms"`
	ColdP50       float64   `json:"ctxd_cold_median_ttft_ms"`
	ColdOverWarm  float64   `json:"ctxd_cold_over_warm"`
	NaiveOverCtxd float64   `json:"naive_over_ctxd"`
}

var questions = []string{
	"Which function handles request kind %d?", "What does Handler%d return on error?",
	"Where is the handler for kind %d defined?", "Summarize what Handler%d does.",
	"Is there a test for kind %d?",
}

func question(i int) string { return fmt.Sprintf(questions[i%len(questions)], 7*i+3) }

func (e *env) multiTurn(ctx context.Context) (MultiTurn, error) {
	var mt MultiTurn
	mt.Ctxd.Name, mt.Naive.Name, mt.Floor.Name = "ctxd (cache-stable order)", "naive order (time + hardware header, retrieved past turns, codex, history)", "query alone (no codex)"
	codexBody, err := e.codexBody(ctx)
	if err != nil {
		return mt, err
	}
	for i := range e.cfg.Turns {
		sum, ttft, err := e.askCtxd(ctx, "multi-turn", question(i))
		if err != nil {
			return mt, err
		}
		mt.Ctxd.Turns = append(mt.Ctxd.Turns, Turn{TTFTMs: ms(ttft), PromptTokens: sum.PromptTokens,
			EvaluatedTokens: sum.EvaluatedTokens, PromptEvalMs: sum.PromptEvalMs})
		e.cfg.Log("  ctxd turn %d: ttft %.0f ms, %d evaluated of %d", i+1, ms(ttft), sum.EvaluatedTokens, sum.PromptTokens)
	}
	mt.ColdMs = []float64{mt.Ctxd.Turns[0].TTFTMs}
	for r := 1; r < e.cfg.ColdRepeats; r++ {
		sum, ttft, err := e.askCold(ctx, fmt.Sprintf("multi-turn-cold-%d", r), question(0))
		if err != nil {
			return mt, err
		}
		mt.ColdMs = append(mt.ColdMs, ms(ttft))
		e.cfg.Log("  ctxd cold turn 1, again: ttft %.0f ms, backend prompt eval %.0f ms", ms(ttft), sum.PromptEvalMs)
	}
	var history []runcontext.Turn
	for i := range e.cfg.Turns {
		q := question(i)
		t, err := e.askDirect(ctx, naivePrompt(codexBody, history, q))
		if err != nil {
			return mt, err
		}
		mt.Naive.Turns = append(mt.Naive.Turns, t)
		history = append(history, runcontext.Turn{Query: q, Answer: t.Answer})
		e.cfg.Log("  naive turn %d: ttft %.0f ms, %d evaluated of %d", i+1, t.TTFTMs, t.EvaluatedTokens, t.PromptTokens)
	}
	var fh []runcontext.Turn
	for i := range e.cfg.Turns {
		q := question(i)
		t, err := e.askDirect(ctx, floorPrompt(fh, q))
		if err != nil {
			return mt, err
		}
		mt.Floor.Turns = append(mt.Floor.Turns, t)
		fh = append(fh, runcontext.Turn{Query: q, Answer: t.Answer})
	}
	for _, s := range []*Series{&mt.Ctxd, &mt.Naive, &mt.Floor} {
		s.summarize()
	}
	mt.ColdP50 = percentile(mt.ColdMs, 0.5)
	mt.ColdOverWarm = mt.ColdP50 / mt.Ctxd.P50
	mt.NaiveOverCtxd = mt.Naive.P50 / mt.Ctxd.P50
	return mt, nil
}

// codexBody is the codex as the daemon renders it, for the naive prompts.
func (e *env) codexBody(ctx context.Context) (string, error) {
	var st struct {
		Root string `json:"root"`
	}
	if err := e.ctxd.GetJSON(ctx, "/v1/codex", &st); err != nil {
		return "", err
	}
	var sb strings.Builder
	err := filepath.WalkDir(st.Root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(st.Root, p)
		fmt.Fprintf(&sb, "File: %s\n%s\n", rel, b)
		return nil
	})
	return sb.String(), err
}

// naivePrompt is the order many agents use (the Substrate engine's order
// with an environment block on top): a header with the current time and
// raw hardware numbers, past interactions retrieved for this query, the
// codex, the history, the query. The header changes on every request, so
// nothing after it can be reused from the cache.
func naivePrompt(codexBody string, history []runcontext.Turn, q string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Current time: %s\n", time.Now().Format(time.RFC3339Nano))
	if v, err := mem.VirtualMemory(); err == nil {
		fmt.Fprintf(&sb, "Memory: %d bytes free of %d\n", v.Available, v.Total)
	}
	if l, err := load.Avg(); err == nil {
		fmt.Fprintf(&sb, "Load: %.2f %.2f %.2f\n", l.Load1, l.Load5, l.Load15)
	}
	fmt.Fprintf(&sb, "Goroutines: %d\n\nRelevant past interactions:\n", runtime.NumGoroutine())
	for _, t := range retrieve(history, q, 3) {
		fmt.Fprintf(&sb, "- Q: %s A: %s\n", t.Query, t.Answer)
	}
	sb.WriteString("\nCodebase:\n")
	sb.WriteString(codexBody)
	sb.WriteString("\nConversation:\n")
	for _, t := range history {
		fmt.Fprintf(&sb, "USER: %s\nASSISTANT: %s\n", t.Query, t.Answer)
	}
	fmt.Fprintf(&sb, "USER: %s\nASSISTANT:", q)
	return sb.String()
}

// floorPrompt is the query with its conversation and nothing else.
func floorPrompt(history []runcontext.Turn, q string) string {
	var sb strings.Builder
	for _, t := range history {
		fmt.Fprintf(&sb, "USER: %s\nASSISTANT: %s\n", t.Query, t.Answer)
	}
	fmt.Fprintf(&sb, "USER: %s\nASSISTANT:", q)
	return sb.String()
}

// retrieve picks the k past turns sharing the most words with q.
func retrieve(history []runcontext.Turn, q string, k int) []runcontext.Turn {
	words := map[string]bool{}
	for _, w := range strings.Fields(strings.ToLower(q)) {
		words[w] = true
	}
	type scored struct {
		t runcontext.Turn
		n int
		i int
	}
	var s []scored
	for i, t := range history {
		n := 0
		for _, w := range strings.Fields(strings.ToLower(t.Query)) {
			if words[w] {
				n++
			}
		}
		s = append(s, scored{t, n, i})
	}
	sort.SliceStable(s, func(a, b int) bool { return s[a].n > s[b].n })
	var out []runcontext.Turn
	for _, x := range s[:min(k, len(s))] {
		out = append(out, x.t)
	}
	return out
}

// Overhead is what ctxd adds between an agent and the backend.
type Overhead struct {
	Requests int `json:"requests"`
	// Paired: the same prompt through ctxd and straight to Ollama, one after
	// the other, each finding the same prompt in the backend's slot.
	P50Ms        float64   `json:"p50_ms"` // of Samples
	P95Ms        float64   `json:"p95_ms"`
	Samples      []float64 `json:"samples_ms"` // ctxd TTFT minus direct TTFT, pair by pair
	CtxdTTFTMs   []float64 `json:"ctxd_ttft_ms"`
	DirectTTFTMs []float64 `json:"direct_ttft_ms"`
	CtxdEvalMs   float64   `json:"ctxd_median_backend_prompt_eval_ms"`
	DirectEvalMs float64   `json:"direct_median_backend_prompt_eval_ms"`
	PromptTokens int       `json:"prompt_tokens"`
	OwnP50Ms     float64   `json:"own_p50_ms"` // of OwnSamples
	OwnP95Ms     float64   `json:"own_p95_ms"`
	OwnSamples   []float64 `json:"own_samples_ms"` // ctxd TTFT minus ctxd's own measurement of the backend's
}

// overhead sends one prompt through ctxd and then, byte for byte the same
// (read back from GET /v1/sessions/{id}/prompt), straight to Ollama, in
// pairs. Each ctxd request opens a new session with the same question, so
// ctxd renders the same prompt every time and both sides find it in the
// backend's slot: the backend does the same work for both, and the
// difference in time to first token is what ctxd adds. The first pair
// warms the slot and is not counted. A second view of the same requests:
// the client's time to first token minus ctxd's own measurement of the
// backend's.
func (e *env) overhead(ctx context.Context) (Overhead, error) {
	o := Overhead{Requests: e.cfg.Overhead}
	q := question(0)
	var ctxdEval, directEval []float64
	for i := range e.cfg.Overhead + 1 {
		session := fmt.Sprintf("overhead-%d", i)
		sum, tc, err := e.askCtxd(ctx, session, q)
		if err != nil {
			return o, err
		}
		var lp ctxd.LastPrompt
		if err := e.ctxd.GetJSON(ctx, "/v1/sessions/"+session+"/prompt", &lp); err != nil {
			return o, err
		}
		direct, err := e.askDirect(ctx, lp.Prompt)
		if err != nil {
			return o, err
		}
		if i == 0 {
			continue // the first pair moves the slot to this prompt
		}
		o.PromptTokens = direct.PromptTokens
		o.CtxdTTFTMs, o.DirectTTFTMs = append(o.CtxdTTFTMs, ms(tc)), append(o.DirectTTFTMs, direct.TTFTMs)
		o.Samples = append(o.Samples, ms(tc)-direct.TTFTMs)
		o.OwnSamples = append(o.OwnSamples, ms(tc)-sum.Timing.BackendTTFTMs) // ttft_ms counts from the request's arrival
		ctxdEval, directEval = append(ctxdEval, sum.PromptEvalMs), append(directEval, direct.PromptEvalMs)
	}
	o.P50Ms, o.P95Ms = percentile(o.Samples, 0.5), percentile(o.Samples, 0.95)
	o.OwnP50Ms, o.OwnP95Ms = percentile(o.OwnSamples, 0.5), percentile(o.OwnSamples, 0.95)
	o.CtxdEvalMs, o.DirectEvalMs = percentile(ctxdEval, 0.5), percentile(directEval, 0.5)
	return o, nil
}

// Compose is the latency of building and rendering a RunContext.
type Compose struct {
	CodexTokens int     `json:"codex_tokens_approx"`
	Turns       int     `json:"turns"`
	Karma       int     `json:"karma_entries"`
	Runs        int     `json:"runs"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
}

func composeLatency() Compose {
	c := Compose{CodexTokens: 100_000, Turns: 50, Karma: 10, Runs: 2000}
	codex, turns, karma := ComposeInputs(c.CodexTokens)
	var xs []float64
	for i := range c.Runs {
		start := time.Now()
		if _, err := ComposeOnce(codex, turns, karma, question(i)); err != nil {
			panic(err) // static, valid inputs
		}
		xs = append(xs, ms(time.Since(start)))
	}
	c.P50Ms, c.P99Ms = percentile(xs, 0.5), percentile(xs, 0.99)
	return c
}

// Scale is one codex size.
type Scale struct {
	TargetPct    int       `json:"target_pct_of_prompt_budget"`
	StableTokens int       `json:"stable_tokens"`
	Pct          float64   `json:"pct_of_prompt_budget"`
	Mode         string    `json:"mode"`
	ColdTTFTMs   float64   `json:"cold_ttft_ms"` // median of ColdMs
	WarmTTFTMs   float64   `json:"warm_ttft_ms"` // median of WarmMs
	ColdMs       []float64 `json:"cold_ttft_ms_samples"`
	WarmMs       []float64 `json:"warm_ttft_ms_samples"`
	PromptTokens int       `json:"prompt_tokens_turn_1"`
}

func (e *env) scaling(ctx context.Context) ([]Scale, error) {
	budget := e.cfg.NumCtx - e.cfg.AnswerToks
	var out []Scale
	for _, pct := range e.cfg.ScalingPcts {
		// Aim the codex so the stable blocks with it fill pct of the prompt
		// budget: write, load, measure, correct by what the fences and the
		// other blocks add, at most three times.
		target := pct * budget / 100
		want := target
		var st *ctxd.CodexStats
		for try := range 3 {
			dir := filepath.Join(e.work, fmt.Sprintf("codex-%d-%d", pct, try))
			if err := writeCodex(e.tok, dir, want); err != nil {
				return nil, err
			}
			var err error
			if st, err = e.ctxd.LoadCodex(ctx, dir, nil); err != nil {
				return nil, err
			}
			got := st.Plan.StableTokens
			if st.Plan.StableTokens < 0 { // over the budget: RAG without a whole count
				got = int(st.Tokens)
			}
			if diff := got - target; diff <= budget/100 && diff >= -budget/100 {
				break
			} else {
				want = max(want-diff, 50) // the other blocks alone may be most of a small target
			}
		}
		s := Scale{TargetPct: pct, Mode: st.Plan.Mode, StableTokens: st.Plan.StableTokens}
		s.Pct = 100 * float64(s.StableTokens) / float64(budget)
		// Cold: the first turn of fresh sessions after an unrelated prompt
		// took the backend's slot; warm: the next turns of the first one,
		// asked before the other cold samples move the slot.
		var cold, warm []float64
		repeats := max(1, e.cfg.ColdRepeats)
		for r := range repeats {
			session := fmt.Sprintf("scale-%d-%d", pct, r)
			sum, t, err := e.askCold(ctx, session, question(pct))
			if err != nil {
				return nil, err
			}
			cold, s.PromptTokens = append(cold, ms(t)), sum.PromptTokens
			if r == 0 {
				if warm, err = e.warmTurns(ctx, session, pct+1, repeats); err != nil {
					return nil, err
				}
			}
		}
		s.ColdMs, s.WarmMs = cold, warm
		s.ColdTTFTMs, s.WarmTTFTMs = percentile(cold, 0.5), percentile(warm, 0.5)
		e.cfg.Log("  %d%%: mode %s, stable %d tokens, cold %.0f ms, warm %.0f ms", pct, s.Mode, s.StableTokens, s.ColdTTFTMs, s.WarmTTFTMs)
		out = append(out, s)
	}
	return out, nil
}

// warmTurns asks questions first, first+1, ... (n of them) in session and
// returns their times to first token.
func (e *env) warmTurns(ctx context.Context, session string, first, n int) ([]float64, error) {
	var out []float64
	for i := range n {
		_, t, err := e.askCtxd(ctx, session, question(first+i))
		if err != nil {
			return nil, err
		}
		out = append(out, ms(t))
	}
	return out, nil
}

// writeCodex writes Go-like files into dir until they hold about tokens
// tokens for tok.
func writeCodex(tok *llamatok.Tokenizer, dir string, tokens int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	total := 0
	for f := 0; total < tokens; f++ {
		var sb strings.Builder
		fmt.Fprintf(&sb, "package handlers\n\n")
		for i := range 8 {
			n := f*8 + i
			fmt.Fprintf(&sb, "// Handler%d serves request kind %d and returns an error.\nfunc Handler%d(w io.Writer, n int) error {\n\treturn fmt.Errorf(\"kind %%d\", n+%d)\n}\n\n", n, n, n, n)
		}
		text := sb.String()
		n, err := tok.CountText(text)
		if err != nil {
			return err
		}
		if total+n > tokens {
			// Trim the last file to land near the target.
			lines := strings.SplitAfter(text, "\n")
			for len(lines) > 3 && total+n > tokens {
				lines = lines[:len(lines)-1]
				text = strings.Join(lines, "")
				if n, err = tok.CountText(text); err != nil {
					return err
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("h%03d.go", f)), []byte(text), 0o644); err != nil {
			return err
		}
		total += n
	}
	return nil
}
