// Package runcontexttest reads a rendered prompt as a lenient reader
// would, a model or a tokenizer that normalizes its input: the oracle that
// ctxd's tests and fuzz targets hold rendering to, so that no content can
// forge a block header, a turn, an excerpt or a codex fence.
//
// It is written apart from package runcontext's escaping, and imports
// nothing of ctxd, so that a mistake in one is not repeated in the other.
// It is for tests only.
//
// How it reads:
//
//   - A line ends at every character that a tokenizer, a template engine
//     or a model may take for a line break: \n, \r, \r\n, \v, \f, the
//     information separators \x1c \x1d \x1e (Python's str.splitlines),
//     NEL (U+0085), LINE SEPARATOR (U+2028) and PARAGRAPH SEPARATOR
//     (U+2029).
//   - A line reads as its characters folded to ASCII where their NFKC form
//     is one ASCII character (＃ reads #, ～ reads ~, ｅ reads e) or where
//     they are Unicode tag characters (U+E0020-E007E, which some models
//     read as the ASCII they shadow), with invisible characters (format
//     characters such as zero-width spaces, BOMs and bidi controls, and
//     combining marks) dropped wherever they are, and white space and
//     control characters dropped at its start.
//   - A line whose reading starts with "###" is a block header or a turn
//     marker; one whose reading starts with "[excerpt", "[/excerpt",
//     "[summary" or "[/summary" (in any case) opens or closes an excerpt
//     or a summary. A line that holds an explicit bidi control (U+202A-
//     U+202E, U+2066-U+2069) is also read as it displays: what precedes
//     the first control, then the rest reversed.
//   - A codex file opens with a line of n >= 3 tildes, " file ", a quoted
//     path and optionally " lines A-B"; it closes at the first line whose
//     reading starts with n or more tildes, at any indentation, which
//     must be the n tildes alone.
package runcontexttest
