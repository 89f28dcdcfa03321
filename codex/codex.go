package codex

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
)

// Options bound and shape what a load reads.
type Options struct {
	MaxFileBytes  int64    // a larger file is skipped and reported
	MaxTotalBytes int64    // the load fails (loads nothing) if the kept files exceed it
	Include       []string // gitignore-style patterns; if set, only matching files are loaded
	Exclude       []string // gitignore-style patterns of files and directories to leave out
	NoRedact      bool     // turn secret redaction off (it is on by default)
	Counter       Counter  // counts tokens with the serving model's tokenizer; nil: no counts
	Cache         *Cache   // reuses counts and redactions of unchanged content; nil: none
	Progress      func(ctxd.CodexProgress)
}

// Counter counts the tokens of a text. It must be safe for concurrent use.
type Counter interface {
	CountText(text string) (int, error)
}

// DefaultOptions are sane caps for a source tree.
func DefaultOptions() Options {
	return Options{MaxFileBytes: 1 << 20, MaxTotalBytes: 512 << 20}
}

// File is one loaded file.
type File struct {
	Path       string           `json:"path"` // slash-separated, relative to the root
	Size       int64            `json:"bytes"`
	SHA256     string           `json:"sha256"` // of the file as read
	Tokens     int              `json:"tokens"` // of the content as rendered (after redaction)
	Redactions []ctxd.Redaction `json:"redactions,omitempty"`
	Content    string           `json:"-"` // redacted content
}

// Codex is a loaded tree.
type Codex struct {
	Name    string // base name of the root; never an absolute path
	Root    string // absolute root, for reloading; never rendered
	Files   []File
	Skipped []ctxd.Skipped
	Tokens  int64 // sum of the files' tokens
	Counted bool  // whether Tokens were counted

	renderOnce sync.Once
	body       string
}

// Load reads a tree: the files below root in sorted path order, honouring
// .gitignore and .ignore files at every level and the include/exclude
// patterns, or root alone if it is a file. Files that cannot be used are
// skipped and reported; a tree over MaxTotalBytes is refused whole. A load
// whose ctx ends stops walking and reading, and returns ctx's error.
func Load(ctx context.Context, root string, opts Options) (*Codex, error) {
	if err := ValidatePatterns(opts.Include); err != nil {
		return nil, err
	}
	if err := ValidatePatterns(opts.Exclude); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	info, err := os.Stat(real)
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	c := &Codex{Name: filepath.Base(abs), Root: abs}
	w, err := newWalker(ctx, real, opts)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		if err := w.walk(real, "", nil); err != nil {
			return nil, err
		}
	} else {
		c.Name = filepath.Base(filepath.Dir(abs))
		w.root = filepath.Dir(real)
		w.files = append(w.files, entry{rel: filepath.Base(abs), abs: real, size: info.Size()})
	}
	c.Skipped = w.skipped
	// The walk lists a directory's entries by name, so "a/b.go" comes
	// before "a.go"; the codex is in path order ('.' sorts before '/').
	slices.SortFunc(w.files, func(a, b entry) int { return strings.Compare(a.rel, b.rel) })
	var kept []entry
	var total int64
	for _, e := range w.files {
		if opts.MaxFileBytes > 0 && e.size > opts.MaxFileBytes {
			c.Skipped = append(c.Skipped, ctxd.Skipped{Path: e.rel, Reason: fmt.Sprintf("%d bytes, over the per-file cap of %d (codex max_file_bytes)", e.size, opts.MaxFileBytes)})
			continue
		}
		kept = append(kept, e)
		total += e.size
	}
	if opts.MaxTotalBytes > 0 && total > opts.MaxTotalBytes {
		return nil, fmt.Errorf("codex: %s holds %d bytes in %d files, over the cap of %d (codex max_total_bytes); nothing was loaded", root, total, len(kept), opts.MaxTotalBytes)
	}
	if err := c.process(ctx, kept, total, opts); err != nil {
		return nil, err
	}
	slices.SortFunc(c.Skipped, func(a, b ctxd.Skipped) int { return strings.Compare(a.Path, b.Path) })
	return c, nil
}

// result is one file's outcome; exactly one of file and skip is set.
type result struct {
	file *File
	skip *ctxd.Skipped
}

// process reads, checks, redacts and counts the files in parallel, keeping
// their order.
func (c *Codex) process(ctx context.Context, entries []entry, totalBytes int64, opts Options) error {
	results := make([]result, len(entries))
	var (
		next         atomic.Int64
		done, tokens atomic.Int64
		doneBytes    atomic.Int64
		firstErr     error
		errOnce      sync.Once
		wg           sync.WaitGroup
		progressMu   sync.Mutex
	)
	workers := min(runtime.GOMAXPROCS(0)*2, max(1, len(entries)))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(entries) {
					return
				}
				if err := ctx.Err(); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("codex: load cancelled: %w", err) })
					return
				}
				r, err := loadFile(entries[i], opts)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				results[i] = r
				d := done.Add(1)
				b := doneBytes.Add(entries[i].size)
				if r.file != nil {
					tokens.Add(int64(r.file.Tokens))
				}
				if opts.Progress != nil {
					progressMu.Lock()
					opts.Progress(ctxd.CodexProgress{Files: int(d), TotalFiles: len(entries), Bytes: b, TotalBytes: totalBytes, Tokens: tokens.Load()})
					progressMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	for _, r := range results {
		if r.skip != nil {
			c.Skipped = append(c.Skipped, *r.skip)
			continue
		}
		c.Files = append(c.Files, *r.file)
		c.Tokens += int64(r.file.Tokens)
	}
	c.Counted = opts.Counter != nil
	return nil
}

// loadFile reads one file. Problems with the file are skips; only a
// failing tokenizer is an error.
func loadFile(e entry, opts Options) (result, error) {
	skip := func(reason string) (result, error) {
		return result{skip: &ctxd.Skipped{Path: e.rel, Reason: reason}}, nil
	}
	f, err := os.Open(e.abs)
	if err != nil {
		return skip(fmt.Sprintf("unreadable: %v", errors.Unwrap(err)))
	}
	defer f.Close()
	// Read at most one byte past the cap: the file may have grown since the walk.
	limit := opts.MaxFileBytes
	if limit <= 0 {
		limit = 1 << 62
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return skip(fmt.Sprintf("unreadable: %v", err))
	}
	if int64(len(data)) > limit {
		return skip(fmt.Sprintf("over the per-file cap of %d bytes (codex max_file_bytes)", limit))
	}
	if bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0 {
		return skip("binary content")
	}
	if !utf8.Valid(data) {
		return skip("not valid UTF-8")
	}
	sum := sha256.Sum256(data)
	file := &File{Path: e.rel, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Content: string(data)}
	cached, ok := opts.Cache.get(sum, !opts.NoRedact)
	if ok {
		file.Redactions = cached.Redactions
		file.Tokens = cached.Tokens
		if len(cached.Redactions) > 0 {
			file.Content, _ = redact(file.Content)
		}
		if opts.Counter == nil || cached.Counted {
			return result{file: file}, nil
		}
	} else if !opts.NoRedact {
		file.Content, file.Redactions = redact(file.Content)
	}
	if opts.Counter != nil {
		n, err := opts.Counter.CountText(file.Content)
		if err != nil {
			return result{}, ctxd.Errorf(ctxd.KindInternal, "codex: count tokens of %s: %w", e.rel, err)
		}
		file.Tokens = n
	}
	opts.Cache.put(sum, !opts.NoRedact, cacheEntry{Tokens: file.Tokens, Counted: opts.Counter != nil, Redactions: file.Redactions})
	return result{file: file}, nil
}

// Body is the files rendered between fences, once, on first use: the same
// tree always renders to the same bytes.
func (c *Codex) Body() string {
	c.renderOnce.Do(func() { c.body = render(c.Files) })
	return c.body
}

// render writes each file between fences longer than any run of the fence
// character that starts a line of the content, so no file can close its own
// block or open another. The path is quoted, so no path can either.
func render(files []File) string {
	n := 0
	for _, f := range files {
		n += len(f.Content) + len(f.Path) + 32
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, f := range files {
		fence := strings.Repeat("~", max(3, longestLeadingRun(f.Content, '~')+1))
		sb.WriteString(fence)
		sb.WriteString(" file ")
		sb.WriteString(quotePath(f.Path))
		sb.WriteString("\n")
		sb.WriteString(f.Content)
		if !strings.HasSuffix(f.Content, "\n") {
			sb.WriteString("\n")
		}
		sb.WriteString(fence)
		sb.WriteString("\n")
	}
	return sb.String()
}

func longestLeadingRun(s string, c byte) int {
	// Most files have no line starting with the fence character at all.
	if !strings.HasPrefix(s, string(c)) && !strings.Contains(s, "\n"+string(c)) {
		return 0
	}
	best := 0
	for line := range strings.Lines(s) {
		n := 0
		for n < len(line) && line[n] == c {
			n++
		}
		best = max(best, n)
	}
	return best
}

// Block is the codex as a RunContext block: the whole tree (CAG) or its map
// (RAG), the map in at most mapChars characters.
func (c *Codex) Block(mode string) runcontext.Codex {
	return c.BlockWithMap(mode, 0)
}

// BlockWithMap is Block with a cap on the map's size (0: none).
func (c *Codex) BlockWithMap(mode string, mapChars int) runcontext.Codex {
	if c == nil || len(c.Files) == 0 {
		return runcontext.Codex{Mode: runcontext.ModeNone}
	}
	refs := make([]runcontext.CodexRef, len(c.Files))
	for i, f := range c.Files {
		refs[i] = runcontext.CodexRef{Path: f.Path, Bytes: f.Size, SHA256: f.SHA256}
	}
	var body string
	if mode == runcontext.ModeRAG {
		body = c.Map(mapChars)
	} else {
		body = c.Body()
	}
	return runcontext.Codex{Name: c.Name, Mode: mode, Files: refs, Body: body}
}

// Map describes a codex too large to load whole: what a model sees of it,
// next to the excerpts retrieved for each question. It lists every file
// with its tokens if that fits in maxChars (0: no cap); otherwise every
// directory with its file count and tokens; otherwise the directories two
// levels down, then one. The text says which it is: nothing is cut silently.
func (c *Codex) Map(maxChars int) string {
	head := fmt.Sprintf("This codex is too large to show whole: %d files, %d tokens. Excerpts relevant to each question appear with the question.\n", len(c.Files), c.Tokens)
	var sb strings.Builder
	sb.WriteString(head)
	sb.WriteString("Files (path, tokens):\n")
	for _, f := range c.Files {
		fmt.Fprintf(&sb, "%s %d\n", quotePath(f.Path), f.Tokens)
	}
	if maxChars <= 0 || sb.Len() <= maxChars {
		return sb.String()
	}
	for _, depth := range []int{-1, 2, 1} {
		type dir struct {
			files  int
			tokens int64
		}
		dirs := map[string]*dir{}
		var names []string
		for _, f := range c.Files {
			d := path.Dir(f.Path)
			if parts := strings.Split(d, "/"); depth > 0 && len(parts) > depth {
				d = strings.Join(parts[:depth], "/")
			}
			if dirs[d] == nil {
				dirs[d] = &dir{}
				names = append(names, d)
			}
			dirs[d].files++
			dirs[d].tokens += int64(f.Tokens)
		}
		slices.Sort(names)
		sb.Reset()
		sb.WriteString(head)
		if depth < 0 {
			sb.WriteString("Directories (path, files, tokens):\n")
		} else {
			fmt.Fprintf(&sb, "Directories %d level(s) deep, with everything below them (path, files, tokens):\n", depth)
		}
		for _, n := range names {
			fmt.Fprintf(&sb, "%s %d %d\n", quotePath(n), dirs[n].files, dirs[n].tokens)
		}
		if sb.Len() <= maxChars || depth == 1 {
			break
		}
	}
	return sb.String()
}

// Bytes is the total size of the loaded files.
func (c *Codex) Bytes() int64 {
	var n int64
	for _, f := range c.Files {
		n += f.Size
	}
	return n
}

// Redactions counts the credentials replaced in all files.
func (c *Codex) Redactions() int {
	n := 0
	for _, f := range c.Files {
		n += len(f.Redactions)
	}
	return n
}

// ValidatePatterns checks include/exclude patterns are well-formed.
func ValidatePatterns(patterns []string) error {
	for _, p := range patterns {
		if strings.TrimSpace(p) == "" {
			return fmt.Errorf("codex: empty pattern")
		}
		if _, err := filepath.Match(strings.ReplaceAll(strings.TrimPrefix(p, "!"), "**", "*"), ""); err != nil {
			return fmt.Errorf("codex: pattern %q: %w", p, err)
		}
	}
	return nil
}
