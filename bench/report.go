package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Machine says where the numbers come from.
type Machine struct {
	CPU         string  `json:"cpu"`
	Cores       int     `json:"cores"`
	MemoryGiB   float64 `json:"memory_gib"`
	OS          string  `json:"os"`
	Go          string  `json:"go"`
	Ollama      string  `json:"ollama"`
	Model       string  `json:"model"`
	ModelParams int64   `json:"model_params"`
	NumCtx      int     `json:"num_ctx"`
}

// Report is everything the harness measured. A run may measure some
// phases only (ctxd-bench --phases); the others keep an earlier run's
// results, and Ran says when each phase was measured.
type Report struct {
	Started   string            `json:"started"`
	Ran       map[string]string `json:"phases_ran,omitempty"` // phase → when it was measured
	Machine   Machine           `json:"machine"`
	Config    Config            `json:"-"`
	MultiTurn MultiTurn         `json:"multi_turn"`
	Overhead  Overhead          `json:"sidecar_overhead"`
	// PreviousOverhead is the overhead the run before measured, for
	// comparison after a change to the request path.
	PreviousOverhead *PreviousOverhead `json:"previous_sidecar_overhead,omitempty"`
	Compose          Compose           `json:"compose"`
	Scaling          []Scale           `json:"scaling"`
	Agents           []AgentRun        `json:"agents,omitempty"`
	Llama            *LlamaRun         `json:"llamacpp,omitempty"`
	RAG              *RAGRun           `json:"rag,omitempty"`
	Drift            []DriftRun        `json:"drift,omitempty"`
	// DriftBaseline is the same drifting sessions measured, in the same
	// run, on an earlier daemon (ctxd-bench --drift-baseline).
	DriftBaseline *DriftBaseline `json:"drift_baseline,omitempty"`
	Quality       []QualityRun   `json:"quality,omitempty"`
	Real          []RealRun      `json:"real_models,omitempty"`
	Reuse         *ReuseRun      `json:"reuse,omitempty"`
	Personas      *PersonasRun   `json:"personas,omitempty"`
	Dashboard     *DashboardRun  `json:"dashboard,omitempty"`
}

// PreviousOverhead is an earlier run's overhead and when it ran.
type PreviousOverhead struct {
	Ran      string   `json:"ran"`
	Overhead Overhead `json:"overhead"`
}

// ranAt is when phase was measured: its own time, else the report's.
func (r *Report) ranAt(phase string) string {
	if t, ok := r.Ran[phase]; ok {
		return t
	}
	return r.Started
}

// ReadReport loads a report written by Write.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	return &r, nil
}

// Markers delimit the section of docs/benchmarks.md the harness owns.
const (
	beginMarker = "<!-- bench:begin (written by `ctxd-bench`; edits inside are overwritten) -->"
	endMarker   = "<!-- bench:end -->"
)

// README markers delimit the figures of README.md the harness owns: the
// main paragraph (required), and llama-server's (where the README has its
// markers and the report has the phase).
const (
	readmeBegin      = "<!-- bench:readme:begin (written by `ctxd-bench`) -->"
	readmeEnd        = "<!-- bench:readme:end -->"
	readmeLlamaBegin = "<!-- bench:readme-llamacpp:begin (written by `ctxd-bench`) -->"
	readmeLlamaEnd   = "<!-- bench:readme-llamacpp:end -->"
)

// replaceBetween replaces what lies between the markers begin and end.
func replaceBetween(text, begin, end, content string) (string, bool) {
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		return text, false
	}
	return text[:i] + begin + "\n" + content + end + text[j+len(end):], true
}

// Write saves results.json and the plots (WritePlots) in dir, replaces the
// harness's section of the Markdown file doc (created if missing) and, if
// readme is not empty, the figures between the README markers.
func (r *Report) Write(dir, doc, readme string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if _, err := r.WritePlots(dir); err != nil {
		return err
	}
	section := r.Markdown(relDir(doc, dir))
	old, err := os.ReadFile(doc)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	text := string(old)
	i, j := strings.Index(text, beginMarker), strings.Index(text, endMarker)
	block := beginMarker + "\n" + section + endMarker
	if i >= 0 && j > i {
		text = text[:i] + block + text[j+len(endMarker):]
	} else {
		text = strings.TrimRight(text, "\n") + "\n\n" + block + "\n"
	}
	if err := os.WriteFile(doc, []byte(text), 0o644); err != nil {
		return err
	}
	if readme == "" {
		return nil
	}
	old, err = os.ReadFile(readme)
	if err != nil {
		return err
	}
	text, ok := replaceBetween(string(old), readmeBegin, readmeEnd, r.ReadmeFigures(relDir(readme, dir)))
	if !ok {
		return fmt.Errorf("bench: %s has no %s ... %s markers for the figures", readme, readmeBegin, readmeEnd)
	}
	if r.Llama != nil {
		text, _ = replaceBetween(text, readmeLlamaBegin, readmeLlamaEnd, r.ReadmeLlamaFigures())
	}
	return os.WriteFile(readme, []byte(text), 0o644)
}

// relDir is dir as a link from the Markdown file doc.
func relDir(doc, dir string) string {
	rel, err := filepath.Rel(filepath.Dir(doc), dir)
	if err != nil {
		rel = dir
	}
	return filepath.ToSlash(rel)
}

// ReadmeLlamaFigures is the README's paragraph on llama-server against
// Ollama: the codex size nearest 8k tokens, and the restart.
func (r *Report) ReadmeLlamaFigures() string {
	l := r.Llama
	if l == nil || len(l.Sizes) == 0 {
		return ""
	}
	s := l.Sizes[0]
	for _, x := range l.Sizes {
		if abs(x.TargetTokens-8000) < abs(s.TargetTokens-8000) {
			s = x
		}
	}
	rs := l.Restart
	return fmt.Sprintf("Measured with `make bench` on the same machine and model, side by side ([docs/benchmarks.md](docs/benchmarks.md)): over a codex of %s stable tokens, llama-server through ctxd evaluates the first question in %.1f s and answers the next ones in %.0f ms (median time to first token), where Ollama %s takes %.1f s and %.0f ms; ctxd adds %.2f ms (median) to llama-server's own time for the same token ids. After llama-server is killed and restarted, the first answer over a %s-token codex starts in %.0f ms, its prefix restored from the slot ctxd saved, instead of %.1f s cold (%.0f×).\n",
		thousands(s.StableTokens), s.LlamaColdMs/1000, percentile(s.LlamaWarmMs, 0.5), r.Machine.Ollama, s.OllamaColdMs/1000, percentile(s.OllamaWarmMs, 0.5), s.OverheadP50,
		thousands(rs.StableTokens), rs.RestoredMs, rs.ColdMs/1000, rs.Ratio)
}

// ReadmeFigures is the README's paragraph of measured figures, and links
// to the plots in the directory plots (relative to the README; none if
// empty).
func (r *Report) ReadmeFigures(plots string) string {
	var b strings.Builder
	mt, m := r.MultiTurn, r.Machine
	fmt.Fprintf(&b, "Measured on a %d-core CPU machine with `make bench` (see [docs/benchmarks.md](docs/benchmarks.md)): over a %d-turn session with a %.0fM-parameter model and a %s-token first prompt, the first answer starts after %.0f s (cold) and the later ones through ctxd after %.2f s (median): %.0f× faster than the cold first turn, and %.0f× faster than the same session sent in a typical agent's order.",
		m.Cores, len(mt.Ctxd.Turns), float64(m.ModelParams)/1e6, thousands(mt.Ctxd.Turns[0].PromptTokens),
		mt.ColdP50/1000, mt.Ctxd.P50/1000, mt.ColdOverWarm, mt.NaiveOverCtxd)
	if len(r.Agents) > 0 {
		a := r.Agents[0]
		fmt.Fprintf(&b, " With %d agents sharing one daemon and %d backend slot(s), %d turns each, every turn reuses the shared codex (median %s tokens cached) and evaluates only its own conversation (median %.0f tokens); the median turn waits %.1f s for the other agents' turns and gets its first token after %.1f s.",
			a.Agents, a.Slots, a.Turns, thousands(int(a.All.CachedP50)), a.All.EvalP50, a.All.WaitP50/1000, a.All.TTFTP50/1000)
	}
	b.WriteString("\n")
	if plots != "" {
		fmt.Fprintf(&b, "\nPlots: [time to first token per turn of that session, three ways](%s/%s); [cold and warm time to first token by codex size](%s/%s).\n",
			plots, TurnsPlot, plots, ScalingPlot)
	}
	return b.String()
}

// abs is |x|.
func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// thousands writes n with a comma every three digits.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// Markdown renders the report as the section of docs/benchmarks.md.
func (r *Report) Markdown(dir string) string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## The benchmark harness\n\n")
	fmt.Fprintf(&b, "`make bench` → `ctxd-bench`, last run %s (each section says when it was measured; `ctxd-bench --phases` measures some and keeps the others). Machine: %s, %d cores, %.1f GiB, %s, %s. Backend: Ollama %s (managed, CPU). Model: %s (%.1fM parameters), `num_ctx` %d. Raw numbers: [%s/results.json](%s/results.json).\n\n",
		r.Started, m.CPU, m.Cores, m.MemoryGiB, m.OS, m.Go, m.Ollama, m.Model, float64(m.ModelParams)/1e6, m.NumCtx, dir, dir)

	mt := r.MultiTurn
	fmt.Fprintf(&b, "### Multi-turn session (%d turns, codex ≈ half the window)\n\nMeasured %s.\n\n", len(mt.Ctxd.Turns), r.ranAt(PhaseMultiTurn))
	b.WriteString("Per turn: time to first token (ms), tokens evaluated / prompt tokens, the backend's prompt-evaluation time (ms).\n\n")
	b.WriteString("| turn | ctxd TTFT | ctxd evaluated | ctxd eval ms | naive TTFT | naive evaluated | naive eval ms | query alone TTFT | query alone evaluated | query alone eval ms |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for i := range mt.Ctxd.Turns {
		fmt.Fprintf(&b, "| %d |", i+1)
		for _, t := range []Turn{mt.Ctxd.Turns[i], mt.Naive.Turns[i], mt.Floor.Turns[i]} {
			fmt.Fprintf(&b, " %.0f | %d / %d | %.0f |", t.TTFTMs, t.EvaluatedTokens, t.PromptTokens, t.PromptEvalMs)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n| way | median TTFT, turns 2+ (min–max) | median tokens evaluated, turns 2+ | median prompt eval, turns 2+ |\n|---|---|---|---|\n")
	for _, s := range []Series{mt.Ctxd, mt.Naive, mt.Floor} {
		fmt.Fprintf(&b, "| %s | %.0f ms (%.0f–%.0f) | %.0f | %.0f ms |\n", s.Name, s.P50, s.Min, s.Max, s.Eval, s.EvalMs)
	}
	fmt.Fprintf(&b, "\nctxd cold turn 1: median %.0f ms of %d (%s; the session's own, then the same first turn on fresh sessions after an unrelated prompt took the backend's slot).\n\n",
		mt.ColdP50, len(mt.ColdMs), list(mt.ColdMs)+" ms")
	fmt.Fprintf(&b, "ctxd cold median / ctxd warm median: **%.0f×** (target ≥ 50×). Naive median / ctxd median: **%.0f×** (target ≥ 50×).\n\n",
		mt.ColdOverWarm, mt.NaiveOverCtxd)
	fmt.Fprintf(&b, "![time to first token per turn: ctxd, naive order, query alone](%s/%s)\n\n", dir, TurnsPlot)

	o := r.Overhead
	fmt.Fprintf(&b, "### Sidecar overhead\n\nMeasured %s. %d pairs: the same %d-token prompt through ctxd (a new session with the same question, so ctxd renders the same prompt each time), then byte for byte straight to Ollama; both find it in the backend's slot (median backend prompt evaluation %.1f ms through ctxd, %.1f ms direct). Time to first token through ctxd minus direct, pair by pair: p50 **%.2f ms**, p95 %.2f ms (target ≤ 2 ms p50). Medians of the two sides: %.1f ms through ctxd, %.1f ms direct.\n\n",
		r.ranAt(PhaseOverhead), o.Requests, o.PromptTokens, o.CtxdEvalMs, o.DirectEvalMs, o.P50Ms, o.P95Ms, percentile(o.CtxdTTFTMs, 0.5), percentile(o.DirectTTFTMs, 0.5))
	fmt.Fprintf(&b, "The same ctxd requests seen from inside: the client's time to first token through the socket minus ctxd's own measurement of the backend's (from sending the prompt to Ollama to its first token): p50 %.2f ms, p95 %.2f ms.\n\n", o.OwnP50Ms, o.OwnP95Ms)
	if p := r.PreviousOverhead; p != nil {
		fmt.Fprintf(&b, "The run before (%s), for comparison: paired p50 %.2f ms, p95 %.2f ms; inside view p50 %.2f ms, p95 %.2f ms.\n\n",
			p.Ran, p.Overhead.P50Ms, p.Overhead.P95Ms, p.Overhead.OwnP50Ms, p.Overhead.OwnP95Ms)
	}

	c := r.Compose
	fmt.Fprintf(&b, "### Compose latency (no backend)\n\nMeasured %s. Build + validate + render a RunContext with a ~%dk-token codex, %d turns, %d karma entries, %d runs: p50 **%.3f ms**, p99 **%.3f ms** (targets ≤ 1 ms, ≤ 5 ms). Allocations per request do not grow with the codex: `go test -bench Compose -benchmem ./runcontext/`.\n\n",
		r.ranAt(PhaseCompose), c.CodexTokens/1000, c.Turns, c.Karma, c.Runs, c.P50Ms, c.P99Ms)

	fmt.Fprintf(&b, "### Scaling with the codex\n\nMeasured %s. Cold: turn 1 of a fresh session after an unrelated prompt took the backend's slot; warm: the next turns of one session. Medians, every sample in brackets.\n\n", r.ranAt(PhaseScaling))
	b.WriteString("| codex + stable blocks, % of prompt budget | mode | turn-1 prompt tokens | cold TTFT ms | warm TTFT ms |\n|---|---|---|---|---|\n")
	for _, s := range r.Scaling {
		fmt.Fprintf(&b, "| %.0f%% (%d tokens) | %s | %d | %.0f (%s) | %.0f (%s) |\n", s.Pct, s.StableTokens, s.Mode, s.PromptTokens,
			s.ColdTTFTMs, list(s.ColdMs), s.WarmTTFTMs, list(s.WarmMs))
	}
	fmt.Fprintf(&b, "\n![cold and warm TTFT by codex size](%s/%s)\n\n", dir, ScalingPlot)
	r.agentsMarkdown(&b)
	r.llamaMarkdown(&b)
	r.realMarkdown(&b)
	r.ragMarkdown(&b)
	r.driftMarkdown(&b)
	r.qualityMarkdown(&b)
	r.reuseMarkdown(&b)
	r.personasMarkdown(&b)
	r.dashboardMarkdown(&b)
	return b.String()
}

// ragMarkdown writes the RAG working-set section.
func (r *Report) ragMarkdown(b *strings.Builder) {
	g := r.RAG
	if g == nil {
		return
	}
	fmt.Fprintf(b, "### RAG turns that stay warm (issue 13)\n\nMeasured %s. Tree: `%s` (%d files, %d bytes, %s tokens: %.0f× the %d-token window), on Ollama with %s; %d follow-up questions about its `%s` package in one session, top-%d excerpts each, %d-token answers. The working set (the files most relevant to recent questions, whole or in part, after the tree's map in the codex block) is chosen at the first question, filling the CAG budget, and then changes only at its end when the governor leaves the history's excerpts out (see the drifting sessions below). Per turn: time to first token, tokens evaluated of the prompt, the working set's hits among the top-%d, excerpts added to the query (their tokens), and where the top-%d came from.\n\n",
		r.ranAt(PhaseRAG), g.Tree, g.Files, g.Bytes, thousands(int(g.Tokens)), float64(g.Tokens)/float64(g.NumCtx), g.NumCtx, g.Model, len(g.Turns), g.Package, g.TopK, g.AnswerTokens, g.TopK, g.TopK)
	b.WriteString("| turn | TTFT ms | evaluated / prompt | working-set hits | new excerpts (tokens) | top-k from the package | note |\n|---|---|---|---|---|---|---|\n")
	for i, t := range g.Turns {
		note := t.Moved
		if len(t.Governor) > 0 {
			note = strings.TrimSpace(note + " " + strings.Join(t.Governor, "; "))
		}
		fmt.Fprintf(b, "| %d | %.0f | %d / %d | %d | %d (%d) | %d of %d | %s |\n", i+1, t.TTFTMs, t.Evaluated, t.Prompt, t.Hits, t.New, t.NewTokens, t.FromPackage, len(t.TopK), note)
	}
	fmt.Fprintf(b, "\nTurns 2–%d: median **%.0f tokens evaluated** (target ≤ 400), median time to first token **%.0f ms**; turn 1 (cold, the working set chosen) %.0f ms. The same model over a CAG codex of %d stable tokens in the same run: cold %.0f ms, warm median %.0f ms (%s ms), so a warm RAG turn takes **%.1f×** a warm CAG turn (target ≤ 3×). %.0f%% of all top-%d excerpts came from `%s`; the working set moved %d time(s). ctxd's prompt token count equalled Ollama's `prompt_eval_count` on %d of %d turns (RAG and CAG): the working set, the excerpts and the CAG codex are counted exactly.\n\n",
		len(g.Turns), g.EvalP50, g.WarmP50, g.ColdMs, g.CAGStable, g.CAGColdMs, g.CAGWarmP50, list(g.CAGWarmMs), g.WarmOverCAG, 100*g.PackageShare, g.TopK, g.Package, g.Moves, g.ExactTurns, g.CountedTurns)
}

// llamaMarkdown writes the llama-server section.
func (r *Report) llamaMarkdown(b *strings.Builder) {
	l := r.Llama
	if l == nil {
		return
	}
	pairs := 0
	if len(l.Sizes) > 0 {
		pairs = len(l.Sizes[0].PairedCtxdMs)
	}
	fmt.Fprintf(b, "### llama-server and Ollama, one model\n\nMeasured %s. The same generated model (%s) on llama-server (%s, managed by ctxd, prompts as token ids) and on Ollama %s, through ctxd, in one run. Cold: a session's first turn after the codex loaded; warm: its next three turns (client-side time to first token, medians). ctxd − raw: %d pairs, the prompt ctxd rendered for a new session with the same question, as the same token ids with the same stop sequences, through ctxd and straight to the same llama-server slot, taking turns at going first (each evaluates the prompt's last token only); the difference of client-side times to first token, pair by pair (both sides' times vary by a few ms with the server's own, so this median carries that noise). ctxd inside: the client's time to first token through the socket minus ctxd's own measurement of llama-server's (from sending the ids), the same requests.\n\n",
		r.ranAt(PhaseLlama), l.Model, l.Server, r.Machine.Ollama, pairs)
	b.WriteString("| codex + stable blocks | llama-server cold | llama-server warm (tokens evaluated) | Ollama cold | Ollama warm | ctxd − raw llama-server, p50 | ctxd inside, p50 |\n|---|---|---|---|---|---|---|\n")
	for _, s := range l.Sizes {
		var ev []float64
		for _, e := range s.LlamaWarmEvaluated {
			ev = append(ev, float64(e))
		}
		fmt.Fprintf(b, "| %s tokens | %.0f ms | %.0f ms (%.0f) | %.0f ms | %.0f ms | %.2f ms | %.2f ms |\n", thousands(s.StableTokens),
			s.LlamaColdMs, percentile(s.LlamaWarmMs, 0.5), percentile(ev, 0.5), s.OllamaColdMs, percentile(s.OllamaWarmMs, 0.5), s.OverheadP50, s.OwnP50)
	}
	if n := len(l.Sizes); n > 1 && l.Sizes[0].StableTokens > 0 && len(l.Sizes[0].LlamaWarmMs) > 0 && len(l.Sizes[0].OllamaWarmMs) > 0 &&
		len(l.Sizes[n-1].LlamaWarmMs) > 0 && len(l.Sizes[n-1].OllamaWarmMs) > 0 {
		lo, hi := l.Sizes[0], l.Sizes[n-1]
		worst := lo.OverheadP50
		for _, s := range l.Sizes {
			worst = max(worst, s.OverheadP50)
		}
		fmt.Fprintf(b, "\nFrom the smallest codex to the largest (%.1f× the tokens), a warm turn grows %.1f× on llama-server and %.1f× on Ollama. On llama-server every warm turn evaluates about the same few new tokens; what grows is their attention over the context the slot holds, the server's own work, while ctxd's share (ctxd − raw) stays at most %.2f ms.\n",
			float64(hi.StableTokens)/float64(lo.StableTokens), percentile(hi.LlamaWarmMs, 0.5)/percentile(lo.LlamaWarmMs, 0.5),
			percentile(hi.OllamaWarmMs, 0.5)/percentile(lo.OllamaWarmMs, 0.5), worst)
	}
	if len(l.Sizes) > 0 && len(l.Sizes[0].BackendLegMs) > 0 {
		b.WriteString("\nWhere ctxd − raw goes, medians of the same pairs. Backend leg: ctxd's own measurement of llama-server's time to first token minus the raw client's, both from sending the ids (ctxd's connections to the server it started, each checked for who holds it when made, and the request). Inside, split by the summary's `timing`: the governor (building, counting and fitting the prompt) and the rest before the ids are sent (taking the session: a new session's owner is recorded in the store; checks); the rest of inside is the daemon's socket and HTTP (and any wait for a slot).\n\n")
		b.WriteString("| codex + stable blocks | ctxd − raw | backend leg | inside | governor | rest before sending |\n|---|---|---|---|---|---|\n")
		for _, s := range l.Sizes {
			fmt.Fprintf(b, "| %s tokens | %.2f ms | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n", thousands(s.StableTokens),
				s.OverheadP50, s.BackendLegP50, s.OwnP50, s.GovernorP50, s.OtherP50)
		}
	}
	b.WriteString("\nTwo agents taking turns (A B A B …) over one codex: on one shared slot each turn re-evaluates its own conversation after the codex; on two slots ctxd gives each agent its own (the second got the saved prefix restored). Time to first token, and in brackets the tokens llama-server evaluated (prompt − `cache_n`), turn by turn:\n\n")
	b.WriteString("| turn |")
	for _, ir := range l.Interleave {
		fmt.Fprintf(b, " A, %d slot(s) | B, %d slot(s) |", ir.Slots, ir.Slots)
	}
	b.WriteString("\n|---|")
	for range l.Interleave {
		b.WriteString("---|---|")
	}
	b.WriteString("\n")
	turns := 0
	for _, ir := range l.Interleave {
		turns = max(turns, len(ir.TTFTMs)/2)
	}
	for t := range turns {
		fmt.Fprintf(b, "| %d |", t+1)
		for _, ir := range l.Interleave {
			for i := 2 * t; i < 2*t+2; i++ {
				if i < len(ir.TTFTMs) && i < len(ir.Evaluated) {
					fmt.Fprintf(b, " %.0f ms (%d) |", ir.TTFTMs[i], ir.Evaluated[i])
				} else {
					b.WriteString(" |")
				}
			}
		}
		b.WriteString("\n")
	}
	for _, ir := range l.Interleave {
		var t, e []float64
		for i := 2; i < len(ir.TTFTMs) && i < len(ir.Evaluated); i++ {
			t, e = append(t, ir.TTFTMs[i]), append(e, float64(ir.Evaluated[i]))
		}
		fmt.Fprintf(b, "\nOn %d slot(s), turns 2 on: median %.0f ms, %.0f tokens evaluated.", ir.Slots, percentile(t, 0.5), percentile(e, 0.5))
	}
	b.WriteString("\n")
	rs := l.Restart
	fmt.Fprintf(b, "\nAfter a restart (llama-server killed, the supervisor starts it again), with %s stable tokens: the first turn on a fresh state took %.0f ms (cold); the first turn after the restart, with the prefix restored from the slot ctxd saved, %.0f ms: **%.0f×** (target ≥ 20×).\n\n",
		thousands(rs.StableTokens), rs.ColdMs, rs.RestoredMs, rs.Ratio)
}

// agentsMarkdown writes the many-agents section.
func (r *Report) agentsMarkdown(b *strings.Builder) {
	if len(r.Agents) == 0 {
		return
	}
	a0 := r.Agents[0]
	fmt.Fprintf(b, "### Many agents at once\n\nMeasured %s. %d agents, each its own session, send %d turns each back to back, all at once, over one codex (stable blocks %d tokens), through one daemon; model %s, %d-token answers. Time to first token is the client's (queue wait included); queue wait is the summary's `queue_wait_ms`; a slot is one of Ollama's `OLLAMA_NUM_PARALLEL` sequences.\n\n",
		r.ranAt(PhaseAgents), a0.Agents, a0.Turns, a0.StableTokens, a0.Model, a0.AnswerTokens)
	b.WriteString("| slots | requests | wall time | most generating at once | TTFT p50 | TTFT p95 | queue wait p50 | queue wait p95 | tokens evaluated p50 | tokens cached p50 |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range r.Agents {
		fmt.Fprintf(b, "| %d | %d | %.1f s | %d | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f | %.0f |\n", a.Slots, len(a.All.TTFTMs), a.WallMs/1000, a.Concurrency,
			a.All.TTFTP50, a.All.TTFTP95, a.All.WaitP50, a.All.WaitP95, a.All.EvalP50, a.All.CachedP50)
	}
	for _, a := range r.Agents {
		fmt.Fprintf(b, "\nPer agent, %d slot(s):\n\n| agent | TTFT p50 | TTFT p95 | queue wait p50 | queue wait p95 | tokens evaluated p50 |\n|---|---|---|---|---|---|\n", a.Slots)
		for _, s := range a.PerAgent {
			fmt.Fprintf(b, "| %s | %.0f ms | %.0f ms | %.0f ms | %.0f ms | %.0f |\n", s.Agent, s.TTFTP50, s.TTFTP95, s.WaitP50, s.WaitP95, s.EvalP50)
		}
	}
	b.WriteString("\n")
}

// list writes samples as "50492, 50210, 49870".
func list(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}
