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
//   - Where ctxd names the slot itself (llama-server's id_slot, Options
//     LeastRecentTies), a free slot that holds another session's live
//     conversation (one used within liveFor) is taken only when every free
//     slot does: an agent's side request (a title, a memory extraction)
//     re-reads the shared prefix on another slot once rather than evict
//     the main conversation every turn. Then a slot is worth what it holds
//     of the prompt, or the saved prefix a restore would give it, less the
//     tokens of another conversation it would lose; among equals the least
//     recently used is taken. Any free slot is taken rather than none. A
//     lease says which session the slot served before (Previous), so a
//     conversation that lost its slot can say who went between its turns.
//   - A request whose context ends while it waits leaves the queue at once.
//
// The scheduler knows nothing of backends: callers report what a slot
// holds after each request (Lease.Record) and Forget everything when the
// backend restarts.
package scheduler
