package codex

import (
	"context"
	"sync"
	"sync/atomic"
)

// parallel calls fn for every i in [0, n) on up to workers goroutines (1 or
// fewer: on the calling goroutine, whose thread the caller may have set
// up), in no set order. It stops at fn's first error, or when ctx ends,
// and returns that error or ctx's.
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	var (
		next    atomic.Int64
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			err := ctx.Err()
			if err == nil {
				err = fn(i)
			}
			if err != nil {
				errOnce.Do(func() { first = err })
				next.Store(int64(n)) // the others stop at their next item
				return
			}
		}
	}
	if workers <= 1 {
		work()
		return first
	}
	for range min(workers, max(1, n)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work()
		}()
	}
	wg.Wait()
	return first
}
