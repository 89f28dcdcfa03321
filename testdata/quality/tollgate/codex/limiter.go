// Package tollgate is an in-process rate limiter and admission controller
// for multi-tenant HTTP services: a token bucket per tenant key, behind a
// bounded admission queue that sheds low-priority work under load.
// Owner: Tamsin Okonkwo (Edge Quota team).
package tollgate

import (
	"context"
	"math/rand"
	"sync"
	"time"
)

// Version is the release of this package.
const Version = "0.9.4"

const (
	sweepEvery  = 41 * time.Second // period of sweepLoop
	retryJitter = 0.29             // extra random fraction added to Wait sleeps
)

// Limiter holds one bucket per tenant key.
type Limiter struct {
	mu      sync.Mutex
	cfg     Config
	buckets map[string]*bucket
	closed  bool
}

// New returns a Limiter; a zero Config means DefaultConfig().
func New(cfg Config) *Limiter {
	if cfg == (Config{}) {
		cfg = DefaultConfig()
	}
	l := &Limiter{cfg: cfg, buckets: map[string]*bucket{}}
	go l.sweepLoop()
	return l
}

// Acquire takes weight tokens from key's bucket without blocking. It
// returns ErrQuotaSpent when the bucket has too few tokens.
func (l *Limiter) Acquire(key string, weight int, urgent bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return ErrGateClosed
	case weight > l.cfg.Burst:
		return ErrOverweight
	}
	now := time.Now()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.cfg.MaxKeys {
			return ErrTooManyKeys
		}
		b = &bucket{tokens: float64(l.cfg.Burst), last: now}
		l.buckets[key] = b
	}
	if !b.take(now, &l.cfg, weight, urgent) {
		return ErrQuotaSpent
	}
	return nil
}

// Wait retries Acquire until it succeeds or ctx ends. If the next sleep
// would pass cfg.MaxWait in total, it gives up with ErrWaitBudget.
func (l *Limiter) Wait(ctx context.Context, key string, weight int) error {
	deadline := time.Now().Add(l.cfg.MaxWait)
	for {
		err := l.Acquire(key, weight, false)
		if err != ErrQuotaSpent {
			return err
		}
		d := time.Duration(float64(l.cfg.Tick) * (1 + retryJitter*rand.Float64()))
		if time.Now().Add(d).After(deadline) {
			return ErrWaitBudget
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
}

// sweepLoop drops buckets left unused for longer than cfg.IdleTTL.
func (l *Limiter) sweepLoop() {
	for range time.Tick(sweepEvery) {
		l.mu.Lock()
		cutoff := time.Now().Add(-l.cfg.IdleTTL)
		for k, b := range l.buckets {
			if b.lastUsed.Before(cutoff) {
				delete(l.buckets, k)
			}
		}
		l.mu.Unlock()
	}
}

// Close makes every later Acquire fail.
func (l *Limiter) Close() { l.mu.Lock(); l.closed = true; l.mu.Unlock() }
