// Package scheduler owns the backend's slots: which request runs on which
// slot, who waits and in which order, and which prompt tokens each slot
// holds in its KV cache.
//
// The rules:
//   - A session runs one request at a time; its requests are served in the
//     order they arrived (turn n+1 must extend turn n's prompt and answer).
//   - Requests wait for a slot first come, first served. Since a session has
//     at most one request in that queue, this is round-robin across
//     sessions: every waiting session is served before any session is
//     served twice, and none starves.
//   - Cache affinity decides where, never who: the request at the head of
//     the queue takes the free slot holding the longest prefix of its
//     prompt (the lowest-numbered on a tie, which is also how Ollama's
//     runner picks among its own slots). The stable blocks (identity,
//     codex, environment, sigil, karma) are shared by every session, so any
//     slot already holds most of any prompt; waiting for a busy "own" slot
//     would save only a session's conversation and could delay everyone.
//   - A request whose context ends while it waits leaves the queue at once.
//
// The scheduler knows nothing of backends: callers report what a slot
// holds after each request (Lease.Record) and Forget everything when the
// backend restarts.
package scheduler
