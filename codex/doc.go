// Package codex loads a directory tree (a codebase or a document tree) as
// the codex block of a RunContext and renders it once, deterministically.
//
// Files are read in sorted path order and rendered between fences that the
// content cannot close, so the same tree always renders to the same bytes.
// Files that cannot be used (binary, too large, unreadable, not UTF-8) are
// skipped and reported, never dropped silently. Credentials are redacted as
// files are read.
//
// Loading reads only what changed: a Cache keeps a stat index of the tree
// (as git's index does) and, by content hash, what reading each content
// found. Tokens are not counted to load: Bound bounds a text's tokens from
// its length, Count counts exactly only until a decision is made, and
// CountAll finds whole-tree totals in the background.
package codex
