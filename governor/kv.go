package governor

import (
	"errors"
	"fmt"
)

// CacheType is the element type of the backend's KV cache.
type CacheType string

// KV cache types llama.cpp offers through Ollama.
const (
	CacheF16  CacheType = "f16"
	CacheQ8_0 CacheType = "q8_0"
	CacheQ4_0 CacheType = "q4_0"
)

// ParseCacheType checks a configured cache type.
func ParseCacheType(s string) (CacheType, error) {
	switch c := CacheType(s); c {
	case CacheF16, CacheQ8_0, CacheQ4_0:
		return c, nil
	}
	return "", fmt.Errorf("governor: kv cache type %q is not one of f16, q8_0, q4_0", s)
}

// RowBytes is the size of n elements of this type, as ggml_row_size
// computes it: f16 is 2 bytes an element; q8_0 and q4_0 store blocks of 32
// elements in 34 and 18 bytes (a 2-byte scale plus 32 8-bit or 4-bit values).
func (c CacheType) RowBytes(n int64) int64 {
	switch c {
	case CacheQ8_0:
		return (n + 31) / 32 * 34
	case CacheQ4_0:
		return (n + 31) / 32 * 18
	default:
		return 2 * n
	}
}

// ModelFacts are the numbers of a model that size its KV cache.
type ModelFacts struct {
	Architecture  string `json:"architecture"`
	BlockCount    int    `json:"block_count"`
	HeadCount     int    `json:"head_count"`
	HeadCountKV   []int  `json:"head_count_kv"` // per layer
	KeyLength     int    `json:"key_length"`
	ValueLength   int    `json:"value_length"`
	Embedding     int    `json:"embedding_length"`
	ContextLength int    `json:"context_length"`
	WeightsBytes  int64  `json:"weights_bytes"`
	// SlidingWindow is the attention window of the model's sliding-window
	// layers in tokens (0: every layer attends to the whole context), and
	// SWALayers how many of its layers use it.
	SlidingWindow int `json:"sliding_window,omitempty"`
	SWALayers     int `json:"swa_layers,omitempty"`
}

// swaPatterns are the architectures that interleave sliding-window layers
// with global ones without saying so in the model file, as llama.cpp and
// Ollama build them: of every n layers, the last is global.
var swaPatterns = map[string]int{"gemma2": 2, "gemma3": 6, "gemma3n": 5, "cohere2": 4, "llama4": 4, "gpt-oss": 2}

// readSWA reads the sliding window and which layers use it, as llama.cpp
// does: the model file's own pattern where it has one (a number n: of
// every n layers the last is global, 1 none windowed, 0 all; or one flag
// per layer), else the architecture's, else every layer.
func (f *ModelFacts) readSWA(info map[string]any) {
	w, _ := info[f.Architecture+".attention.sliding_window"].(float64)
	if w <= 0 || f.BlockCount <= 0 {
		return
	}
	f.SlidingWindow = int(w)
	n := swaPatterns[f.Architecture]
	switch v := info[f.Architecture+".attention.sliding_window_pattern"].(type) {
	case float64:
		n = int(v)
	case []any:
		if len(v) == f.BlockCount {
			for _, e := range v {
				if on, _ := e.(bool); on {
					f.SWALayers++
				}
			}
			return
		}
	}
	switch {
	case n == 1: // of every layer the last is global: none is windowed
		f.SlidingWindow = 0
		return
	case n <= 0:
		f.SWALayers = f.BlockCount
		return
	}
	for il := range f.BlockCount {
		if il%n < n-1 {
			f.SWALayers++
		}
	}
}

// FactsFromModelInfo reads model facts from Ollama's /api/show model_info:
// the architecture prefix comes from general.architecture; key and value
// lengths default to embedding length / heads when the model does not say.
func FactsFromModelInfo(info map[string]any) (ModelFacts, error) {
	arch, _ := info["general.architecture"].(string)
	if arch == "" {
		return ModelFacts{}, errors.New("governor: model info lacks general.architecture")
	}
	num := func(key string) (int, bool) {
		v, ok := info[arch+"."+key].(float64)
		return int(v), ok
	}
	f := ModelFacts{Architecture: arch}
	var ok bool
	if f.BlockCount, ok = num("block_count"); !ok || f.BlockCount <= 0 {
		return f, fmt.Errorf("governor: model info lacks %s.block_count", arch)
	}
	if f.HeadCount, ok = num("attention.head_count"); !ok || f.HeadCount <= 0 {
		return f, fmt.Errorf("governor: model info lacks %s.attention.head_count", arch)
	}
	if f.Embedding, ok = num("embedding_length"); !ok || f.Embedding <= 0 {
		return f, fmt.Errorf("governor: model info lacks %s.embedding_length", arch)
	}
	f.ContextLength, _ = num("context_length")
	// head_count_kv is a number, or an array with one entry per layer.
	switch v := info[arch+".attention.head_count_kv"].(type) {
	case float64:
		for range f.BlockCount {
			f.HeadCountKV = append(f.HeadCountKV, int(v))
		}
	case []any:
		for _, e := range v {
			n, _ := e.(float64)
			f.HeadCountKV = append(f.HeadCountKV, int(n))
		}
	default:
		for range f.BlockCount {
			f.HeadCountKV = append(f.HeadCountKV, f.HeadCount) // no GQA
		}
	}
	if len(f.HeadCountKV) != f.BlockCount {
		return f, fmt.Errorf("governor: %s.attention.head_count_kv has %d entries for %d layers", arch, len(f.HeadCountKV), f.BlockCount)
	}
	headDim := f.Embedding / f.HeadCount
	if f.KeyLength, ok = num("attention.key_length"); !ok || f.KeyLength <= 0 {
		f.KeyLength = headDim
	}
	if f.ValueLength, ok = num("attention.value_length"); !ok || f.ValueLength <= 0 {
		f.ValueLength = headDim
	}
	f.readSWA(info)
	return f, nil
}

// KVBytes is the size of a KV cache of n cells, computed per layer as
// llama.cpp allocates it: one K and one V tensor of n_embd_{k,v}_gqa * n
// elements each.
func (f ModelFacts) KVBytes(c CacheType, n int) int64 {
	var total int64
	for _, kvHeads := range f.HeadCountKV {
		total += c.RowBytes(int64(kvHeads*f.KeyLength) * int64(n))
		total += c.RowBytes(int64(kvHeads*f.ValueLength) * int64(n))
	}
	return total
}

// KVBytesWindowed is KVBytes for a cache that keeps, in the sliding-window
// layers, only what the window needs: the window and one batch of ubatch
// tokens, padded to 256 cells, as llama.cpp allocates them without
// --swa-full (and Ollama's windowed cache, about). KVBytes is what it
// allocates with --swa-full: every layer whole.
func (f ModelFacts) KVBytesWindowed(c CacheType, n, ubatch int) int64 {
	if f.SlidingWindow <= 0 || f.SWALayers <= 0 {
		return f.KVBytes(c, n)
	}
	cells := min(n, (f.SlidingWindow+ubatch+ctxStep-1)/ctxStep*ctxStep)
	share := float64(f.SWALayers) / float64(len(f.HeadCountKV))
	full, win := f.KVBytes(c, n), f.KVBytes(c, cells)
	return full - int64(share*float64(full-win))
}

// KVBytesPerToken is the KV cost of one token (exact for f16; for the block
// types a multiple of 32 tokens is exact).
func (f ModelFacts) KVBytesPerToken(c CacheType) float64 {
	return float64(f.KVBytes(c, 32*1024)) / (32 * 1024)
}

// ErrInsufficientMemory means the model and the smallest useful window do
// not fit in the memory there is.
var ErrInsufficientMemory = errors.New("insufficient memory")

// ctxStep is the granularity of a chosen window: a multiple of llama.cpp's
// largest KV padding (256, with flash attention), so no padding is added.
const ctxStep = 256

// Memory is what the budget is computed against.
type Memory struct {
	Source string `json:"source"` // "nvml" or "host"
	Total  uint64 `json:"total_bytes"`
	Free   uint64 `json:"free_bytes"`
}

// WindowPlan is the governor's choice of num_ctx for one model load.
type WindowPlan struct {
	NumCtx        int       `json:"num_ctx"` // per slot
	Slots         int       `json:"slots"`   // sequences the backend keeps, each with its own num_ctx of KV cache
	CacheType     CacheType `json:"kv_cache_type"`
	KVBytes       int64     `json:"kv_bytes"` // all slots together
	KVPerToken    float64   `json:"kv_bytes_per_token"`
	WeightsBytes  int64     `json:"weights_bytes"`
	HeadroomBytes int64     `json:"headroom_bytes"`
	Memory        Memory    `json:"memory"`
	Reason        string    `json:"reason"`
	// SlidingWindow is the model's attention window where it has one;
	// KVBytes then keeps every layer whole (so that a cached prefix longer
	// than the window can be reused), SWAFullBytes more than a windowed
	// cache would.
	SlidingWindow int   `json:"sliding_window,omitempty"`
	SWAFullBytes  int64 `json:"swa_full_bytes,omitempty"`
}

// PlanRequest is what PlanWindow needs.
type PlanRequest struct {
	Facts     ModelFacts
	CacheType CacheType
	Memory    Memory
	Headroom  int64 // bytes kept free besides weights and KV
	Requested int   // num_ctx asked for by the operator; 0: as large as fits
	Max       int   // cap when Requested is 0
	Min       int   // the smallest window worth loading (e.g. twice the answer reserve)
	Slots     int   // sequences the backend keeps, each with a whole window of KV cache; 0 means 1
	// Critical says the environment's VRAM pressure band is critical: a
	// window chosen by size (Requested 0) is then not grown past Min.
	Critical bool
}

// PlanWindow chooses num_ctx once per model load so that weights + KV +
// headroom fit the free memory. An operator's explicit num_ctx that does not
// fit is an error, not a silent shrink.
func PlanWindow(r PlanRequest) (WindowPlan, error) {
	slots := max(1, r.Slots)
	p := WindowPlan{
		Slots: slots, CacheType: r.CacheType, KVPerToken: r.Facts.KVBytesPerToken(r.CacheType),
		WeightsBytes: r.Facts.WeightsBytes, HeadroomBytes: r.Headroom, Memory: r.Memory,
	}
	avail := int64(r.Memory.Free) - r.Facts.WeightsBytes - r.Headroom
	kv := func(n int) int64 { return int64(slots) * r.Facts.KVBytes(r.CacheType, n) }
	fits := func(n int) bool { return avail >= kv(n) }
	if r.Requested > 0 {
		p.NumCtx = r.Requested
		p.KVBytes = kv(p.NumCtx)
		if !fits(p.NumCtx) {
			return p, fmt.Errorf("governor: %w: num_ctx %d for %d slot(s) needs %s of KV cache (%s) beside %s of weights and %s headroom; %s is free (%s)",
				ErrInsufficientMemory, p.NumCtx, slots, mib(p.KVBytes), r.CacheType, mib(r.Facts.WeightsBytes), mib(r.Headroom), mib(int64(r.Memory.Free)), r.Memory.Source)
		}
		p.Reason = "num_ctx set by the operator; fits"
		p.noteSWA(r)
		return p, nil
	}
	upper := r.Max
	if r.Facts.ContextLength > 0 {
		upper = min(upper, r.Facts.ContextLength)
	}
	n := upper
	if !fits(n) {
		// Largest multiple of ctxStep that fits.
		per := kv(ctxStep)
		n = 0
		if avail > 0 && per > 0 {
			n = int(avail/per) * ctxStep
		}
		for n > 0 && !fits(n) {
			n -= ctxStep
		}
		p.Reason = fmt.Sprintf("memory-bound: the trained window %d does not fit; the largest that does is %d", upper, n)
	} else {
		p.Reason = fmt.Sprintf("the model's window %d (capped at %d) fits", upper, r.Max)
	}
	if n < r.Min {
		return p, fmt.Errorf("governor: %w: weights %s + headroom %s leave %s for the KV cache (%s), not enough for a %d-token window in %d slot(s) (%s); %s free of %s (%s)",
			ErrInsufficientMemory, mib(r.Facts.WeightsBytes), mib(r.Headroom), mib(max(0, avail)), r.CacheType, r.Min, slots,
			mib(kv(r.Min)), mib(int64(r.Memory.Free)), mib(int64(r.Memory.Total)), r.Memory.Source)
	}
	if floor := (r.Min + ctxStep - 1) / ctxStep * ctxStep; r.Critical && n > floor && fits(floor) {
		p.Reason = fmt.Sprintf("VRAM pressure is critical: the window is not grown past the smallest useful one (%d, not %d); it is planned again at the next load", floor, n)
		n = floor
	}
	p.NumCtx = n
	p.KVBytes = kv(n)
	p.noteSWA(r)
	return p, nil
}

// swaUbatch is the batch the windowed cache keeps beside the window
// (llama-server's default -ub).
const swaUbatch = 512

// noteSWA says what a sliding window costs in the plan.
func (p *WindowPlan) noteSWA(r PlanRequest) {
	f := r.Facts
	if f.SlidingWindow <= 0 {
		return
	}
	p.SlidingWindow = f.SlidingWindow
	p.SWAFullBytes = p.KVBytes - int64(p.Slots)*f.KVBytesWindowed(r.CacheType, p.NumCtx, swaUbatch)
	p.Reason += fmt.Sprintf("; sliding-window attention (%d tokens, %d of %d layers): the plan counts those layers' cache whole, as llama-server keeps it with --swa-full so that a prefix longer than the window is reused, %s more than a windowed cache",
		f.SlidingWindow, f.SWALayers, f.BlockCount, mib(p.SWAFullBytes))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
