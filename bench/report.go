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

// Report is everything one run measured.
type Report struct {
	Started   string    `json:"started"`
	Machine   Machine   `json:"machine"`
	Config    Config    `json:"-"`
	MultiTurn MultiTurn `json:"multi_turn"`
	Overhead  Overhead  `json:"sidecar_overhead"`
	Compose   Compose   `json:"compose"`
	Scaling   []Scale   `json:"scaling"`
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
	beginMarker = "<!-- bench:begin (written by `ctxd bench`; edits inside are overwritten) -->"
	endMarker   = "<!-- bench:end -->"
)

// Write saves results.json and scaling.png in dir and replaces the
// harness's section of the Markdown file doc (created if missing).
func (r *Report) Write(dir, doc string) error {
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
	if err := writePlot(filepath.Join(dir, "scaling.png"), r.Scaling); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(doc), dir)
	if err != nil {
		rel = dir
	}
	section := r.Markdown(filepath.ToSlash(rel))
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
	return os.WriteFile(doc, []byte(text), 0o644)
}

// Markdown renders the report as the section of docs/benchmarks.md.
func (r *Report) Markdown(dir string) string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## The benchmark harness (issue 5)\n\n")
	fmt.Fprintf(&b, "`make bench` → `ctxd bench`, run %s. Machine: %s, %d cores, %.1f GiB, %s, %s. Backend: Ollama %s (managed, CPU). Model: %s (%.1fM parameters), `num_ctx` %d. Raw numbers: [%s/results.json](%s/results.json).\n\n",
		r.Started, m.CPU, m.Cores, m.MemoryGiB, m.OS, m.Go, m.Ollama, m.Model, float64(m.ModelParams)/1e6, m.NumCtx, dir, dir)

	mt := r.MultiTurn
	fmt.Fprintf(&b, "### Multi-turn session (%d turns, codex ≈ half the window)\n\n", len(mt.Ctxd.Turns))
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

	o := r.Overhead
	fmt.Fprintf(&b, "### Sidecar overhead\n\n%d pairs: the same %d-token prompt through ctxd (a new session with the same question, so ctxd renders the same prompt each time), then byte for byte straight to Ollama; both find it in the backend's slot (median backend prompt evaluation %.1f ms through ctxd, %.1f ms direct). Time to first token through ctxd minus direct, pair by pair: p50 **%.2f ms**, p95 %.2f ms (target ≤ 2 ms p50). Medians of the two sides: %.1f ms through ctxd, %.1f ms direct.\n\n",
		o.Requests, o.PromptTokens, o.CtxdEvalMs, o.DirectEvalMs, o.P50Ms, o.P95Ms, percentile(o.CtxdTTFTMs, 0.5), percentile(o.DirectTTFTMs, 0.5))
	fmt.Fprintf(&b, "The same ctxd requests seen from inside: the client's time to first token through the socket minus ctxd's own measurement of the backend's (from sending the prompt to Ollama to its first token): p50 %.2f ms, p95 %.2f ms.\n\n", o.OwnP50Ms, o.OwnP95Ms)

	c := r.Compose
	fmt.Fprintf(&b, "### Compose latency (no backend)\n\nBuild + validate + render a RunContext with a ~%dk-token codex, %d turns, %d karma entries, %d runs: p50 **%.3f ms**, p99 **%.3f ms** (targets ≤ 1 ms, ≤ 5 ms). Allocations per request do not grow with the codex: `go test -bench Compose -benchmem ./runcontext/`.\n\n",
		c.CodexTokens/1000, c.Turns, c.Karma, c.Runs, c.P50Ms, c.P99Ms)

	fmt.Fprintf(&b, "### Scaling with the codex\n\nCold: turn 1 of a fresh session after an unrelated prompt took the backend's slot; warm: the next turns of one session. Medians, every sample in brackets.\n\n")
	b.WriteString("| codex + stable blocks, % of prompt budget | mode | turn-1 prompt tokens | cold TTFT ms | warm TTFT ms |\n|---|---|---|---|---|\n")
	for _, s := range r.Scaling {
		fmt.Fprintf(&b, "| %.0f%% (%d tokens) | %s | %d | %.0f (%s) | %.0f (%s) |\n", s.Pct, s.StableTokens, s.Mode, s.PromptTokens,
			s.ColdTTFTMs, list(s.ColdMs), s.WarmTTFTMs, list(s.WarmMs))
	}
	fmt.Fprintf(&b, "\n![cold and warm TTFT by codex size](%s/scaling.png)\n\n", dir)
	return b.String()
}

// list writes samples as "50492, 50210, 49870".
func list(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}
