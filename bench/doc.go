// Package bench is ctxd's benchmark harness: it runs the real daemon in
// front of a real, private `ollama serve` with a generated model, measures
// what the cache-stable design buys against a naive prompt order, what ctxd
// itself costs, and how cold and warm latency grow with the codex, and
// writes the results as Markdown tables, raw JSON and PNG plots (drawn with
// gonum.org/v1/plot; Report.WritePlots redraws them from a saved report).
//
// It is not a test: nothing here asserts a time. `ctxd-bench` runs it and
// `make bench` calls that.
package bench
