// Package orchestrator runs one request end to end: resolve the session
// and sigil, build the RunContext, check it against the governor's limits,
// render it, send it to the backend, stream the answer and record the turn.
//
// It owns the interfaces it needs (Backend, Tokenizer, Store, Environment)
// and knows no concrete backend; the daemon wires real ones in.
package orchestrator
