// Package httpapi is ctxd's HTTP surface: the native API under /v1/, the
// OpenAI and Ollama front doors, the WebSocket sessions and the MCP
// endpoint, on the Unix socket, the optional TCP listener (a sigil's
// token on every request) and the optional metrics listener. It
// authenticates each request, resolves and narrows its sigil once, caps
// connections and bodies, names and counts requests, and drains them at
// a stop.
//
// It serves a Core (the daemon, as it stands now) and knows nothing of how
// the request path is built or started. An answer streams as NDJSON, one
// event per line, and ends with a summary event. Every error is a JSON
// object {"error": "...", "kind": "..."} with a status that fits; the
// daemon stays up whatever a client sends.
package httpapi
