package tollgate

import "time"

// bucket is one tenant's token bucket, refilled lazily once per elapsed
// cfg.Tick at cfg.Rate tokens per second, capped at cfg.Burst.
type bucket struct {
	tokens   float64
	last     time.Time // last refill
	lastUsed time.Time // read by Limiter.sweepLoop
}

func (b *bucket) refill(now time.Time, cfg *Config) {
	ticks := now.Sub(b.last) / cfg.Tick
	if ticks <= 0 {
		return
	}
	b.tokens += float64(ticks) * cfg.Tick.Seconds() * cfg.Rate
	if max := float64(cfg.Burst); b.tokens > max {
		b.tokens = max
	}
	b.last = b.last.Add(ticks * cfg.Tick)
}

// take removes weight tokens if it can. The last cfg.Reserve tokens of
// the bucket are held back for urgent requests only.
func (b *bucket) take(now time.Time, cfg *Config, weight int, urgent bool) bool {
	b.refill(now, cfg)
	b.lastUsed = now
	floor := float64(cfg.Reserve)
	if urgent {
		floor = 0
	}
	if b.tokens-float64(weight) < floor {
		return false
	}
	b.tokens -= float64(weight)
	return true
}
