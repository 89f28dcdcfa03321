package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/codex"
)

// Index is the codex's full-text index for retrieval (SQLite FTS5, ranked
// by BM25). It indexes words only: the table is contentless, and a hit's
// text is cut from the codex's own file (chunked again, which is
// deterministic), so the index stays a third of the tree's size and a
// file's text is stored once, in the file. A file's chunks have the rowids
// fileID<<chunkBits + i, so a file's chunks are deleted as one rowid range.
// A reload re-indexes only files whose content changed.
type Index struct {
	db *sql.DB

	cur     atomic.Pointer[indexed] // the codex searches cut hits' text from
	pending *indexed                // synced, not yet published (loads are serialized)
}

// indexed is the codex an index holds, and its files by id.
type indexed struct {
	codex *codex.Codex
	files map[int64]indexedFile
}

type indexedFile struct {
	path, sha256 string
	i            int // in codex.Files
}

var _ ctxd.Retriever = (*Index)(nil)

// chunkBits is how many low bits of a chunk's rowid number the chunk in
// its file: up to a million chunks a file (a 1 MiB file of one-line
// declarations has fewer).
const chunkBits = 20

// hashSize is how much FTS5 gathers in memory before it writes a segment
// (its default is 1 MiB): fewer, larger segments to merge when a whole
// tree is indexed.
const hashSize = 64 << 20

// bulk is how many files make a sync a bulk load: automatic merging of
// segments waits until the end of it (one merge then, not many during).
const bulk = 1000

// indexVersion is the layout; an index of another layout is rebuilt.
const indexVersion = 2

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
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: index %s: %w", path, err)
	}
	if version != indexVersion {
		if _, err := db.ExecContext(ctx, (fmt.Sprintf(`
			DROP TABLE IF EXISTS indexed_files;
			DROP TABLE IF EXISTS chunks;
			DROP TABLE IF EXISTS files;
			DROP TABLE IF EXISTS fts;
			CREATE TABLE files (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, sha256 TEXT NOT NULL);
			CREATE VIRTUAL TABLE fts USING fts5(text, content='', contentless_delete=1, tokenize='unicode61');
			INSERT INTO fts (fts, rank) VALUES ('hashsize', %d);
			PRAGMA user_version = %d;`, hashSize, indexVersion))); err != nil {
			db.Close()
			return nil, fmt.Errorf("sqlite: index %s: %w", path, err)
		}
	}
	return &Index{db: db}, nil
}

// Close closes the index.
func (x *Index) Close() error { return x.db.Close() }

// Sync makes the index hold exactly the files of c: files that changed or
// appeared are (re-)chunked and indexed, files that went away are removed,
// all in one transaction. It returns how many files it re-indexed. Files
// are chunked in parallel; SQLite's inserts run on one connection.
// Searches go on cutting hits from the codex before until Publish.
// progress, if not nil, is told how many of the files to index are done.
func (x *Index) Sync(ctx context.Context, c *codex.Codex, progress func(done, total int)) (int, error) {
	x.pending = nil
	return x.sync(ctx, c, progress)
}

// Publish makes searches cut their hits from the codex the last Sync
// indexed. It must not be modified after.
func (x *Index) Publish() {
	if x.pending != nil {
		x.cur.Store(x.pending)
		x.pending = nil
	}
}

func (x *Index) sync(ctx context.Context, c *codex.Codex, progress func(done, total int)) (int, error) {
	type row struct {
		id     int64
		sha256 string
	}
	have := map[string]row{}
	rows, err := x.db.QueryContext(ctx, "SELECT id, path, sha256 FROM files")
	if err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	var maxID int64
	for rows.Next() {
		var r row
		var p string
		if err := rows.Scan(&r.id, &p, &r.sha256); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
		have[p] = r
		maxID = max(maxID, r.id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	tx, err := x.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	defer tx.Rollback()
	next := &indexed{codex: c, files: make(map[int64]indexedFile, len(c.Files))}
	deleteRange := func(id int64) error {
		_, err := tx.ExecContext(ctx, "DELETE FROM fts WHERE rowid >= ? AND rowid < ?", id<<chunkBits, (id+1)<<chunkBits)
		return err
	}
	// What changed: new ids for new or changed files (a changed file's
	// chunks go with its old id).
	var jobs []job
	keep := map[string]bool{}
	for i, f := range c.Files {
		keep[f.Path] = true
		r, ok := have[f.Path]
		if ok && r.sha256 == f.SHA256 {
			next.files[r.id] = indexedFile{path: f.Path, sha256: f.SHA256, i: i}
			continue
		}
		if ok {
			if err := deleteRange(r.id); err != nil {
				return 0, fmt.Errorf("sqlite: index: %w", err)
			}
			if _, err := tx.ExecContext(ctx, "DELETE FROM files WHERE id = ?", r.id); err != nil {
				return 0, fmt.Errorf("sqlite: index: %w", err)
			}
		}
		maxID++
		jobs = append(jobs, job{i: i, id: maxID})
		next.files[maxID] = indexedFile{path: f.Path, sha256: f.SHA256, i: i}
	}
	for p, r := range have {
		if keep[p] {
			continue
		}
		if err := deleteRange(r.id); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM files WHERE id = ?", r.id); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
	}
	if len(jobs) >= bulk {
		if _, err := tx.ExecContext(ctx, "INSERT INTO fts (fts, rank) VALUES ('automerge', 0)"); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
	}
	if err := x.insert(ctx, tx, c, jobs, progress); err != nil {
		return 0, err
	}
	if len(jobs) >= bulk {
		if _, err := tx.ExecContext(ctx, "INSERT INTO fts (fts, rank) VALUES ('automerge', 4)"); err != nil {
			return 0, fmt.Errorf("sqlite: index: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("sqlite: index: %w", err)
	}
	x.pending = next
	return len(jobs), nil
}

// job is a file to index: its place in the codex and its new id.
type job struct {
	i  int
	id int64
}

// insert chunks the files of jobs in parallel and inserts them in order.
func (x *Index) insert(ctx context.Context, tx *sql.Tx, c *codex.Codex, jobs []job, progress func(done, total int)) error {
	if len(jobs) == 0 {
		return nil
	}
	insFile, err := tx.PrepareContext(ctx, "INSERT INTO files (id, path, sha256) VALUES (?, ?, ?)")
	if err != nil {
		return fmt.Errorf("sqlite: index: %w", err)
	}
	defer insFile.Close()
	insChunk, err := tx.PrepareContext(ctx, "INSERT INTO fts (rowid, text) VALUES (?, ?)")
	if err != nil {
		return fmt.Errorf("sqlite: index: %w", err)
	}
	defer insChunk.Close()
	type chunked struct {
		chunks []codex.Chunk
		err    error
	}
	ctx, cancel := context.WithCancel(ctx)
	out := make([]chan chunked, len(jobs))
	for i := range out {
		out[i] = make(chan chunked, 1)
	}
	var wg sync.WaitGroup
	// The chunkers stop on cancel (an early return leaves them blocked on
	// ahead otherwise), then are waited for.
	defer func() { cancel(); wg.Wait() }()
	var nextJob atomic.Int64
	// Chunkers run at most a bounded distance ahead of the inserter.
	ahead := make(chan struct{}, 256)
	for range max(1, runtime.GOMAXPROCS(0)-1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case ahead <- struct{}{}:
				case <-ctx.Done():
					return
				}
				j := int(nextJob.Add(1) - 1)
				if j >= len(jobs) {
					return
				}
				f := c.Files[jobs[j].i]
				text, err := c.Content(jobs[j].i)
				if err == nil {
					f.Content = text
					out[j] <- chunked{chunks: codex.ChunkFile(f)}
				} else {
					out[j] <- chunked{err: err}
				}
			}
		}()
	}
	for j, jb := range jobs {
		var ch chunked
		select {
		case ch = <-out[j]:
		case <-ctx.Done():
			return fmt.Errorf("sqlite: index: %w", ctx.Err())
		}
		<-ahead
		if ch.err != nil {
			return fmt.Errorf("sqlite: index: %w", ch.err)
		}
		f := c.Files[jb.i]
		if len(ch.chunks) >= 1<<chunkBits {
			return fmt.Errorf("sqlite: index: %s has %d chunks, over %d", f.Path, len(ch.chunks), 1<<chunkBits)
		}
		if _, err := insFile.ExecContext(ctx, jb.id, f.Path, f.SHA256); err != nil {
			return fmt.Errorf("sqlite: index: %w", err)
		}
		for k, chunk := range ch.chunks {
			if _, err := insChunk.ExecContext(ctx, jb.id<<chunkBits+int64(k), chunk.Text); err != nil {
				return fmt.Errorf("sqlite: index: %w", err)
			}
		}
		if progress != nil && (j%100 == 99 || j == len(jobs)-1) {
			progress(j+1, len(jobs))
		}
	}
	return nil
}

// Hit is one chunk a search found.
type Hit struct {
	Path  string
	Codex *codex.Codex // the codex it was cut from (the one published when it was found)
	File  int          // index in Codex.Files
	Chunk codex.Chunk
	Score float64 // BM25, higher is better
}

// Search returns the k chunks that best match query (BM25), as excerpts.
// Only words of the query are searched: FTS5 syntax in it has no effect.
func (x *Index) Search(ctx context.Context, query string, k int) ([]ctxd.Excerpt, error) {
	hits, err := x.Hits(ctx, query, k)
	if err != nil {
		return nil, err
	}
	out := make([]ctxd.Excerpt, len(hits))
	for i, h := range hits {
		out[i] = h.Excerpt()
	}
	return out, nil
}

// Excerpt is the hit as the RunContext shows it.
func (h Hit) Excerpt() ctxd.Excerpt {
	return ctxd.Excerpt{Path: h.Path, Lines: fmt.Sprintf("%d-%d", h.Chunk.Start, h.Chunk.End), Text: h.Chunk.Text}
}

// Hits returns the k best chunks for query with their scores, best first.
func (x *Index) Hits(ctx context.Context, query string, k int) ([]Hit, error) {
	match := matchExpr(query)
	cur := x.cur.Load()
	if match == "" || cur == nil || k <= 0 {
		return nil, nil
	}
	rows, err := x.db.QueryContext(ctx,
		"SELECT rowid, bm25(fts) FROM fts WHERE fts MATCH ? ORDER BY bm25(fts), rowid LIMIT ?", match, k)
	if err != nil {
		return nil, fmt.Errorf("sqlite: search: %w", err)
	}
	type found struct {
		rowid int64
		score float64
	}
	var fs []found
	for rows.Next() {
		var f found
		if err := rows.Scan(&f.rowid, &f.score); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlite: search: %w", err)
		}
		fs = append(fs, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: search: %w", err)
	}
	chunks := map[int64][]codex.Chunk{}
	var out []Hit
	for _, f := range fs {
		id, n := f.rowid>>chunkBits, int(f.rowid&(1<<chunkBits-1))
		file, ok := cur.files[id]
		if !ok {
			continue // indexed by a sync whose codex is not current yet
		}
		cs, ok := chunks[id]
		if !ok {
			cf := cur.codex.Files[file.i]
			text, err := cur.codex.Content(file.i)
			if err != nil {
				// Changed or gone since the load: its hits are left out
				// until the reload that follows the change.
				chunks[id] = nil
				continue
			}
			cf.Content = text
			cs = codex.ChunkFile(cf)
			chunks[id] = cs
		}
		if cs == nil {
			continue
		}
		if n >= len(cs) {
			return nil, fmt.Errorf("sqlite: search: %s has %d chunks, the index %d or more", file.path, len(cs), n+1)
		}
		out = append(out, Hit{Path: file.path, Codex: cur.codex, File: file.i, Chunk: cs[n], Score: -f.score})
	}
	return out, nil
}

// stopwords are words of questions that say nothing about where the
// answer is; searching them would rank nearly every chunk.
var stopwords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`a an and are as at be been but by can could did do does for from had has have how
		i if in into is it its me my no not of on or our should so than that the their them then there these they this
		those to was we were what when where which while who why will with would you your about after all also any
		because before between both each few more most other over same some such through under until up very`) {
		stopwords[w] = true
	}
}

// matchExpr is the FTS5 query for the words of query but stopwords: any
// of them. A query of stopwords only searches them.
func matchExpr(query string) string {
	q := matchTerms(query, true)
	if q == "" {
		q = matchTerms(query, false)
	}
	return q
}

func matchTerms(query string, skipStop bool) string {
	terms := strings.FieldsFunc(query, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' })
	quoted := make([]string, 0, len(terms))
	seen := map[string]bool{}
	for _, t := range terms {
		t = strings.ToLower(t)
		if len(t) < 2 || seen[t] || skipStop && stopwords[t] {
			continue
		}
		seen[t] = true
		quoted = append(quoted, `"`+t+`"`)
	}
	return strings.Join(quoted, " OR ")
}
