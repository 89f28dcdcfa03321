// Package pgstore is ctxd's shared store on PostgreSQL: sessions and
// their turns, and the karma record (traces, their events, the karma each
// session was shown), kept in one PostgreSQL database that several ctxd
// daemons may use at once. It behaves as package sqlite's store does (the
// contract tests of internal/storetest run on both); where several
// daemons write the same session at once, the database arbitrates: a
// session's writes lock its row, so no sequence number is written twice
// and no turn is lost.
//
// One schema serves both stores. Package sqlite's migrations are its
// description; this package's migrations repeat them version for version
// (the same numbers, the same tables and columns, recorded in the table
// ctxd_schema where SQLite keeps its user_version), and
// TestSchemaMatchesSQLite opens both stores fresh and fails when a table
// or a column of one is missing from the other or has an incompatible
// type. Where the engines differ the test names the difference: SQLite's
// full-text table (FTS5) is a tsvector table here, built from the same
// words, and ctxd_schema is PostgreSQL's alone.
//
// Times are stored as SQLite stores them (Unix seconds or nanoseconds in
// bigint columns), so both stores read back exactly what they were given.
// Text that PostgreSQL cannot hold (a NUL character, bytes that are not
// UTF-8) is stored escaped and read back as it was given (text.go).
//
// Trace text search uses PostgreSQL's full-text index (a GIN index on a
// tsvector per document), the documents' words taken as SQLite's FTS5
// takes them (indexed, text.go), so both stores find the same traces
// (TestTextSearchMatchesSQLite). A word over 2047 bytes is not indexed,
// nor the words of a document past 512 KiB of distinct ones: tsvector's
// limits.
//
// Open takes a libpq URL; the pool's size is OpenOptions.MaxConns, else
// the URL's pool_max_conns, else pgxpool's default. Trace ids come from
// identity columns: a write that fails may leave a gap in them, which
// SQLite's never has.
//
// When the server cannot be reached, or drops a connection, a request
// fails with an error of kind ctxd.KindUnavailable that names the store
// (its URL, the password never shown) and says that ctxd retries at the
// next request: the same Store carries on once the server is back.
//
// It stores what was said, not what it rendered to: rendering stays in
// package runcontext.
package pgstore
