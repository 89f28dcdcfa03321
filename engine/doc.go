// Package engine assembles ctxd's request path on a backend that is up:
// the scheduler of the backend's slots, the orchestrator that serves each
// request, and the codex service that keeps the codex loaded, planned and
// watched. The daemon builds one per start; the HTTP surface serves it.
//
// It knows no transport (package httpapi) and no lifecycle (package
// daemon): New builds it, Close tears it down.
package engine
