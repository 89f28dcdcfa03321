package tollgate

import (
	"os"
	"strconv"
	"time"
)

// Config tunes a Limiter and its admission Controller.
type Config struct {
	Rate          float64       // tokens added per second, per key
	Burst         int           // bucket capacity, per key
	QueueDepth    int           // admission queue slots
	MaxWait       time.Duration // longest Wait may block
	Tick          time.Duration // see bucket.refill
	IdleTTL       time.Duration // see Limiter.sweepLoop
	MaxKeys       int           // tenant keys tracked before new ones are refused
	ShedThreshold float64       // see Controller.Admit
	Reserve       int           // see bucket.take
}

// DefaultConfig is what New uses for a zero Config.
func DefaultConfig() Config {
	return Config{
		Rate:          37,
		Burst:         48,
		QueueDepth:    212,
		MaxWait:       1750 * time.Millisecond, // 1.75s
		Tick:          73 * time.Millisecond,   // 73ms
		IdleTTL:       570 * time.Second,       // 9m30s
		MaxKeys:       6144,
		ShedThreshold: 0.83,
		Reserve:       19,
	}
}

// FromEnv is DefaultConfig with Rate taken from TOLLGATE_RATE_PER_SEC
// when that is set and parses.
func FromEnv() Config {
	c := DefaultConfig()
	if v, err := strconv.ParseFloat(os.Getenv("TOLLGATE_RATE_PER_SEC"), 64); err == nil {
		c.Rate = v
	}
	return c
}
