// Package cache tracks what the backend holds in its KV cache: the token
// sequence of the last prompt each backend slot evaluated, and where a new
// prompt diverges from what came before.
//
// ctxd uses it to say, before sending, how many prompt tokens the backend
// will reuse, and when a prefix breaks, which block broke it. It stores no
// KV data itself.
package cache
