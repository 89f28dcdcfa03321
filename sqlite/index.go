package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
)

// Index is the codex's full-text index for retrieval (SQLite FTS5, ranked
// by BM25). It is rebuilt file by file: a reload re-indexes only files
// whose content changed.
type Index struct {
	db *sql.DB
}

var _ ctxd.Retriever = (*Index)(nil)

// OpenIndex opens (creating if needed) the index at path.
func OpenIndex(ctx context.Context, path string) (*Index, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sqlite: index: %w", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("sqlite: index: %w", err)
	}
	// WAL: searches read on their own connections while a reindex writes
	// (loads are serialized by the codex service, so there is one writer).
	db.SetMaxOpenConns(4)
	if _, err := db.ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS indexed_files (path TEXT PRIMARY KEY, sha256 TEXT NOT NULL);
		CREATE VIRTUAL TABLE IF NOT EXISTS chunks USING fts5(
			path UNINDEXED, start UNINDEXED, end UNINDEXED, text, tokenize = 'unicode61');`); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: index %s: %w", path, err)
	}
	return &Index{db: db}, nil
}

// Close closes the index.
func (x *Index) Close() error { return x.db.Close() }

// Sync makes the index hold exactly the files of c: files that changed or
// appeared are (re-)chunked and indexed, files that went away are removed.
// It returns how many files it re-indexed.
func (x *Index) Sync(ctx context.Context, c *codex.Codex) (int, error) {
	have := map[string]string{}
	rows, err := x.db.QueryContext(ctx, "SELECT path, sha256 FROM indexed_files")
	if err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	for rows.Next() {
		var p, sum string
		if err := rows.Scan(&p, &sum); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
		have[p] = sum
	}
	rows.Close()
	tx, err := x.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	defer tx.Rollback()
	changed := 0
	keep := map[string]bool{}
	for _, f := range c.Files {
		keep[f.Path] = true
		if have[f.Path] == f.SHA256 {
			continue
		}
		changed++
		if _, err := tx.ExecContext(ctx, "DELETE FROM chunks WHERE path = ?", f.Path); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
		for _, ch := range codex.ChunkFile(f) {
			if _, err := tx.ExecContext(ctx, "INSERT INTO chunks (path, start, end, text) VALUES (?, ?, ?, ?)", ch.Path, ch.Start, ch.End, ch.Text); err != nil {
				return 0, fmt.Errorf("sqlite: index: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO indexed_files (path, sha256) VALUES (?, ?) ON CONFLICT (path) DO UPDATE SET sha256 = excluded.sha256", f.Path, f.SHA256); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
	}
	for p := range have {
		if keep[p] {
			continue
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM chunks WHERE path = ?", p); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM indexed_files WHERE path = ?", p); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	return changed, nil
}

// Search returns the k chunks that best match query (BM25), as excerpts.
// Only words of the query are searched: FTS5 syntax in it has no effect.
func (x *Index) Search(ctx context.Context, query string, k int) ([]ctxd.Excerpt, error) {
	terms := strings.FieldsFunc(query, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' })
	if len(terms) == 0 {
		return nil, nil
	}
	quoted := make([]string, 0, len(terms))
	seen := map[string]bool{}
	for _, t := range terms {
		t = strings.ToLower(t)
		if len(t) < 2 || seen[t] {
			continue
		}
		seen[t] = true
		quoted = append(quoted, `"`+t+`"`)
	}
	if len(quoted) == 0 {
		return nil, nil
	}
	rows, err := x.db.QueryContext(ctx,
		"SELECT path, start, end, text FROM chunks WHERE chunks MATCH ? ORDER BY bm25(chunks), path, start LIMIT ?",
		strings.Join(quoted, " OR "), k)
	if err != nil {
		return nil, fmt.Errorf("sqlite: search: %w", err)
	}
	defer rows.Close()
	var out []ctxd.Excerpt
	for rows.Next() {
		var e ctxd.Excerpt
		var start, end int
		if err := rows.Scan(&e.Path, &start, &end, &e.Text); err != nil {
			return nil, fmt.Errorf("sqlite: search: %w", err)
		}
		e.Lines = fmt.Sprintf("%d-%d", start, end)
		out = append(out, e)
	}
	return out, rows.Err()
}
