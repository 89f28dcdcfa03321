package bench

import (
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// smallReport is a report of a 4-turn session and three scaling points,
// the last in RAG mode; spread multiplies the cold times, so that a large
// spread asks for log-scale axes.
func smallReport(spread float64) *Report {
	series := func(name string, ms ...float64) Series {
		s := Series{Name: name}
		for _, v := range ms {
			s.Turns = append(s.Turns, Turn{TTFTMs: v, PromptTokens: 2000, EvaluatedTokens: 40})
		}
		s.summarize()
		return s
	}
	r := &Report{
		Started: "2026-01-02T03:04:05Z",
		Machine: Machine{Cores: 2, ModelParams: 28_000_000, NumCtx: 4096},
		MultiTurn: MultiTurn{
			Ctxd:  series("ctxd (cache-stable order)", 450*spread, 600, 610, 590),
			Naive: series("naive order", 440*spread, 410*spread, 430*spread, 450*spread),
			Floor: series("query alone (no codex)", 240, 360, 410, 350),
		},
		Scaling: []Scale{
			{Pct: 10, Mode: "cag", ColdTTFTMs: 87 * spread, WarmTTFTMs: 470, ColdMs: []float64{87 * spread, 90 * spread}, WarmMs: []float64{470, 480}},
			{Pct: 49, Mode: "cag", ColdTTFTMs: 440 * spread, WarmTTFTMs: 630, ColdMs: []float64{440 * spread}, WarmMs: []float64{620, 640}},
			{Pct: 84, Mode: "rag", ColdTTFTMs: 120 * spread, WarmTTFTMs: 7400, ColdMs: []float64{120 * spread}, WarmMs: []float64{7400}},
		},
	}
	r.MultiTurn.ColdMs, r.MultiTurn.ColdP50 = []float64{450 * spread}, 450*spread
	return r
}

// checkPNG fails unless path is a PNG of the plots' size with something
// drawn on it.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b := img.Bounds()
	if b.Dx() != 1152 || b.Dy() != 768 {
		t.Errorf("%s: %d × %d pixels, want 1152 × 768", path, b.Dx(), b.Dy())
	}
	if inked := inkedShare(img); inked < 0.01 || inked > 0.5 {
		t.Errorf("%s: %.1f%% of the pixels are not white, want a drawing on a white ground", path, 100*inked)
	}
}

// inkedShare is the share of img's pixels that are not white.
func inkedShare(img image.Image) float64 {
	b, n := img.Bounds(), 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r < 0xf000 || g < 0xf000 || bl < 0xf000 {
				n++
			}
		}
	}
	return float64(n) / float64(b.Dx()*b.Dy())
}

func TestWritePlots(t *testing.T) {
	empty := &Report{Machine: Machine{ModelParams: 28_000_000, NumCtx: 4096}}
	for _, tc := range []struct {
		name string
		r    *Report
		log  bool
	}{
		{"log scale", smallReport(100), true},
		{"linear scale", smallReport(1.5), false},
		{"nothing measured", empty, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			paths, err := tc.r.WritePlots(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{filepath.Join(dir, ScalingPlot), filepath.Join(dir, TurnsPlot)}
			if strings.Join(paths, " ") != strings.Join(want, " ") {
				t.Fatalf("wrote %v, want %v", paths, want)
			}
			for _, p := range paths {
				checkPNG(t, p)
			}
			if len(tc.r.Scaling) == 0 {
				return
			}
			p, _ := tc.r.turnsPlot()
			if gotLog := strings.Contains(p.Y.Label.Text, "log scale"); gotLog != tc.log {
				t.Errorf("turns plot: y label %q, want log scale %v", p.Y.Label.Text, tc.log)
			}
		})
	}
}

func TestMsLogTicks(t *testing.T) {
	var labels []string
	for _, tk := range (msLogTicks{}).Ticks(math.Log10(200), math.Log10(70000)) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if got, want := strings.Join(labels, ", "), "200 ms, 500 ms, 1 s, 2 s, 5 s, 10 s, 20 s, 50 s"; got != want {
		t.Errorf("labels %q, want %q", got, want)
	}
}

// TestWriteLinksPlots checks that the harness's outputs, the plots
// included, are written and linked from its Markdown section and the
// README's figures.
func TestWriteLinksPlots(t *testing.T) {
	dir := t.TempDir()
	doc, readme := filepath.Join(dir, "docs", "benchmarks.md"), filepath.Join(dir, "README.md")
	if err := os.WriteFile(readme, []byte("# x\n\n"+readmeBegin+"\nold\n"+readmeEnd+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := smallReport(100).Write(filepath.Join(dir, "docs", "bench"), doc, readme); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", ScalingPlot, TurnsPlot} {
		if _, err := os.Stat(filepath.Join(dir, "docs", "bench", f)); err != nil {
			t.Error(err)
		}
	}
	for path, links := range map[string][]string{
		doc:    {"(bench/" + ScalingPlot + ")", "(bench/" + TurnsPlot + ")"},
		readme: {"(docs/bench/" + ScalingPlot + ")", "(docs/bench/" + TurnsPlot + ")"},
	} {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if !strings.Contains(string(text), l) {
				t.Errorf("%s does not link %s:\n%s", path, l, text)
			}
		}
	}
}
