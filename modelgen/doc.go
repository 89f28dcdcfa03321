// Package modelgen writes small llama-architecture GGUF models with random
// weights and a real, trained tokenizer vocabulary.
//
// The models give tests and benchmarks real inference on a real backend
// (a real KV cache, real prompt evaluation cost) without downloading
// anything: the weights are meaningless, so the text they produce is too.
// Two vocabulary kinds are supported so tokenizer behaviour can be checked
// against the backend: SentencePiece-style ("llama") and byte-level BPE
// ("gpt2"). Both are trained deterministically from an embedded corpus of
// Go source followed by a conversation rendered with ctxd's own turn
// markers, so that, as in a real model's vocabulary, the markers of a chat
// turn are a few tokens and not a dozen.
//
// Each file records the generator's Version and a digest of its Config;
// Current and Ensure use it to rewrite a model only when it is stale.
//
// modelgen is not a training tool: nothing it writes knows anything.
package modelgen
