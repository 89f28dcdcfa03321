package bench

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/ctxd/ctxd/governor"
)

// The plots the harness writes beside results.json.
const (
	ScalingPlot = "scaling.png" // cold and warm TTFT by codex size
	TurnsPlot   = "turns.png"   // TTFT per turn of the multi-turn session, three ways
)

// The plots' size: 9 × 6 inches at 128 dots per inch (1152 × 768 pixels),
// the legend below the axes.
const (
	plotW   = 9 * vg.Inch
	plotH   = 6 * vg.Inch
	plotDPI = 128
)

// logRatio is the spread (largest over smallest value) from which a time
// axis is drawn on a log scale.
const logRatio = 10

var (
	red   = color.RGBA{200, 40, 40, 255}
	blue  = color.RGBA{30, 90, 200, 255}
	green = color.RGBA{20, 140, 70, 255}
	grey  = color.RGBA{110, 110, 110, 255}
	black = color.RGBA{0, 0, 0, 255}
)

// WritePlots draws the report's plots as PNG files in dir (ScalingPlot and
// TurnsPlot) and returns their paths.
func (r *Report) WritePlots(dir string) ([]string, error) {
	var paths []string
	for _, pl := range []struct {
		name string
		draw func() (*plot.Plot, plot.Legend)
	}{
		{ScalingPlot, r.scalingPlot},
		{TurnsPlot, r.turnsPlot},
	} {
		p, legend := pl.draw()
		path := filepath.Join(dir, pl.name)
		if err := savePNG(path, p, legend); err != nil {
			return paths, fmt.Errorf("bench: plot %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// modelNote names the model and window for a plot's title: " (28M-parameter
// model, num_ctx 4,096)", or nothing if the report does not say.
func (r *Report) modelNote() string {
	if r.Machine.ModelParams == 0 {
		return ""
	}
	return fmt.Sprintf(" (%.0fM-parameter model, num_ctx %s)", float64(r.Machine.ModelParams)/1e6, thousands(r.Machine.NumCtx))
}

// scalingPlot draws cold and warm TTFT against the codex's share of the
// prompt budget, every sample as a dot and the medians joined, RAG points
// ringed, and the CAG/RAG threshold dashed.
func (r *Report) scalingPlot() (*plot.Plot, plot.Legend) {
	p, legend := newPlot("Time to first token by codex size"+r.modelNote(),
		"codex + stable blocks, % of the prompt budget")
	pts := r.Scaling
	var all []float64
	xMax := 100.0
	for _, s := range pts {
		all = append(append(append(all, s.ColdTTFTMs, s.WarmTTFTMs), s.ColdMs...), s.WarmMs...)
		xMax = max(xMax, math.Ceil(s.Pct/10)*10)
	}
	p.X.Min, p.X.Max = 0, xMax
	var ticks []plot.Tick
	for x := 0.0; x <= xMax; x += 10 {
		ticks = append(ticks, plot.Tick{Value: x, Label: fmt.Sprintf("%.0f%%", x)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if len(pts) == 0 {
		p.Title.Text += ": no points measured"
		return p, legend
	}
	y := newTimeAxis(all)
	for _, series := range []struct {
		name    string
		c       color.Color
		median  func(Scale) float64
		samples func(Scale) []float64
	}{
		{"cold: turn 1 of a fresh session (median; dots: every sample)", red,
			func(s Scale) float64 { return s.ColdTTFTMs }, func(s Scale) []float64 { return s.ColdMs }},
		{"warm: the later turns of one session (median; dots: every sample)", blue,
			func(s Scale) float64 { return s.WarmTTFTMs }, func(s Scale) []float64 { return s.WarmMs }},
	} {
		var med, samples plotter.XYs
		for _, s := range pts {
			med = append(med, plotter.XY{X: s.Pct, Y: y.y(series.median(s))})
			for _, v := range series.samples(s) {
				samples = append(samples, plotter.XY{X: s.Pct, Y: y.y(v)})
			}
		}
		line, points := linePoints(med, series.c, draw.CircleGlyph{})
		dots := scatter(samples, faded(series.c), draw.CircleGlyph{}, vg.Points(1.6))
		p.Add(dots, line, points)
		legend.Add(series.name, line, points)
	}
	var rag plotter.XYs
	for _, s := range pts {
		if s.Mode == "rag" {
			rag = append(rag, plotter.XY{X: s.Pct, Y: y.y(s.ColdTTFTMs)}, plotter.XY{X: s.Pct, Y: y.y(s.WarmTTFTMs)})
		}
	}
	if len(rag) > 0 {
		rings := scatter(rag, black, draw.RingGlyph{}, vg.Points(6))
		p.Add(rings)
		legend.Add("RAG mode: the codex is over the threshold and retrieved in parts", rings)
	}
	threshold := 100 * governor.DefaultCAGRatio
	edge := line(plotter.XYs{{X: threshold, Y: y.y(y.lo)}, {X: threshold, Y: y.y(y.hi)}}, grey)
	edge.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(edge)
	legend.Add(fmt.Sprintf("CAG/RAG threshold: the codex loads whole up to %.0f%% of the prompt budget", threshold), edge)
	y.apply(p)
	return p, legend
}

// turnsPlot draws the time to first token of each turn of the multi-turn
// session, the three ways it was sent.
func (r *Report) turnsPlot() (*plot.Plot, plot.Legend) {
	mt := r.MultiTurn
	n := len(mt.Ctxd.Turns)
	p, legend := newPlot(fmt.Sprintf("Time to first token per turn, %d-turn session%s", n, r.modelNote()), "turn")
	ways := []struct {
		s     Series
		c     color.Color
		glyph draw.GlyphDrawer
	}{
		{mt.Ctxd, blue, draw.CircleGlyph{}},
		{mt.Naive, red, draw.SquareGlyph{}},
		{mt.Floor, green, draw.TriangleGlyph{}},
	}
	var all []float64
	for _, w := range ways {
		for _, t := range w.s.Turns {
			all = append(all, t.TTFTMs)
		}
		n = max(n, len(w.s.Turns))
	}
	if len(all) == 0 {
		p.Title.Text = "Time to first token per turn: no session measured"
		return p, legend
	}
	y := newTimeAxis(all)
	for _, w := range ways {
		if len(w.s.Turns) == 0 {
			continue
		}
		var xys plotter.XYs
		for i, t := range w.s.Turns {
			xys = append(xys, plotter.XY{X: float64(i + 1), Y: y.y(t.TTFTMs)})
		}
		line, points := linePoints(xys, w.c, w.glyph)
		p.Add(line, points)
		legend.Add(w.s.Name, line, points)
	}
	p.X.Min, p.X.Max = 0.5, float64(n)+0.5
	step := 1
	for n/step > 20 {
		step *= 2
	}
	var ticks []plot.Tick
	for t := 1; t <= n; t += step {
		ticks = append(ticks, plot.Tick{Value: float64(t), Label: strconv.Itoa(t)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	y.apply(p)
	return p, legend
}

// newPlot is a plot with a title, an x label, a grid, and an empty legend
// to draw below it.
func newPlot(title, xLabel string) (*plot.Plot, plot.Legend) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Add(plotter.NewGrid())
	legend := plot.NewLegend()
	legend.Left, legend.Top = true, true
	legend.Padding = vg.Points(3)
	for _, st := range []struct {
		style *text.Style
		size  float64
	}{
		{&p.Title.TextStyle, 13}, {&p.X.Label.TextStyle, 11}, {&p.Y.Label.TextStyle, 11},
		{&p.X.Tick.Label, 10}, {&p.Y.Tick.Label, 10}, {&legend.TextStyle, 10},
	} {
		st.style.Font.Variant, st.style.Font.Size = "Sans", vg.Points(st.size)
	}
	p.Title.Padding = vg.Points(6)
	return p, legend
}

// timeAxis is the y axis of a plot of times in milliseconds: a log scale
// when the values spread over an order of magnitude or more, else linear
// from zero. The log scale is drawn as the values' base-10 logarithms on a
// linear axis with ticks labelled in ms and s, rather than with
// plot.LogScale, which places the axis label's glyph box by the arithmetic
// middle of the range and so leaves a wide gap above the axes.
type timeAxis struct {
	log    bool
	lo, hi float64 // the axis's ends, in ms
}

// newTimeAxis chooses the axis for values (not empty).
func newTimeAxis(values []float64) timeAxis {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range values {
		lo, hi = math.Min(lo, math.Max(v, 1)), math.Max(hi, v)
	}
	hi = math.Max(hi, 1)
	if hi/lo < logRatio {
		return timeAxis{lo: 0, hi: hi * 1.08}
	}
	// Round the ends out to a whole digit: 244 → 200, 60510 → 70000.
	e := math.Pow(10, math.Floor(math.Log10(lo)))
	lo = math.Floor(lo/e) * e
	e = math.Pow(10, math.Floor(math.Log10(hi)))
	hi = math.Ceil(hi/e) * e
	return timeAxis{log: true, lo: lo, hi: hi}
}

// y is where ms lies on the axis (on a log scale, at least its bottom).
func (a timeAxis) y(ms float64) float64 {
	if a.log {
		return math.Log10(math.Max(ms, a.lo))
	}
	return ms
}

// apply sets the plot's y axis; call it after adding the plotters, which
// widen the axis to their data.
func (a timeAxis) apply(p *plot.Plot) {
	p.Y.Min, p.Y.Max = a.y(a.lo), a.y(a.hi)
	if !a.log {
		p.Y.Label.Text = "time to first token (ms)"
		return
	}
	p.Y.Label.Text = "time to first token (log scale)"
	p.Y.Tick.Marker = msLogTicks{}
}

// msLogTicks marks an axis of log10(milliseconds) at every digit of each
// decade, labelling 1, 2 and 5 (or only the powers of ten over more than
// three decades) in ms or s.
type msLogTicks struct{}

func (msLogTicks) Ticks(lo10, hi10 float64) []plot.Tick {
	lo, hi := math.Pow(10, lo10), math.Pow(10, hi10)
	labelled := map[int]bool{1: true, 2: true, 5: true}
	if math.Log10(hi/lo) > 3.5 {
		labelled = map[int]bool{1: true}
	}
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for m := 1; m <= 9; m++ {
			v := float64(m) * math.Pow(10, e)
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: math.Log10(v)}
			if labelled[m] {
				t.Label = msLabel(v)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// msLabel writes a duration in milliseconds: "200 ms", "1 s", "50 s".
func msLabel(ms float64) string {
	if ms < 1000 {
		return strconv.FormatFloat(ms, 'g', 3, 64) + " ms"
	}
	return strconv.FormatFloat(ms/1000, 'g', 3, 64) + " s"
}

// line is a solid line through xys.
func line(xys plotter.XYs, c color.Color) *plotter.Line {
	l, err := plotter.NewLine(xys)
	if err != nil {
		// NewLine fails only on NaN or infinite values, which the
		// harness does not measure.
		panic(fmt.Sprintf("bench: plot line: %v", err))
	}
	l.LineStyle.Color, l.LineStyle.Width = c, vg.Points(1.5)
	return l
}

// linePoints is a line through xys with a glyph on each point.
func linePoints(xys plotter.XYs, c color.Color, glyph draw.GlyphDrawer) (*plotter.Line, *plotter.Scatter) {
	return line(xys, c), scatter(xys, c, glyph, vg.Points(3))
}

// scatter is a glyph on each point of xys.
func scatter(xys plotter.XYs, c color.Color, glyph draw.GlyphDrawer, radius vg.Length) *plotter.Scatter {
	s, err := plotter.NewScatter(xys)
	if err != nil {
		panic(fmt.Sprintf("bench: plot points: %v", err))
	}
	s.GlyphStyle.Color, s.GlyphStyle.Shape, s.GlyphStyle.Radius = c, glyph, radius
	return s
}

// faded is c, half transparent.
func faded(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8), 110}
}

// savePNG draws p with legend below it and writes the PNG to path.
func savePNG(path string, p *plot.Plot, legend plot.Legend) error {
	img := vgimg.NewWith(vgimg.UseWH(plotW, plotH), vgimg.UseDPI(plotDPI), vgimg.UseBackgroundColor(color.White))
	c := draw.New(img)
	pad := vg.Points(8)
	legendH := vg.Length(0)
	if r := legend.Rectangle(c); r.Size().Y > 0 {
		legendH = r.Size().Y + 2*pad
	}
	area := draw.Crop(c, pad/2, -pad, legendH, -pad)
	p.Draw(area)
	if legendH > 0 {
		// Align the legend with the left edge of the axes.
		inset := p.DataCanvas(area).Min.X - c.Min.X
		legend.Draw(draw.Crop(c, inset, 0, pad, legendH-pad-c.Size().Y))
	}
	var b bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&b); err != nil {
		return fmt.Errorf("encode: %w", err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
