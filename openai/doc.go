// Package openai is ctxd's backend for model servers that speak the
// OpenAI completions API: POST /v1/completions and GET /v1/models (vLLM,
// SGLang, llama-server's OpenAI routes, Ollama's /v1, LM Studio, and the
// prefix-aware routers in front of a cluster of them).
//
// ctxd renders the whole prompt itself, in the model's template, and sends
// it as a text completion (as token ids where the server takes them), so
// the bytes it keeps stable are the bytes the engine caches and a
// prefix-aware router sees. Each request carries its session's routing key
// in the headers and body fields the engines route by (Routing). What the
// server reused is read from usage.prompt_tokens_details.cached_tokens
// where it reports it.
//
// A request is sent again only when it cannot have reached a model: the
// connection was refused, or the server answered 429 or 503 before any of
// the answer. Once the server accepted a request nothing is resent.
package openai
