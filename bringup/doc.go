// Package bringup brings a model server up for ctxd: it starts a managed
// Ollama or llama.cpp llama-server (or reaches an external one), reads the
// model's facts, plans the context window against the memory there is,
// loads the model, opens its tokenizer and chooses the prompt format. What
// it returns, a Model, is what the request path runs on.
//
// It is not the request path (package engine) nor the daemon's lifecycle
// (package daemon): it runs once per start, and again after a failed start.
package bringup
