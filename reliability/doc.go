// Package reliability measures what a running ctxd does when it is killed,
// loaded and flooded with connections, and writes the figures into
// docs/reliability.md. It holds tests only: each drives the real daemon,
// built from cmd/ctxd and run as a separate process, against a real
// `ollama serve` over a generated model.
//
//   - Crash safety (TestCrash): kill -9 the daemon at random points while
//     agents ask and judge karma; after every restart nothing acknowledged
//     is missing and the SQLite store passes PRAGMA integrity_check.
//   - Load (TestLoad): many concurrent agents through the Unix socket;
//     failures classified, the daemon's peak RSS and goroutines, and how
//     fair the queue is to each agent.
//   - Connections (TestConnections): agents' time to first token and
//     errors without and with a flood of idle and slow-body connections.
//
// `go test ./reliability` runs a small version of each that asserts the
// correctness properties only (speed is never asserted). The full figures
// come from `make reliability`, or one at a time:
//
//	go test ./reliability -run TestCrash -timeout 60m -args -full -write ../docs/reliability.md
//
// Like the integration tests, they skip without the Ollama binary
// (bin/ollama, or CTXD_OLLAMA_BIN) unless CTXD_REQUIRE_OLLAMA is set.
//
// It is not a benchmark of ctxd's speed (docs/benchmarks.md is) nor a test
// of single behaviours (the daemon and integration packages are).
package reliability
