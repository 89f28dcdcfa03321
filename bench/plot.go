package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// writePlot draws cold and warm TTFT (log scale) against the codex's share
// of the prompt budget, marking RAG points, as a PNG.
func writePlot(path string, pts []Scale) error {
	const w, h, left, right, top, bottom = 720, 440, 70, 20, 56, 50
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	grey, black := color.RGBA{200, 200, 200, 255}, color.RGBA{0, 0, 0, 255}
	cold, warm, rag := color.RGBA{200, 40, 40, 255}, color.RGBA{30, 90, 200, 255}, color.RGBA{120, 120, 120, 255}
	label := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	if len(pts) == 0 {
		label(left, top, "no scaling points", black)
		return save(path, img)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		for _, v := range []float64{p.ColdTTFTMs, p.WarmTTFTMs} {
			lo, hi = math.Min(lo, math.Max(v, 1)), math.Max(hi, v)
		}
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	px := func(pct float64) int { return left + int(pct/100*float64(w-left-right)) }
	py := func(ms float64) int {
		f := (math.Log10(math.Max(ms, lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return h - bottom - int(f*float64(h-top-bottom))
	}
	for d := lo; d <= hi*1.0001; d *= 10 {
		for x := left; x < w-right; x++ {
			img.Set(x, py(d), grey)
		}
		label(4, py(d)+4, fmt.Sprintf("%g ms", d), black)
	}
	for pct := 0.0; pct <= 100; pct += 10 {
		for y := top; y < h-bottom; y++ {
			img.Set(px(pct), y, grey)
		}
		label(px(pct)-10, h-bottom+16, fmt.Sprintf("%.0f%%", pct), black)
	}
	// The CAG/RAG threshold.
	for y := top; y < h-bottom; y += 3 {
		img.Set(px(70), y, rag)
	}
	line := func(get func(Scale) float64, c color.Color) {
		for i, p := range pts {
			x, y := px(p.Pct), py(get(p))
			for dx := -3; dx <= 3; dx++ {
				for dy := -3; dy <= 3; dy++ {
					img.Set(x+dx, y+dy, c)
				}
			}
			if i > 0 {
				x0, y0 := px(pts[i-1].Pct), py(get(pts[i-1]))
				steps := max(abs(x-x0), abs(y-y0))
				for s := 0; s <= steps; s++ {
					img.Set(x0+(x-x0)*s/max(1, steps), y0+(y-y0)*s/max(1, steps), c)
				}
			}
			if p.Mode == "rag" {
				label(x+6, y-6, "RAG", rag)
			}
		}
	}
	line(func(s Scale) float64 { return s.ColdTTFTMs }, cold)
	line(func(s Scale) float64 { return s.WarmTTFTMs }, warm)
	label(left, 18, "time to first token vs codex size (share of the prompt budget)", black)
	label(left, 38, "cold (turn 1, median)", cold)
	label(left+180, 38, "warm (later turns, median)", warm)
	label(left+400, 38, "dotted: 70% CAG/RAG threshold", rag)
	label(left+(w-left-right)/2-80, h-12, "codex + stable blocks, % of prompt budget", black)
	return save(path, img)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func save(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
