// Package llamatok counts tokens exactly as the llama.cpp runner inside
// Ollama does, by loading only the vocabulary of the model's GGUF file
// through the cgo llama package of the pinned Ollama module.
//
// The pure-Go tokenizer in the Ollama module disagrees with the runner on
// SentencePiece vocabularies; this package does not, because it is the
// same code. It is not a general tokenizer library: it exists so that ctxd
// knows, before sending, how many tokens a prompt is and which of them the
// backend already holds in its KV cache.
package llamatok
