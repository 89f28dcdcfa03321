// Package hostenv reads the hardware situation ctxd runs in (GPU memory
// from NVML, host memory, power source, connectivity) and reduces it to the
// coarse bands of the RunContext environment block.
//
// Bands change with hysteresis, so a reading that wobbles around a boundary
// does not flip the environment block (and break the cached prompt prefix)
// on every request. Raw numbers never reach the prompt; they are reported
// through Reading for budgets and status pages.
package hostenv
