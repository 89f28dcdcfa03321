// Package bench is ctxd's benchmark harness: it runs the real daemon in
// front of a real, private `ollama serve` with a generated model, measures
// what the cache-stable design buys against a naive prompt order, what ctxd
// itself costs, and how cold and warm latency grow with the codex, and
// writes the results as a Markdown table, raw JSON and a PNG plot.
//
// It is not a test: nothing here asserts a time. `ctxd bench` runs it and
// `make bench` calls that.
package bench
