// Package llamacpp is the adapter for llama.cpp's llama-server: a client
// of its native API (/completion streamed with token-id prompts and a
// chosen slot, /props, /slots with save, restore and erase, /tokenize,
// /apply-template, /health) that implements ctxd.Backend, and a supervised
// llama-server process for ctxd's managed mode.
//
// It does not render prompts or choose slots: the orchestrator and the
// scheduler do. llama-server reports how many prompt tokens it reused
// (cache_n); the adapter passes that on, so ctxd's expectation and the
// server's measurement stand side by side.
package llamacpp
