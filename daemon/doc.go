// Package daemon is ctxd's lifecycle and socket API, and the only package
// that wires the others together: config, store, backend (managed or
// external), tokenizer, codex, hardware probe, orchestrator.
//
// The API is HTTP over a Unix socket with versioned routes under /v1/. An
// answer streams as NDJSON, one event per line, and ends with a summary
// event. Every error is a JSON object {"error": "..."} with a status that
// fits; the daemon stays up whatever a client sends.
package daemon
