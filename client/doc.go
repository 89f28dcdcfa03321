// Package client talks to a running ctxd: the Go counterpart of its native
// API (docs/api.md), with one method per route, over the Unix socket (New)
// or the TCP listener (NewTCP, with a sigil's token: WithToken). `ctxd ask`,
// `ctxd mcp` and the tests use it; the examples show each route.
//
// It links the standard library and the domain package only (and the
// WebSocket library for Connect), so an agent written in Go pulls in none
// of the daemon's cgo or SQLite.
package client
