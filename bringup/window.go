package bringup

import (
	"log/slog"
	"os"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/llamacpp"
)

// planWindow reads the model's facts and the memory there is, and chooses
// num_ctx for this load. A window that cannot fit is a configuration
// error: the daemon stops with the numbers.
func (c Config) planWindow(facts Facts) (governor.ModelFacts, governor.WindowPlan, error) {
	mf, err := governor.FactsFromModelInfo(facts.Info)
	if err != nil {
		return mf, governor.WindowPlan{}, err
	}
	if info, err := os.Stat(facts.GGUFPath); err == nil {
		mf.WeightsBytes = info.Size()
	}
	reading := c.Memory.Read()
	cacheType, _ := governor.ParseCacheType(c.Limits.KVCacheType) // validated with the config
	if cacheType != governor.CacheF16 && reading.GPUs == 0 {
		c.Logger.Warn("a quantized KV cache needs flash attention, which Ollama enables on GPUs only; budgeting f16", "configured", cacheType)
		cacheType = governor.CacheF16
	}
	b := c.Backend
	plan, err := governor.PlanWindow(governor.PlanRequest{
		Facts: mf, CacheType: cacheType, Slots: b.Slots,
		Memory: governor.Memory{Source: reading.Source, Total: reading.TotalBytes, Free: reading.FreeBytes},
		// A managed llama-server's prompt cache is memory like the headroom.
		Headroom:  int64(c.Limits.MemoryHeadroomMB+b.CacheRAMMB) << 20,
		Requested: b.NumCtx, Max: b.MaxNumCtx, Min: 2*c.Limits.AnswerReserve + 256,
		Critical: c.Critical(),
	})
	if err != nil {
		return mf, plan, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.num_ctx: %w", err)
	}
	// Until the model is loaded, VRAM pressure counts the planned window.
	c.Memory.SetPlan(uint64(max(0, plan.WeightsBytes+plan.KVBytes)), false)
	c.Logger.Info("window planned", "num_ctx", plan.NumCtx, "slots", plan.Slots, "kv_cache", plan.CacheType, "kv_bytes", plan.KVBytes,
		"weights_bytes", plan.WeightsBytes, "headroom_bytes", plan.HeadroomBytes, "memory_source", reading.Source, "free_bytes", reading.FreeBytes, "reason", plan.Reason)
	return mf, plan, nil
}

// Plan is the window a managed llama-server of this configuration gets,
// and the memory it holds then (weights, KV windows, host prompt cache),
// planned without starting anything.
func (c Config) Plan() (governor.WindowPlan, int64, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Critical == nil {
		c.Critical = func() bool { return false }
	}
	facts, err := ggufFacts(c.Backend.GGUF)
	if err != nil {
		return governor.WindowPlan{}, 0, err
	}
	_, plan, err := c.planWindow(facts)
	return plan, PlannedBytes(plan, VocabSize(facts.Info), c.Backend.CacheRAMMB), err
}

// VocabSize is the vocabulary's size a model file's metadata gives (0:
// unknown).
func VocabSize(info map[string]any) int {
	n, _ := info[llamacpp.VocabSizeKey].(float64)
	return int(n)
}

// PlannedBytes is what a llama-server load planned as plan holds: its
// weights, its KV windows, the host prompt cache of cacheRAMMB, and the
// server's own memory beside them (ServerBytes).
func PlannedBytes(plan governor.WindowPlan, vocab, cacheRAMMB int) int64 {
	return max(0, plan.WeightsBytes) + max(0, plan.KVBytes) + int64(max(0, cacheRAMMB))<<20 + ServerBytes(vocab)
}

// ServerBytes estimates what a llama-server holds besides its weights and
// KV cache: its compute buffers, its vocabulary's tables and the program.
// Measured here (docs/benchmarks.md, the personas phase) at 49 to 57 MiB
// for a 49,152-token vocabulary and about 105 MiB for a 262,144-token one,
// full windows evaluated on the CPU; the estimate is above both. It is a
// first figure only: the daemon raises a persona's plan to what its server
// is seen to hold.
func ServerBytes(vocab int) int64 {
	return 48<<20 + 320*int64(max(0, vocab))
}
