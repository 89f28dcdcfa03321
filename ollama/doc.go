// Package ollama is ctxd's backend adapter for Ollama: a client built on
// github.com/ollama/ollama/api that renders nothing itself (ctxd sends the
// finished prompt with raw mode), and a supervisor that runs a private
// `ollama serve` for the managed mode.
//
// Every option that forces Ollama to reload a model (num_ctx, num_batch,
// num_thread, num_gpu) is fixed in LoadOptions when the Client is made and
// sent identically on every request, so the runner, and its KV cache, stay
// loaded.
package ollama
