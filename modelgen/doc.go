// Package modelgen writes small llama-architecture GGUF models with random
// weights and a real, trained tokenizer vocabulary.
//
// The models give tests and benchmarks real inference on a real backend
// (a real KV cache, real prompt evaluation cost) without downloading
// anything: the weights are meaningless, so the text they produce is too.
// Two vocabulary kinds are supported so tokenizer behaviour can be checked
// against the backend: SentencePiece-style ("llama") and byte-level BPE
// ("gpt2"). Both are trained deterministically from an embedded corpus.
//
// modelgen is not a training tool: nothing it writes knows anything.
package modelgen
