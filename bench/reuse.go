package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/runcontext"
)

// The chunk-reuse phase: what backend.cache_reuse costs in answers.
//
// With it, an edit moves the changed file to the end of the codex and
// llama-server shifts the cached files that followed it instead of
// evaluating them again; their keys and values were computed with the old
// file in view before them, and at other positions. The phase asks the
// answer-quality questions (testdata/quality) of the trained model on a
// daemon with cache_reuse on: for each codex, it edits each of its first
// ReuseEdits files in turn (the edits that shift the most), and asks every
// question whose answer is not in the edited file twice on the same
// prompt: once on the shifted cache (the slot held the codex before the
// edit) and once evaluated fresh (the slot erased first). Same prompt,
// temperature 0: an answer that differs differs because of the shift.

// ReuseEdits is how many files of each codex the phase edits, in turn.
const ReuseEdits = 3

// ReuseRun is the phase's result.
type ReuseRun struct {
	Model   string      `json:"model"`
	Backend string      `json:"backend"`
	Chunk   int         `json:"cache_reuse"`
	NumCtx  int         `json:"num_ctx"`
	Edits   []ReuseEdit `json:"edits"`
	// Over every edit: answers right on the shifted cache and fresh, the
	// questions asked each way, and the answers that differ.
	ShiftedCorrect int `json:"shifted_correct"`
	FreshCorrect   int `json:"fresh_correct"`
	Asked          int `json:"asked"`
	Differ         int `json:"differ"`
	// Only one way right: on the shifted cache, or fresh.
	OnlyShifted int `json:"only_shifted"`
	OnlyFresh   int `json:"only_fresh"`
}

// ReuseEdit is one edited file of one codex.
type ReuseEdit struct {
	Codex       string `json:"codex"`
	File        string `json:"file"`
	Position    int    `json:"position"` // its index in the codex's order before the edit
	Files       int    `json:"files"`    // the codex's files
	CodexTokens int    `json:"codex_tokens"`
	// The first question after the edit on the shifted cache: the tokens
	// llama-server evaluated and reused; fresh: evaluated.
	ShiftedEvaluated int      `json:"shifted_evaluated"`
	ShiftedReused    int      `json:"shifted_reused"`
	FreshEvaluated   int      `json:"fresh_evaluated"`
	ShiftedTTFTMs    float64  `json:"shifted_ttft_ms"`
	FreshTTFTMs      float64  `json:"fresh_ttft_ms"`
	Asked            int      `json:"asked"`
	ShiftedCorrect   int      `json:"shifted_correct"`
	FreshCorrect     int      `json:"fresh_correct"`
	Differ           []string `json:"differ"` // the questions whose answers differ
	OnlyShifted      int      `json:"only_shifted"`
	OnlyFresh        int      `json:"only_fresh"`
}

// reusePhase runs the phase on the first quality model, on llama-server.
func reusePhase(ctx context.Context, cfg Config) (ReuseRun, error) {
	m := cfg.QualityModels[0]
	run := ReuseRun{Model: m.Name, Backend: "llama-server", Chunk: cfg.CacheReuse, NumCtx: m.NumCtx}
	if run.Chunk <= 0 {
		run.Chunk = DefaultReuseChunk
	}
	sets, err := LoadQualitySets(cfg.QualityDir)
	if err != nil {
		return run, err
	}
	path, err := filepath.Abs(m.Path)
	if err != nil {
		return run, err
	}
	if _, err := os.Stat(path); err != nil {
		return run, fmt.Errorf("the model %s: %w (make models fetches it)", m.Name, err)
	}
	work, err := os.MkdirTemp("", "ctxd-bench-reuse-")
	if err != nil {
		return run, err
	}
	defer os.RemoveAll(work)
	// Each codex is a copy the phase edits.
	dirs := make([]string, len(sets))
	for i, s := range sets {
		dirs[i] = filepath.Join(work, "codex", s.Codex)
		if err := os.CopyFS(dirs[i], os.DirFS(s.dir)); err != nil {
			return run, fmt.Errorf("copy %s: %w", s.Codex, err)
		}
	}
	c := cfg
	c.AnswerToks, c.CAGRatio, c.CacheReuse = cfg.QualityAnswerToks, 0, run.Chunk
	st, err := startLlamaStack(ctx, c, path, dirs[0], filepath.Join(work, "state"), m.NumCtx, 1)
	if err != nil {
		return run, err
	}
	defer st.stop()
	for i, s := range sets {
		edits, err := reuseCodex(ctx, cfg, st, s, dirs[i])
		if err != nil {
			return run, fmt.Errorf("%s: %w", s.Codex, err)
		}
		run.Edits = append(run.Edits, edits...)
	}
	for _, e := range run.Edits {
		run.Asked += e.Asked
		run.ShiftedCorrect += e.ShiftedCorrect
		run.FreshCorrect += e.FreshCorrect
		run.Differ += len(e.Differ)
		run.OnlyShifted += e.OnlyShifted
		run.OnlyFresh += e.OnlyFresh
	}
	return run, nil
}

// reuseCodex edits each of the first ReuseEdits files of the codex in dir
// in turn and asks s's questions on the shifted cache and fresh.
func reuseCodex(ctx context.Context, cfg Config, st *llamaStack, s QualitySet, dir string) ([]ReuseEdit, error) {
	stats, err := loadQualityCodex(ctx, st.ctxd, dir)
	if err != nil {
		return nil, err
	}
	if stats.Plan.Mode != runcontext.ModeCAG {
		return nil, fmt.Errorf("loads in %s mode, not whole", stats.Plan.Mode)
	}
	// The order before any edit, from the prompt of a first question.
	if _, err := askQuality(ctx, st.ctxd, "reuse-order-"+s.Codex, s.Questions[0]); err != nil {
		return nil, err
	}
	var lp ctxd.LastPrompt
	if err := st.ctxd.GetJSON(ctx, "/v1/sessions/reuse-order-"+s.Codex+"/prompt", &lp); err != nil {
		return nil, err
	}
	order := PromptFiles(lp.Prompt)
	if len(order) != stats.Files {
		return nil, fmt.Errorf("the prompt shows %d files of the codex's %d", len(order), stats.Files)
	}
	var edits []ReuseEdit
	for k, file := range order[:min(ReuseEdits, len(order)-1)] {
		e := ReuseEdit{Codex: s.Codex, File: file, Position: k, Files: len(order), CodexTokens: int(stats.Tokens)}
		p := filepath.Join(dir, filepath.FromSlash(file))
		original, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var qs []QualityQuestion
		for _, q := range s.Questions {
			if !slices.Contains(q.Files, file) { // its answer stays what it was
				qs = append(qs, q)
			}
		}
		if len(qs) == 0 {
			continue // every question's answer is in that file
		}
		// The slot holds the codex before the edit, evaluated fresh (or
		// restored from the slot file saved when it was): a question on it.
		if err := st.raw.EraseSlot(ctx, 0); err != nil {
			return nil, fmt.Errorf("erase the slot: %w", err)
		}
		if _, err := askQuality(ctx, st.ctxd, fmt.Sprintf("reuse-%s-%d-before", s.Codex, k), qs[0]); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, editFacts(original), 0o644); err != nil {
			return nil, err
		}
		after, err := loadQualityCodex(ctx, st.ctxd, dir)
		if err != nil {
			return nil, err
		}
		if !after.Order.EditsLast {
			return nil, fmt.Errorf("editing %s did not move it last (order %+v): is backend.cache_reuse on?", file, after.Order)
		}
		cfg.Log("reuse: %s, %s edited (file %d of %d): %d questions shifted, then fresh", s.Codex, file, k+1, len(order), len(qs))
		shifted := make([]QualityAnswer, len(qs))
		for i, q := range qs {
			a, sum, err := askWithSummary(ctx, st.ctxd, fmt.Sprintf("reuse-%s-%d-shifted-%s", s.Codex, k, q.ID), q)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				e.ShiftedEvaluated, e.ShiftedTTFTMs = a.Evaluated, a.TTFTMs
				if sum.BackendCachedTokens != nil {
					e.ShiftedReused = *sum.BackendCachedTokens
				}
			}
			shifted[i] = a
		}
		if err := st.raw.EraseSlot(ctx, 0); err != nil {
			return nil, fmt.Errorf("erase the slot: %w", err)
		}
		for i, q := range qs {
			a, _, err := askWithSummary(ctx, st.ctxd, fmt.Sprintf("reuse-%s-%d-fresh-%s", s.Codex, k, q.ID), q)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				e.FreshEvaluated, e.FreshTTFTMs = a.Evaluated, a.TTFTMs
				if a.Evaluated < e.CodexTokens {
					return nil, fmt.Errorf("the fresh arm evaluated %d tokens, less than the codex's %d: the slot was not erased", a.Evaluated, e.CodexTokens)
				}
			}
			e.Asked++
			if shifted[i].Correct {
				e.ShiftedCorrect++
			}
			if a.Correct {
				e.FreshCorrect++
			}
			if a.Answer != shifted[i].Answer {
				e.Differ = append(e.Differ, q.ID)
			}
			switch {
			case shifted[i].Correct && !a.Correct:
				e.OnlyShifted++
			case a.Correct && !shifted[i].Correct:
				e.OnlyFresh++
			}
		}
		// Undone: the next edit starts from the codex as it was.
		if err := os.WriteFile(p, original, 0o644); err != nil {
			return nil, err
		}
		if _, err := loadQualityCodex(ctx, st.ctxd, dir); err != nil {
			return nil, err
		}
		edits = append(edits, e)
	}
	return edits, nil
}

// askWithSummary asks q in session and grades the answer; it returns the
// answer's summary too.
func askWithSummary(ctx context.Context, c *client.Client, session string, q QualityQuestion) (QualityAnswer, *ctxd.Summary, error) {
	var text strings.Builder
	start := time.Now()
	var ttft time.Duration
	sum, err := c.Ask(ctx, ctxd.AskRequest{Session: session, Query: q.Q}, func(s string) {
		if ttft == 0 {
			ttft = time.Since(start)
		}
		text.WriteString(s)
	})
	if err != nil {
		return QualityAnswer{}, nil, err
	}
	return QualityAnswer{ID: q.ID, Answer: text.String(), Correct: Graded(text.String(), q.Answers), TTFTMs: ms(ttft),
		Evaluated: evaluated(sum), Prompt: sum.PromptTokens}, sum, nil
}

// editFacts is an edit that changes what a file says: a line added at its
// top, and every digit one more (9 becomes 0).
func editFacts(b []byte) []byte {
	out := append([]byte("edited: the values below changed in this revision\n"), b...)
	for i, c := range out {
		if c >= '0' && c <= '9' {
			out[i] = '0' + (c-'0'+1)%10
		}
	}
	return out
}

// PromptFiles are the paths of the codex files a prompt shows, in order.
func PromptFiles(prompt string) []string {
	var out []string
	for _, line := range strings.Split(prompt, "\n") {
		if i := strings.Index(line, " file \""); i >= 0 && strings.HasPrefix(line, "~~~") {
			out = append(out, strings.Trim(line[i+len(" file "):], "\""))
		}
	}
	return out
}

// reuseMarkdown writes the chunk-reuse section.
func (r *Report) reuseMarkdown(b *strings.Builder) {
	g := r.Reuse
	if g == nil {
		return
	}
	fmt.Fprintf(b, "### Chunk reuse after an edit: what it costs in answers (issue 28)\n\nMeasured %s on %s with %s (window %d, `backend.cache_reuse = %d`, temperature 0). For each answer-quality codex, each of its first %d files in turn is edited (a line added at its top, every digit one more), which moves it to the codex's end; every question whose answer is not in that file is then asked twice on the same prompt: on the cache the edit left, whose files after the edited one llama-server shifts (their keys and values computed with the old file before them), and fresh, the slot erased first.\n\n",
		r.ranAt(PhaseReuse), g.Backend, g.Model, g.NumCtx, g.Chunk, ReuseEdits)
	b.WriteString("| codex | edited file (its place) | codex tokens | first question, shifted: evaluated / reused, TTFT | fresh: evaluated, TTFT | right, shifted | right, fresh | answers that differ |\n|---|---|---|---|---|---|---|---|\n")
	for _, e := range g.Edits {
		fmt.Fprintf(b, "| %s | `%s` (%d of %d) | %s | %s / %s, %.0f ms | %s, %.0f ms | %d / %d | %d / %d | %d |\n",
			e.Codex, e.File, e.Position+1, e.Files, thousands(e.CodexTokens), thousands(e.ShiftedEvaluated), thousands(e.ShiftedReused), e.ShiftedTTFTMs,
			thousands(e.FreshEvaluated), e.FreshTTFTMs, e.ShiftedCorrect, e.Asked, e.FreshCorrect, e.Asked, len(e.Differ))
	}
	lo, hi := Wilson(g.ShiftedCorrect, g.Asked)
	flo, fhi := Wilson(g.FreshCorrect, g.Asked)
	fmt.Fprintf(b, "\nOver all %d pairs: right on the shifted cache %d (%.0f%%, 95%% interval %.0f–%.0f%%), fresh %d (%.0f%%, %.0f–%.0f%%); %d answers differ; %d right only shifted, %d right only fresh.\n\n",
		g.Asked, g.ShiftedCorrect, 100*float64(g.ShiftedCorrect)/float64(max(1, g.Asked)), 100*lo, 100*hi,
		g.FreshCorrect, 100*float64(g.FreshCorrect)/float64(max(1, g.Asked)), 100*flo, 100*fhi, g.Differ, g.OnlyShifted, g.OnlyFresh)
}
