// Package formatters is the registry of context formatters (ADR-21 §5):
// artifact injectors, which add a text to one block of every RunContext
// (a tool manifest, a project's conventions, a memory summary, a style
// guide), and prompt formats, which turn a RunContext into the text a
// model reads. An extension registers its own in Go, in a package of its
// own, without editing the core: formatters/toolmanifest and
// formatters/conventions are two such packages, and formatters/standard
// registers them.
//
// An injector says what to add, to which block, and whether it is stable;
// it does not say where or in which order. Order and cache stability stay
// runcontext's business: a stable artifact joins the end of its block
// (identity to karma), inside the cached prefix, so it must change only
// when what it is derived from changes; a volatile one joins the query
// block, the tail, and never moves a byte of the prefix. See
// runcontext.Artifact.
//
// formatters does not build RunContexts, read the codex or decide whether
// an injector's error fails a request: the orchestrator calls Apply and
// decides.
package formatters
