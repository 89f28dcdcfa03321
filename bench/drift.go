package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
)

// DriftRun is one drifting RAG session: questions that wander across a
// tree many times the window, on the demo model, asked in one session of
// a fresh daemon (the working set is the codex's, shared by sessions:
// each set starts from none).
type DriftRun struct {
	Set          string      `json:"set"`
	About        string      `json:"about"`
	Tree         string      `json:"tree"`
	Files        int         `json:"files"`
	Tokens       int64       `json:"tokens"`
	NumCtx       int         `json:"num_ctx"`
	TopK         int         `json:"top_k"`
	AnswerTokens int         `json:"answer_tokens"`
	Model        string      `json:"model"`
	Turns        []DriftTurn `json:"turns"`
	EvalP50      float64     `json:"evaluated_p50_turns_2_on"`
	EvalP90      float64     `json:"evaluated_p90_turns_2_on"`
	WarmP50      float64     `json:"ttft_p50_ms_turns_2_on"`
	// NewP50 is the median of the follow-ups' new excerpt tokens (the
	// retrieved text the prompt did not hold yet: what any placement must
	// evaluate), and RestP50 the median of what they evaluated beyond it.
	NewP50   float64 `json:"excerpt_tokens_new_p50"`
	RestP50  float64 `json:"evaluated_beyond_new_p50"`
	ColdMs   float64 `json:"ttft_ms_turn_1"`
	Growths  int     `json:"growths"`
	Drops    int     `json:"drops"`
	Rewrites int     `json:"history_rewrites"` // follow-ups whose prefix broke in the conversation (state)
	Epochs   int     `json:"epochs"`           // follow-ups whose history's excerpts the governor left out
	// OverQuarter counts the follow-ups that evaluated, beyond their new
	// excerpts (text no earlier prompt held), more than a quarter of the
	// working set's stable blocks (the codex block with the blocks around
	// it), and Forced those of them whose report names the budget that
	// forced it (the governor's action).
	OverQuarter int `json:"over_quarter"`
	Forced      int `json:"over_quarter_forced"`
}

// DriftTurn is one question of a drifting session.
type DriftTurn struct {
	Area      string   `json:"area"`
	Query     string   `json:"query"`
	Prompt    int      `json:"prompt_tokens"`
	Evaluated int      `json:"evaluated_tokens"`
	TTFTMs    float64  `json:"ttft_ms"`
	Block     int      `json:"working_set_tokens"` // the stable blocks with the working set
	Hits      int      `json:"working_set_hits"`
	New       int      `json:"excerpts_new"`
	NewTokens int      `json:"excerpt_tokens_new"`
	Added     int      `json:"added,omitempty"`
	Dropped   int      `json:"dropped,omitempty"`
	Moved     string   `json:"moved,omitempty"`
	Break     string   `json:"prefix_break,omitempty"`
	Governor  []string `json:"governor,omitempty"`
}

// driftQuestion is a question and the part of the tree it is about.
type driftQuestion struct{ area, q string }

// driftSets are the drifting question sets: one package's parts in turn,
// and the tree's packages in turn, the subject changing every two or
// three questions.
var driftSets = []struct {
	name, about string
	questions   []driftQuestion
}{
	{"json", "the parts of `encoding/json` in turn", []driftQuestion{
		{"encode", "How does json.Marshal encode a struct and its field tags?"},
		{"encode", "What does the omitempty option of a json field tag do?"},
		{"encode", "How does the json encoder handle a map with non-string keys?"},
		{"decode", "How does json.Unmarshal decode an object into a struct?"},
		{"decode", "What does an UnmarshalTypeError report?"},
		{"decode", "How does Unmarshal decode a JSON number into an interface value?"},
		{"stream", "How does a json.Decoder read a stream of values with Decode and More?"},
		{"stream", "What does Decoder.Token return for delimiters?"},
		{"stream", "What does DisallowUnknownFields change in the Decoder?"},
		{"indent", "How does json.Indent add indentation to a JSON text?"},
		{"indent", "What does json.Compact remove?"},
		{"indent", "How does HTMLEscape escape characters in JSON?"},
		{"scanner", "How does the json scanner check that a text is valid JSON?"},
		{"scanner", "What does a json SyntaxError hold, and its Offset?"},
		{"scanner", "What does json.Valid return for a truncated text?"},
		{"tags", "How are json struct tag options parsed by tagOptions?"},
		{"tags", "How does the json package fold field names for case-insensitive matching?"},
		{"raw", "What is json.RawMessage for and how is it marshaled?"},
		{"raw", "What does json.Number hold and how do Int64 and Float64 work?"},
		{"raw", "How does the Marshaler interface let a type encode itself?"},
	}},
	{"encoding", "the packages of `encoding/` in turn", []driftQuestion{
		{"xml", "How does xml.Unmarshal map elements to struct fields?"},
		{"xml", "What does the xml Decoder's Token method return?"},
		{"xml", "How are xml attributes marshaled with the attr tag option?"},
		{"gob", "How does a gob Encoder send type information before values?"},
		{"gob", "What does gob.Register do for interface values?"},
		{"gob", "How does the gob Decoder decode into a struct with fewer fields?"},
		{"base64", "What is the difference between StdEncoding and URLEncoding in base64?"},
		{"base64", "How does base64 NewEncoder buffer partial blocks until Close?"},
		{"base64", "What does base64 RawStdEncoding leave out?"},
		{"binary", "How does binary.Write encode a struct in a byte order?"},
		{"binary", "How do binary.PutUvarint and Uvarint encode integers?"},
		{"binary", "What does binary.Size return for a value?"},
		{"hex", "What does hex.Dump print for a byte slice?"},
		{"hex", "What error does hex.DecodeString return for an odd length?"},
		{"pem", "How does pem.Decode find a PEM block and its headers?"},
		{"pem", "How does pem.Encode write the base64 body lines?"},
		{"asn1", "How does asn1.Unmarshal parse a SEQUENCE into a struct?"},
		{"asn1", "What do the asn1 struct tags optional and explicit mean?"},
		{"base32", "What alphabet does base32 HexEncoding use?"},
		{"base32", "How does base32 padding work with NoPadding?"},
	}},
}

// driftPhase runs each drifting question set in one session of a fresh
// daemon over RAGTree, on the agents' model with its own window.
func driftPhase(ctx context.Context, cfg Config) ([]DriftRun, error) {
	var runs []DriftRun
	for _, set := range driftSets {
		run, err := driftSession(ctx, cfg, set.name, set.about, set.questions)
		if err != nil {
			return runs, fmt.Errorf("set %s: %w", set.name, err)
		}
		runs = append(runs, run)
	}
	return runs, nil
}

func driftSession(ctx context.Context, cfg Config, name, about string, questions []driftQuestion) (DriftRun, error) {
	numCtx := cfg.AgentModel.ContextLength
	run := DriftRun{Set: name, About: about, Tree: cfg.RAGTree, NumCtx: numCtx, TopK: cfg.RAGTopK, AnswerTokens: cfg.DriftAnswerToks, Model: cfg.AgentModel.Name}
	st, stats, tokens, err := ragStack(ctx, cfg, cfg.DriftAnswerToks)
	if err != nil {
		return run, err
	}
	defer st.stop()
	run.Files, run.Tokens = stats.Files, tokens
	cfg.Log("drift %s: %s, %d files, %d tokens; %d questions about %s", name, cfg.RAGTree, run.Files, run.Tokens, len(questions), about)
	var evals, warm, news, rest []float64
	for i, dq := range questions {
		sum, t, err := ask(ctx, st.ctxd, "drift-"+name, dq.q)
		if err != nil {
			return run, fmt.Errorf("turn %d: %w", i+1, err)
		}
		turn := DriftTurn{Area: dq.area, Query: dq.q, Prompt: sum.PromptTokens, Evaluated: sum.EvaluatedTokens, TTFTMs: ms(t)}
		if ws := sum.WorkingSet; ws != nil {
			turn.Block, turn.Hits, turn.New, turn.NewTokens = ws.Tokens, ws.Hits, ws.ExcerptsNew, ws.ExcerptTokensNew
			turn.Added, turn.Dropped, turn.Moved = ws.Added, ws.Dropped, ws.Moved
		}
		if b := sum.PrefixBreak; b != nil {
			turn.Break = b.Block + ": " + b.Reason
		}
		for _, a := range sum.Governor {
			turn.Governor = append(turn.Governor, a.Kind+": "+a.Reason)
		}
		if i == 0 {
			run.ColdMs = turn.TTFTMs
		} else {
			evals = append(evals, float64(turn.Evaluated))
			news, rest = append(news, float64(turn.NewTokens)), append(rest, float64(max(0, turn.Evaluated-turn.NewTokens)))
			warm = append(warm, turn.TTFTMs)
			run.tally(turn)
		}
		cfg.Log("  drift %s turn %d (%s): %d evaluated of %d, ttft %.0f ms, hits %d, new %d; added %d, dropped %d; break %q",
			name, i+1, dq.area, turn.Evaluated, turn.Prompt, turn.TTFTMs, turn.Hits, turn.New, turn.Added, turn.Dropped, turn.Break)
		run.Turns = append(run.Turns, turn)
	}
	run.EvalP50, run.EvalP90, run.WarmP50 = percentile(evals, 0.5), percentile(evals, 0.9), percentile(warm, 0.5)
	run.NewP50, run.RestP50 = percentile(news, 0.5), percentile(rest, 0.5)
	cfg.Log("drift %s: median evaluated %.0f (p90 %.0f), warm ttft %.0f ms; %d growths, %d drops, %d epochs, %d history rewrites; %d follow-ups over a quarter of the block (%d forced)",
		name, run.EvalP50, run.EvalP90, run.WarmP50, run.Growths, run.Drops, run.Epochs, run.Rewrites, run.OverQuarter, run.Forced)
	return run, nil
}

// tally counts a follow-up's moves, rewrites and size.
func (r *DriftRun) tally(t DriftTurn) {
	if t.Added > 0 {
		r.Growths++
	}
	if t.Dropped > 0 {
		r.Drops++
	}
	if strings.HasPrefix(t.Break, "state:") {
		r.Rewrites++
	}
	for _, a := range t.Governor {
		if strings.HasPrefix(a, ctxd.ActionStale+":") {
			r.Epochs++
			break
		}
	}
	if t.Block > 0 && 4*max(0, t.Evaluated-t.NewTokens) > t.Block {
		r.OverQuarter++
		if len(t.Governor) > 0 {
			r.Forced++
		}
	}
}

// ragStack starts a daemon on the agents' model with its own window,
// top-k RAGTopK and answers of answerToks, and loads RAGTree (loadRAGTree).
// The caller stops it.
func ragStack(ctx context.Context, cfg Config, answerToks int) (*stack, *ctxd.CodexStats, int64, error) {
	st, err := startStackWith(ctx, cfg, cfg.AgentModel, cfg.AgentModelPath, cfg.AgentModel.ContextLength, 1, func(dc *config.Config) {
		dc.Codex.TopK = cfg.RAGTopK
		dc.Limits.AnswerReserve = answerToks
	})
	if err != nil {
		return nil, nil, 0, err
	}
	stats, tokens, err := loadRAGTree(ctx, st, cfg.RAGTree)
	if err != nil {
		st.stop()
		return nil, nil, 0, err
	}
	return st, stats, tokens, nil
}

// loadRAGTree loads tree as the codex, which must be too large to load
// whole, and waits (up to two minutes) for its exact token count.
func loadRAGTree(ctx context.Context, st *stack, tree string) (*ctxd.CodexStats, int64, error) {
	stats, err := st.ctxd.LoadCodex(ctx, tree, nil)
	if err != nil {
		return stats, 0, err
	}
	if stats.Plan.Mode != "rag" {
		return stats, 0, fmt.Errorf("the tree %s loads in %s mode, not rag", tree, stats.Plan.Mode)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var cur ctxd.CodexStats
		if err := st.ctxd.GetJSON(ctx, "/v1/codex", &cur); err != nil {
			return stats, 0, err
		}
		if cur.TokensExact || time.Now().After(deadline) {
			return stats, cur.Tokens, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// DriftBaseline is the drifting sessions as an earlier daemon answered
// them, measured beside this run's (one after the other, on one machine).
type DriftBaseline struct {
	Label string     `json:"label"`
	Runs  []DriftRun `json:"runs"`
}

// driftMarkdown writes the drifting sessions' section.
func (r *Report) driftMarkdown(b *strings.Builder) {
	if len(r.Drift) == 0 {
		return
	}
	g := r.Drift[0]
	fmt.Fprintf(b, "### RAG sessions that drift across the tree (issue 28)\n\nMeasured %s. Tree: `%s` (%d files, %s tokens: %.0f× the %d-token window), on Ollama with %s, top-%d excerpts, %d-token answers; each set in one session of a fresh daemon. The working set is chosen at the first question, filling its room (the CAG budget less the map), and then stays: a question's excerpts from outside it join the query and the history. It grows only at an epoch, when the governor leaves the history's excerpts out to make a request fit (the conversation is evaluated again then anyway): it keeps the question's and the history's excerpts, newest first, at its end, first dropping pieces from its end as few as make room (only when the blocks between the codex and the conversation are smaller than what it keeps, as they are here: no client tools). So an epoch re-evaluates the new pieces and what follows the codex block, never the block before them. Per turn: time to first token, tokens evaluated of the prompt, the stable blocks with the working set, the working set's hits among the top-%d, excerpts added to the query (their tokens), pieces added and dropped, where the prefix broke (and the governor's actions).\n\n",
		r.ranAt(PhaseDrift), g.Tree, g.Files, thousands(int(g.Tokens)), float64(g.Tokens)/float64(g.NumCtx), g.NumCtx, g.Model, g.TopK, g.AnswerTokens, g.TopK)
	for _, run := range r.Drift {
		fmt.Fprintf(b, "**%s** — %s:\n\n", run.Set, run.About)
		b.WriteString("| turn | about | TTFT ms | evaluated / prompt | working set | hits | new excerpts (tokens) | added / dropped | prefix broke at |\n|---|---|---|---|---|---|---|---|---|\n")
		for i, t := range run.Turns {
			brk := t.Break
			if len(t.Governor) > 0 {
				brk = strings.TrimSpace(brk + " (" + strings.Join(t.Governor, "; ") + ")")
			}
			fmt.Fprintf(b, "| %d | %s | %.0f | %d / %d | %d | %d | %d (%d) | %d / %d | %s |\n", i+1, t.Area, t.TTFTMs, t.Evaluated, t.Prompt, t.Block, t.Hits, t.New, t.NewTokens, t.Added, t.Dropped, brk)
		}
		fmt.Fprintf(b, "\nTurns 2–%d: median **%.0f tokens evaluated** (90th percentile %.0f; target: median ≤ 400), median time to first token %.0f ms; turn 1 (cold) %.0f ms. Of a follow-up's evaluated tokens, the new excerpts (retrieved text the prompt did not hold yet, which any placement must evaluate) were a median of %.0f, the rest a median of %.0f. The working set grew on %d turns and dropped pieces on %d; the governor left the history's excerpts out (an epoch) on %d, and the conversation was otherwise rewritten (a prefix break in the state block) on %d. %d follow-ups evaluated, beyond their new excerpts, more than a quarter of the working set's stable blocks; %d of them name the budget that forced it.\n\n",
			len(run.Turns), run.EvalP50, run.EvalP90, run.WarmP50, run.ColdMs, run.NewP50, run.RestP50, run.Growths, run.Drops, run.Epochs, run.Rewrites, run.OverQuarter, run.Forced)
	}
	if base := r.DriftBaseline; base != nil && len(base.Runs) > 0 {
		fmt.Fprintf(b, "The same sets on %s, measured beside these (one after the other, same machine and settings), turns 2–20:\n\n", base.Label)
		b.WriteString("| set | daemon | median evaluated | 90th percentile | median new excerpt tokens | median TTFT ms | over a quarter of the block, beyond new excerpts (forced) |\n|---|---|---|---|---|---|---|\n")
		for _, run := range r.Drift {
			for _, old := range base.Runs {
				if old.Set != run.Set {
					continue
				}
				fmt.Fprintf(b, "| %s | %s | %.0f | %.0f | %.0f | %.0f | %d (%d) |\n", run.Set, base.Label, old.EvalP50, old.EvalP90, old.NewP50, old.WarmP50, old.OverQuarter, old.Forced)
				fmt.Fprintf(b, "| %s | this one | %.0f | %.0f | %.0f | %.0f | %d (%d) |\n", run.Set, run.EvalP50, run.EvalP90, run.NewP50, run.WarmP50, run.OverQuarter, run.Forced)
			}
		}
		b.WriteString("\n")
	}
}
