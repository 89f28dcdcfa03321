// Package orchestrator runs one request end to end: resolve the session
// and sigil, build the RunContext, check it against the governor's limits,
// render it, send it to the backend, stream the answer and record the turn.
//
// It owns the interfaces it needs (Backend, Tokenizer, Store, Environment)
// and knows no concrete backend; the daemon wires real ones in.
//
// Where each job lives:
//
//   - orchestrator.go: Orchestrator, its exported API and ask, the request's
//     steps in order.
//   - session.go, history.go: sessions, every session store call and the
//     sessions held in memory; following a client's history.
//   - store.go: storeDeadline, the bound on each store call and the errors
//     of one that fails.
//   - govern.go, tally.go: preparation, one request's prompt and the
//     governor's steps that make it fit, counted incrementally.
//   - answer.go: answering, one request's backend slot, answer, summary
//     and record.
//   - karma.go: karmaBook, the karma block's choice, pruning and traces.
//   - prompts.go: lastPrompts, what each session sent last.
//   - stable.go: the stable blocks, built in one place.
//   - warm.go: warmer, saved slots for warm restarts.
package orchestrator
