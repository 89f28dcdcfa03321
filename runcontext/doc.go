// Package runcontext defines the RunContext: the typed, validated value
// that says what a model must see for one request, and its canonical,
// cache-stable rendering.
//
// A RunContext has seven blocks, always rendered in this order, most
// static first: identity, codex, environment, sigil, karma, state, query.
// Rendering is a pure function of the value: the same RunContext renders to
// the same bytes on every machine, and a change in one block never changes
// the bytes of the blocks before it. The state block is append-only, so the
// prompt of turn n+1 extends the prompt of turn n plus its answer.
//
// Formatters (package formatters) add Artifacts to a RunContext: texts
// such as a tool manifest or a project's conventions. Rendering, not the
// formatter, decides where each goes: a stable artifact at the end of its
// block's content, a volatile one in the query block. Each block still
// depends only on its own fields and its own artifacts.
//
// Content cannot forge structure. Every free text a block holds (persona,
// instructions, codex body, karma, summary, queries, answers, excerpts,
// artifacts) is escaped (Escape): a line that a model or a normalizing
// tokenizer could read as a block header, a turn marker or an excerpt's or
// a summary's bracket, whatever line break, indentation, invisible or
// look-alike character it uses, gets a backslash. Codex files are fenced
// (Fence) so that no line of theirs closes their fence. Package
// runcontexttest is the lenient reader the tests and fuzz targets hold
// this to.
//
// runcontext knows nothing about backends, sessions or limits: the
// orchestrator builds RunContexts and the governor keeps them in bounds.
package runcontext
