// Package integration holds ctxd's end-to-end tests and benchmarks: the
// real daemon on a real Unix socket in front of a real `ollama serve` (the
// pinned build from bin/), with models that modelgen writes.
package integration
