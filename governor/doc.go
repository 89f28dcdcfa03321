// Package governor is the CTC governor: it keeps every request inside hard
// limits (characters, context window, the answer reserve) before it reaches
// the backend, and says exactly what it measured.
//
// It never cuts a prompt. A request that does not fit fails with a
// *LimitError that gives the numbers, block by block.
package governor
