package bench

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/ctxd/ctxd"
)

// RAGRun is the RAG working-set phase: follow-up questions about one
// package of a tree many times the window, on the demo model, next to a
// CAG session over a codex as large as the working set's block.
type RAGRun struct {
	Tree         string    `json:"tree"`
	Package      string    `json:"package"`
	Files        int       `json:"files"`
	Bytes        int64     `json:"bytes"`
	Tokens       int64     `json:"tokens"` // exact, counted in the background
	NumCtx       int       `json:"num_ctx"`
	TopK         int       `json:"top_k"`
	AnswerTokens int       `json:"answer_tokens"`
	Turns        []RAGTurn `json:"turns"`
	EvalP50      float64   `json:"evaluated_p50_turns_2_on"`
	WarmP50      float64   `json:"ttft_p50_ms_turns_2_on"`
	ColdMs       float64   `json:"ttft_ms_turn_1"`
	PackageShare float64   `json:"package_share"` // of the top-k excerpts of all turns
	Moves        int       `json:"working_set_moves"`
	ExactTurns   int       `json:"exact_count_turns"` // turns (RAG and CAG) whose prompt_tokens equal the backend's prompt_eval_count
	CountedTurns int       `json:"counted_turns"`
	CAGStable    int       `json:"cag_stable_tokens"`
	CAGColdMs    float64   `json:"cag_ttft_ms_turn_1"`
	CAGWarmMs    []float64 `json:"cag_warm_ttft_ms"`
	CAGWarmP50   float64   `json:"cag_warm_ttft_p50_ms"`
	WarmOverCAG  float64   `json:"rag_warm_over_cag_warm"`
	Model        string    `json:"model"`
}

// RAGTurn is one question of the RAG session.
type RAGTurn struct {
	Query       string   `json:"query"`
	Prompt      int      `json:"prompt_tokens"`
	Evaluated   int      `json:"evaluated_tokens"`
	TTFTMs      float64  `json:"ttft_ms"`
	Hits        int      `json:"working_set_hits"`
	New         int      `json:"excerpts_new"`
	Present     int      `json:"excerpts_present"`
	NewTokens   int      `json:"excerpt_tokens_new"`
	Moved       string   `json:"moved,omitempty"`
	BackendN    int      `json:"backend_prompt_eval_count"` // Ollama counts every prompt token: equal to Prompt when ctxd's count is exact
	TopK        []string `json:"top_k_paths"`
	FromPackage int      `json:"from_package"`
	Governor    []string `json:"governor,omitempty"`
}

// exact counts a turn whose prompt tokens the backend reported, and
// whether ctxd's count equals its.
func (r *RAGRun) exact(sum *ctxd.Summary) {
	if sum.BackendPromptN > 0 {
		r.CountedTurns++
		if sum.BackendPromptN == sum.PromptTokens {
			r.ExactTurns++
		}
	}
}

// ragQuestions are about encoding/csv, asked of all of encoding/.
var ragQuestions = []string{
	"How does the csv Reader read one record with ReadRecord?",
	"What does LazyQuotes change when the csv reader meets a bare quote?",
	"How is FieldsPerRecord checked and when is ErrFieldCount returned?",
	"What does the Comma field of the csv Reader mean and which values are invalid?",
	"How are comment lines skipped by the csv Reader?",
	"What does TrimLeadingSpace do to a csv field?",
	"How does ReuseRecord let the csv Reader reuse the slice of a record?",
	"What does a csv ParseError report about the line and column?",
	"How does the csv Reader handle quoted fields that span several lines?",
	"What does FieldPos return for a csv field?",
	"What does InputOffset tell about the csv reader position?",
	"How does the csv Writer decide that a field needs quotes?",
	"What does UseCRLF change in the csv Writer?",
	"How do Flush and Error work on the csv Writer?",
	"What does WriteAll of the csv Writer do after the records?",
	"How does the csv Writer escape a quote inside a field?",
	"Which errors does the csv package define, ErrQuote and ErrBareQuote?",
	"How does readLine of the csv Reader treat a final line without newline?",
	"How does the csv Reader normalize \\r\\n line endings?",
	"How would ReadAll of the csv Reader stop at the end of the input?",
}

// ragPhase runs the RAG session and its CAG comparison on the agents'
// model (the demo model of make run) with its own window.
func ragPhase(ctx context.Context, cfg Config) (RAGRun, error) {
	numCtx := cfg.AgentModel.ContextLength
	run := RAGRun{Tree: cfg.RAGTree, Package: cfg.RAGPackage, NumCtx: numCtx, TopK: cfg.RAGTopK, AnswerTokens: cfg.AnswerToks, Model: cfg.AgentModel.Name}
	st, stats, tokens, err := ragStack(ctx, cfg, cfg.AnswerToks)
	if err != nil {
		return run, err
	}
	defer st.stop()
	run.Files, run.Bytes, run.Tokens = stats.Files, stats.Bytes, tokens
	cfg.Log("rag: %s, %d files, %d tokens (%.0f× the window); %d questions about %s", cfg.RAGTree, run.Files, run.Tokens, float64(run.Tokens)/float64(numCtx), len(ragQuestions), cfg.RAGPackage)
	var evals, warm []float64
	total, fromPkg := 0, 0
	for i, q := range ragQuestions {
		var search struct {
			Excerpts []ctxd.Excerpt `json:"excerpts"`
		}
		if err := st.ctxd.GetJSON(ctx, "/v1/codex/search?sigil=bench-search&k="+fmt.Sprint(cfg.RAGTopK)+"&q="+url.QueryEscape(q), &search); err != nil {
			return run, err
		}
		found := search.Excerpts
		sum, t, err := ask(ctx, st.ctxd, "rag", q)
		if err != nil {
			return run, fmt.Errorf("turn %d: %w", i+1, err)
		}
		turn := RAGTurn{Query: q, Prompt: sum.PromptTokens, Evaluated: sum.EvaluatedTokens, TTFTMs: ms(t), BackendN: sum.BackendPromptN}
		run.exact(sum)
		if ws := sum.WorkingSet; ws != nil {
			turn.Hits, turn.New, turn.Present, turn.NewTokens, turn.Moved = ws.Hits, ws.ExcerptsNew, ws.ExcerptsPresent, ws.ExcerptTokensNew, ws.Moved
			if ws.Moved != "" {
				run.Moves++
			}
		}
		for _, a := range sum.Governor {
			turn.Governor = append(turn.Governor, a.Kind+": "+a.Reason)
		}
		for _, e := range found {
			turn.TopK = append(turn.TopK, e.Path)
			if strings.HasPrefix(e.Path, cfg.RAGPackage+"/") {
				turn.FromPackage++
			}
		}
		total += len(found)
		fromPkg += turn.FromPackage
		if i == 0 {
			run.ColdMs = turn.TTFTMs
		} else {
			evals = append(evals, float64(turn.Evaluated))
			warm = append(warm, turn.TTFTMs)
		}
		cfg.Log("  rag turn %d: %d evaluated of %d, ttft %.0f ms, working set hits %d, new %d (%d tokens)%s", i+1, turn.Evaluated, turn.Prompt, turn.TTFTMs, turn.Hits, turn.New, turn.NewTokens, map[bool]string{true: ", moved: " + turn.Moved}[turn.Moved != ""])
		run.Turns = append(run.Turns, turn)
	}
	run.EvalP50, run.WarmP50 = percentile(evals, 0.5), percentile(warm, 0.5)
	if total > 0 {
		run.PackageShare = float64(fromPkg) / float64(total)
	}
	// CAG over a codex just under the threshold the working set fills.
	dir := filepath.Join(st.work, "codex-cag")
	if err := writeCodex(st.tok, dir, max(1000, stats.Plan.Threshold-1000)); err != nil {
		return run, err
	}
	cst, err := st.ctxd.LoadCodex(ctx, dir, nil)
	if err != nil {
		return run, err
	}
	if cst.Plan.Mode != "cag" {
		return run, fmt.Errorf("the CAG comparison codex loads in %s mode", cst.Plan.Mode)
	}
	run.CAGStable = cst.Plan.StableTokens
	sum, t, err := ask(ctx, st.ctxd, "cag", question(0))
	if err != nil {
		return run, err
	}
	run.exact(sum)
	run.CAGColdMs = ms(t)
	for i := range 6 {
		sum, t, err := ask(ctx, st.ctxd, "cag", question(i+1))
		if err != nil {
			return run, err
		}
		run.exact(sum)
		run.CAGWarmMs = append(run.CAGWarmMs, ms(t))
	}
	run.CAGWarmP50 = percentile(run.CAGWarmMs, 0.5)
	if run.CAGWarmP50 > 0 {
		run.WarmOverCAG = run.WarmP50 / run.CAGWarmP50
	}
	cfg.Log("rag: median evaluated %.0f, warm ttft %.0f ms; cag warm %.0f ms (%.1f×); %.0f%% of excerpts from %s; %d moves",
		run.EvalP50, run.WarmP50, run.CAGWarmP50, run.WarmOverCAG, 100*run.PackageShare, cfg.RAGPackage, run.Moves)
	return run, nil
}
