package governor

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ctxd/ctxd/hostenv"
	"github.com/ctxd/ctxd/internal/nvmltest"
)

// stories260K's model_info as Ollama's /api/show reports it (JSON numbers
// decode to float64).
func stories260K() map[string]any {
	return map[string]any{
		"general.architecture":          "llama",
		"llama.block_count":             float64(5),
		"llama.attention.head_count":    float64(8),
		"llama.attention.head_count_kv": float64(4),
		"llama.embedding_length":        float64(64),
		"llama.context_length":          float64(2048),
	}
}

func TestKVBytesMatchesLlamaCpp(t *testing.T) {
	f, err := FactsFromModelInfo(stories260K())
	if err != nil {
		t.Fatal(err)
	}
	// llama-server logged "K (f16) 0.62 MiB, V (f16) 0.62 MiB" for 2048
	// cells of this model: 2048 * 5 layers * (32+32) * 2 bytes.
	if got := f.KVBytes(CacheF16, 2048); got != 1310720 {
		t.Errorf("f16 KV for 2048 cells = %d, want 1310720", got)
	}
	// q8_0: 34 bytes per 32 elements; q4_0: 18.
	if got := f.KVBytes(CacheQ8_0, 2048); got != 1310720/64*34 {
		t.Errorf("q8_0 KV = %d, want %d", got, 1310720/64*34)
	}
	if got := f.KVBytes(CacheQ4_0, 2048); got != 1310720/64*18 {
		t.Errorf("q4_0 KV = %d, want %d", got, 1310720/64*18)
	}
	if got := f.KVBytesPerToken(CacheF16); got != 640 {
		t.Errorf("f16 per token = %v, want 640", got)
	}
}

func TestFactsFromModelInfo(t *testing.T) {
	info := stories260K()
	info["llama.attention.head_count_kv"] = []any{float64(4), float64(4), float64(2), float64(2), float64(1)}
	info["llama.attention.key_length"] = float64(16)
	f, err := FactsFromModelInfo(info)
	if err != nil {
		t.Fatal(err)
	}
	if f.KeyLength != 16 || f.ValueLength != 8 || f.HeadCountKV[4] != 1 {
		t.Errorf("facts %+v", f)
	}
	// Per layer: kvHeads*(16+8) elements * 2 bytes per cell.
	want := int64((4 + 4 + 2 + 2 + 1) * 24 * 2 * 100)
	if got := f.KVBytes(CacheF16, 100); got != want {
		t.Errorf("per-layer KV = %d, want %d", got, want)
	}
	for _, key := range []string{"general.architecture", "llama.block_count", "llama.embedding_length"} {
		bad := stories260K()
		delete(bad, key)
		if _, err := FactsFromModelInfo(bad); err == nil {
			t.Errorf("model info without %s accepted", key)
		}
	}
	if _, err := ParseCacheType("q5_1"); err == nil {
		t.Error("unknown cache type accepted")
	}
}

const gib = 1 << 30

// llama8B is a Llama-3-8B-shaped model: 32 layers, 8 KV heads of 128, 4.9 GB of q4 weights.
func llama8B() ModelFacts {
	f := ModelFacts{Architecture: "llama", BlockCount: 32, HeadCount: 32, KeyLength: 128, ValueLength: 128,
		Embedding: 4096, ContextLength: 131072, WeightsBytes: 4_920_000_000}
	for range 32 {
		f.HeadCountKV = append(f.HeadCountKV, 8)
	}
	return f
}

// TestPlanWindowUnderNVML drives every memory scenario through the real
// probe with go-nvml's mocks.
func TestPlanWindowUnderNVML(t *testing.T) {
	hostMem := func(total, avail uint64) func() (uint64, uint64, error) {
		return func() (uint64, uint64, error) { return total, avail, nil }
	}
	lost := nvmltest.GPU(24*gib, 20*gib)
	lost.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_GPU_IS_LOST }
	cases := []struct {
		name      string
		lib       hostenv.NVML
		host      func() (uint64, uint64, error)
		requested int
		source    string
		numCtx    int // 0: want ErrInsufficientMemory
	}{
		{"plenty", nvmltest.GPU(80*gib, 78*gib), hostMem(64*gib, 60*gib), 0, "nvml", 32768},
		{"tight", nvmltest.GPU(8*gib, 7*gib), hostMem(64*gib, 60*gib), 0, "nvml", 15616},
		{"insufficient", nvmltest.GPU(6*gib, 5*gib), hostMem(64*gib, 60*gib), 0, "nvml", 0},
		{"explicit too large", nvmltest.GPU(8*gib, 7*gib), hostMem(64*gib, 60*gib), 32768, "nvml", 0},
		{"library missing", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}, hostMem(16*gib, 9*gib), 0, "host", 32000},
		{"device lost", lost, hostMem(16*gib, 6*gib), 0, "host", 7424},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			probe := hostenv.New(hostenv.Config{NVML: c.lib, HostMemory: c.host, SysRoot: t.TempDir()})
			r := probe.Read()
			if r.Source != c.source {
				t.Fatalf("memory source %q, want %q (%s)", r.Source, c.source, r.Note)
			}
			plan, err := PlanWindow(PlanRequest{
				Facts: llama8B(), CacheType: CacheF16,
				Memory:   Memory{Source: r.Source, Total: r.TotalBytes, Free: r.FreeBytes},
				Headroom: 512 << 20, Requested: c.requested, Max: 32768, Min: 2048,
			})
			if c.numCtx == 0 {
				if !errors.Is(err, ErrInsufficientMemory) {
					t.Fatalf("plan %+v, err %v; want ErrInsufficientMemory", plan, err)
				}
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.NumCtx != c.numCtx {
				t.Errorf("num_ctx %d, want %d (%s)", plan.NumCtx, c.numCtx, plan.Reason)
			}
			used := plan.WeightsBytes + plan.KVBytes + plan.HeadroomBytes
			if used > int64(r.FreeBytes) {
				t.Errorf("plan uses %d bytes of %d free", used, r.FreeBytes)
			}
			if next := llama8B().KVBytes(CacheF16, plan.NumCtx+ctxStep); plan.NumCtx < 32768 && plan.WeightsBytes+next+plan.HeadroomBytes <= int64(r.FreeBytes) {
				t.Errorf("num_ctx %d is not the largest that fits", plan.NumCtx)
			}
		})
	}
}

// TestPlanWindowAtCriticalPressure: at critical VRAM pressure a window
// chosen by size stays at the smallest useful one and says why; an
// operator's explicit num_ctx is kept.
func TestPlanWindowAtCriticalPressure(t *testing.T) {
	mem := Memory{Source: "nvml", Total: 80 * gib, Free: 78 * gib}
	base := PlanRequest{Facts: llama8B(), CacheType: CacheF16, Memory: mem, Headroom: 512 << 20, Max: 32768, Min: 2000}
	calm, err := PlanWindow(base)
	if err != nil || calm.NumCtx != 32768 {
		t.Fatalf("calm: %+v %v", calm, err)
	}
	crit := base
	crit.Critical = true
	plan, err := PlanWindow(crit)
	if err != nil || plan.NumCtx != 2048 || !strings.Contains(plan.Reason, "critical") {
		t.Errorf("critical: num_ctx %d (%s) %v; want 2048", plan.NumCtx, plan.Reason, err)
	}
	crit.Requested = 8192
	if plan, err := PlanWindow(crit); err != nil || plan.NumCtx != 8192 {
		t.Errorf("critical, explicit: %+v %v", plan, err)
	}
}

// gemma3_270M is Gemma 3 270M's model info as its GGUF has it: 18
// layers, one KV head of 256, a 512-token sliding window, no pattern in
// the file (llama.cpp's for gemma3: of every 6 layers the last is global).
func gemma3_270M() map[string]any {
	return map[string]any{
		"general.architecture":            "gemma3",
		"gemma3.block_count":              float64(18),
		"gemma3.attention.head_count":     float64(4),
		"gemma3.attention.head_count_kv":  float64(1),
		"gemma3.attention.key_length":     float64(256),
		"gemma3.attention.value_length":   float64(256),
		"gemma3.embedding_length":         float64(640),
		"gemma3.context_length":           float64(32768),
		"gemma3.attention.sliding_window": float64(512),
	}
}

// TestSlidingWindowKV: the cache sizes llama-server allocates for Gemma 3
// 270M with 8192 cells, as it logged them: without --swa-full 24 MiB for
// the 3 global layers and 15 MiB for the 15 windowed ones (1024 cells:
// the window and a 512-token batch); with it 144 MiB. The plan counts
// the whole cache and says what that costs.
func TestSlidingWindowKV(t *testing.T) {
	f, err := FactsFromModelInfo(gemma3_270M())
	if err != nil {
		t.Fatal(err)
	}
	if f.SlidingWindow != 512 || f.SWALayers != 15 {
		t.Fatalf("sliding window %d over %d layers, want 512 over 15", f.SlidingWindow, f.SWALayers)
	}
	const mb = 1 << 20
	if got := f.KVBytes(CacheF16, 8192); got != 144*mb {
		t.Errorf("whole cache %d, want 144 MiB", got)
	}
	if got := f.KVBytesWindowed(CacheF16, 8192, 512); got != 39*mb {
		t.Errorf("windowed cache %d, want 39 MiB", got)
	}
	// A window smaller than the window's cells is whole anyway.
	if got := f.KVBytesWindowed(CacheF16, 768, 512); got != f.KVBytes(CacheF16, 768) {
		t.Errorf("a 768-token window: windowed %d, whole %d", got, f.KVBytes(CacheF16, 768))
	}
	p, err := PlanWindow(PlanRequest{Facts: f, CacheType: CacheF16, Memory: Memory{Source: "host", Total: 8 * gib, Free: 8 * gib}, Requested: 8192, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.KVBytes != 2*144*mb || p.SlidingWindow != 512 || p.SWAFullBytes != 2*105*mb {
		t.Errorf("plan: kv %d, sliding window %d, swa-full cost %d", p.KVBytes, p.SlidingWindow, p.SWAFullBytes)
	}
	if !strings.Contains(p.Reason, "sliding-window attention (512 tokens, 15 of 18 layers)") || !strings.Contains(p.Reason, "210.0 MiB more") {
		t.Errorf("reason: %s", p.Reason)
	}

	// The file's own pattern wins: a number, or a flag per layer.
	info := gemma3_270M()
	info["gemma3.attention.sliding_window_pattern"] = float64(3)
	if f, _ := FactsFromModelInfo(info); f.SWALayers != 12 {
		t.Errorf("pattern 3: %d windowed layers, want 12", f.SWALayers)
	}
	info["gemma3.attention.sliding_window_pattern"] = float64(1)
	if f, _ := FactsFromModelInfo(info); f.SWALayers != 0 || f.SlidingWindow != 0 {
		t.Errorf("pattern 1 (every layer global): %d windowed layers, window %d", f.SWALayers, f.SlidingWindow)
	}
	flags := make([]any, 18)
	for i := range flags {
		flags[i] = i%2 == 0
	}
	info["gemma3.attention.sliding_window_pattern"] = flags
	if f, _ := FactsFromModelInfo(info); f.SWALayers != 9 {
		t.Errorf("a flag per layer: %d windowed layers, want 9", f.SWALayers)
	}
	// An architecture without a known pattern: every layer, the most a
	// windowed cache could save. A model without a window has none.
	info = stories260K()
	info["llama.attention.sliding_window"] = float64(256)
	if f, _ := FactsFromModelInfo(info); f.SWALayers != 5 {
		t.Errorf("unknown pattern: %d windowed layers, want 5", f.SWALayers)
	}
	if f, _ := FactsFromModelInfo(stories260K()); f.SlidingWindow != 0 || f.SWALayers != 0 || f.KVBytesWindowed(CacheF16, 2048, 512) != f.KVBytes(CacheF16, 2048) {
		t.Errorf("no window: %+v", f)
	}
}
