// Package frontdoor opens the doors local agents already know: an
// OpenAI-compatible API (/v1/chat/completions, /v1/completions,
// /v1/models) and an Ollama-compatible one (/api/chat, /api/generate,
// /api/tags, /api/show, /api/version, /api/ps). Pointing an agent's base
// URL at ctxd is the one setting it needs.
//
// A door translates. The client's system messages end the sigil block,
// after the identity, codex and environment that every request shares (a
// side request with a system text of its own re-evaluates only what
// follows them), its earlier messages are
// the session's state, its last user message the query; ctxd renders the
// rest of the RunContext in cache order, exactly as for its native API.
// Clients resend their whole history with every request: a request whose
// history is what an answered conversation said joins that conversation's
// session (see conversations), and the session follows the history (see
// ctxd.AskRequest.History), so a conversation that only grows keeps
// extending one cached prefix, and one the client edits starts a new epoch
// instead of being answered from a history it no longer has.
//
// Agents wait on streams: a stream's headers leave as soon as the request
// is accepted, keep-alives follow while the prompt is read, and text
// streams as it comes even when tools are offered (a tool call is held
// until it is whole; see streamer and toolSniffer). Usage counts the
// client's own part of the prompt (see clientPrompt).
//
// What a door cannot honour it says: options that would reload the model
// or change the plan (num_ctx, temperature, ...) are never forwarded and
// are listed as ignored, in a response header and, on the Ollama door, in
// the final message; a prompt over the window is refused in the door's own
// error shape, never truncated; every error has the shape the door's
// clients parse (OpenAI's error object, Ollama's {"error": ...}).
package frontdoor
