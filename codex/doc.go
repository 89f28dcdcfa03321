// Package codex loads a directory tree (a codebase or a document tree) as
// the codex block of a RunContext and renders it once, deterministically.
//
// Files are read in sorted path order and rendered between fences that the
// content cannot close, so the same tree always renders to the same bytes.
// Files that cannot be used (binary, too large, unreadable, not UTF-8) are
// skipped and reported, never dropped silently.
//
// This is the foundation loader: the files directly inside one directory.
// It is not a retrieval index; RAG builds on it.
package codex
