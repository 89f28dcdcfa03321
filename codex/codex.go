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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/stability"
)

// Options bound and shape what a load reads.
type Options struct {
	MaxFileBytes  int64    // a larger file is skipped and reported
	MaxTotalBytes int64    // the load fails (loads nothing) if the kept files exceed it
	Include       []string // gitignore-style patterns; if set, only matching files are loaded
	Exclude       []string // gitignore-style patterns of files and directories to leave out
	NoRedact      bool     // turn secret redaction off (it is on by default)
	// AllowSecret are gitignore-style patterns of secret files (see
	// SecretFile) the operator lets load; a codex's own settings cannot
	// add to them.
	AllowSecret []string
	// AllowHardLinks loads files with more than one link; otherwise they
	// are skipped (another link may be a file outside the codex).
	AllowHardLinks bool
	// Within are the directories the root must lie beneath (the
	// operator's codex.path and load_roots), checked on every load by
	// opening the root beneath them; empty: no such check.
	Within []AllowedDir
	// Cache keeps the stat index and what reading each content found: a
	// reload opens only files whose metadata changed. nil: every file is read.
	Cache *Cache
	// Previous is the codex this load replaces, if any: the content of its
	// files that did not change is taken from it instead of the disk.
	Previous *Codex
	// Order is the order the files render in: ctxd.OrderStability or
	// ctxd.OrderPath ("": path).
	Order string
	// EditsLast: after an edit, a stability order keeps its unchanged
	// files in place and puts the changed and new ones at its end
	// (stability.Last), for a backend that shifts cached chunks past a
	// change (llama-server's --cache-reuse); otherwise everything from
	// the first change on is arranged again (stability.Settle).
	EditsLast bool
	Progress  func(ctxd.CodexProgress)
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
	Lines      int              `json:"lines"`
	SHA256     string           `json:"sha256"` // of the file as read
	Tokens     int              `json:"tokens"` // of the content as rendered (after redaction), when Counted
	Counted    bool             `json:"counted"`
	Redactions []ctxd.Redaction `json:"redactions,omitempty"`
	// Content is the redacted content when HasContent; a file the stat
	// index proved unchanged is not read until its content is needed
	// (Codex.ReadContent, Codex.Content).
	Content    string `json:"-"`
	HasContent bool   `json:"-"`

	real string   // where it was read, below the root
	sum  [32]byte // SHA256, raw
}

// Codex is a loaded tree.
type Codex struct {
	Name    string // base name of the root; never an absolute path
	Root    string // absolute root, for reloading; never rendered
	Files   []File
	Skipped []ctxd.Skipped
	Tokens  int64 // sum of the counted files' tokens
	Counted bool  // whether every file was counted (Tokens is the exact total)
	// Read is how many files this load opened: a reload of an unchanged
	// tree opens none.
	Read int
	// Order is the order Files are in, and how this load arrived at it.
	Order    ctxd.CodexOrder
	weights  stability.Weights // how often each file changed, for the next load's order
	versions versions          // the orders of the tree's recent versions

	redact     bool
	hardLinks  bool      // files with more than one link may load
	root       *treeRoot // held open: files not in memory are read beneath it
	renderOnce sync.Once
	body       string
}

// Load reads a tree: the files below root in sorted path order, honouring
// .gitignore and .ignore files at every level and the include/exclude
// patterns, or root alone if it is a file. Files that cannot be used are
// skipped and reported; a tree over MaxTotalBytes is refused whole. A load
// whose ctx ends stops walking and reading, and returns ctx's error.
//
// Load does not count tokens (Count and CountAll do, with the model's
// tokenizer, when a decision or a prompt needs them); it takes the counts
// the cache has. With a cache, a file whose metadata matches the stat index
// is not opened: its hash, lines and redactions come from the index, its
// content from opts.Previous or, later, from the disk on demand.
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
	// A named pipe would block the load (and the daemon's codex lock)
	// until something wrote to it; a device or a socket is no codex.
	if !info.IsDir() && !info.Mode().IsRegular() {
		return nil, fmt.Errorf("codex: root %s is %s, not a directory or a regular file", root, fileKind(info.Mode()))
	}
	if reason := nameProblem(filepath.Base(abs)); !info.IsDir() && reason != "" {
		return nil, fmt.Errorf("codex: root %s: %s", quotePath(root), reason)
	}
	scanNs := time.Now().UnixNano()
	dir, only := real, ""
	if !info.IsDir() {
		dir, only = filepath.Dir(real), filepath.Base(real)
	}
	// Held open and checked against the allowed directories now, on this
	// load: a root swapped since an earlier load for a link elsewhere is
	// refused, not read.
	tree, err := openTreeRoot(dir, opts.Within, only)
	if err != nil {
		var out *OutsideError
		if errors.As(err, &out) {
			return nil, ctxd.Errorf(ctxd.KindForbidden, "codex: %w", err)
		}
		return nil, fmt.Errorf("codex: %w", err)
	}
	c := &Codex{Name: filepath.Base(abs), Root: abs, redact: !opts.NoRedact, hardLinks: opts.AllowHardLinks, root: tree}
	w, err := newWalker(ctx, tree, opts)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		if err := w.run(); err != nil {
			return nil, err
		}
	} else {
		c.Name = filepath.Base(filepath.Dir(abs))
		w.files = append(w.files, entry{rel: filepath.Base(abs), real: filepath.Base(real), size: info.Size(), stat: statOf(info)})
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
	optKey := fmt.Sprintf("redact=%t max_file_bytes=%d", !opts.NoRedact, opts.MaxFileBytes)
	index := opts.Cache.statIndexFor(real, optKey)
	next, err := c.process(ctx, kept, total, index, opts)
	if err != nil {
		return nil, err
	}
	arr, err := c.arrange(ctx, dir, opts, kept, index)
	if err != nil {
		return nil, fmt.Errorf("codex: order: %w", err)
	}
	// A reload that read nothing, lost no file and kept the order keeps
	// the index it was proven against (and its older scan time, only ever
	// more cautious).
	if proven := c.Read == 0 && len(next) == len(index.Files); !proven || !arr.sameAs(index) {
		scan := scanNs
		if proven {
			scan = index.ScanNs // only the order is new
		}
		opts.Cache.setStatIndex(statIndex{Root: real, Options: optKey, ScanNs: scan, Files: next,
			OrderKind: arr.kind, OrderSource: arr.source, Order: arr.order})
	}
	slices.SortFunc(c.Skipped, func(a, b ctxd.Skipped) int { return strings.Compare(a.Path, b.Path) })
	c.sumTokens()
	return c, nil
}

// sumTokens totals the counted files.
func (c *Codex) sumTokens() {
	c.Tokens, c.Counted = 0, true
	for _, f := range c.Files {
		if f.Counted {
			c.Tokens += int64(f.Tokens)
		} else {
			c.Counted = false
		}
	}
}

// result is one file's outcome; exactly one of file and skip is set.
type result struct {
	file *File
	skip *ctxd.Skipped
	read bool // the file was opened
	stat statEntry
}

// process reads, checks and redacts the files in parallel, keeping their
// order, except the files the stat index proves unchanged. It returns the
// new stat index.
func (c *Codex) process(ctx context.Context, entries []entry, totalBytes int64, index statIndex, opts Options) (map[string]statEntry, error) {
	prev := map[string]*File{}
	if opts.Previous != nil && opts.Previous.redact == !opts.NoRedact {
		for i := range opts.Previous.Files {
			if f := &opts.Previous.Files[i]; f.HasContent {
				prev[f.Path] = f
			}
		}
	}
	results := make([]result, len(entries))
	var (
		done, doneBytes atomic.Int64
		progressMu      sync.Mutex
	)
	err := parallel(ctx, len(entries), runtime.GOMAXPROCS(0)*2, func(i int) error {
		e := entries[i]
		r, ok := fromIndex(e, index, opts, prev[e.rel])
		if !ok {
			r = loadFile(c.root, e, opts)
		}
		results[i] = r
		d, b := done.Add(1), doneBytes.Add(e.size)
		if opts.Progress != nil {
			progressMu.Lock()
			opts.Progress(ctxd.CodexProgress{Stage: ctxd.CodexStageReading, Files: int(d), TotalFiles: len(entries), Bytes: b, TotalBytes: totalBytes})
			progressMu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("codex: load cancelled: %w", err)
	}
	files := make(map[string]statEntry, len(entries))
	for i, r := range results {
		files[entries[i].rel] = r.stat
		if r.read {
			c.Read++
		}
		if r.skip != nil {
			c.Skipped = append(c.Skipped, *r.skip)
			continue
		}
		c.Files = append(c.Files, *r.file)
	}
	return files, nil
}

// fromIndex is a file the stat index proves unchanged, without opening it:
// its metadata is what it was when it was read, and that was not within
// the timestamps' granularity of that scan.
func fromIndex(e entry, index statIndex, opts Options, prev *File) (result, bool) {
	ie, ok := index.Files[e.rel]
	if !ok || ie.Stat != e.stat || racy(ie.Stat, index.ScanNs) {
		return result{}, false
	}
	if ie.Skip != "" {
		return result{skip: &ctxd.Skipped{Path: e.rel, Reason: ie.Skip}, stat: ie}, true
	}
	ce, ok := opts.Cache.get(ie.Sum, !opts.NoRedact)
	if !ok {
		return result{}, false
	}
	f := &File{Path: e.rel, Size: e.size, Lines: ce.Lines, SHA256: hex.EncodeToString(ie.Sum[:]), Tokens: ce.Tokens, Counted: ce.Counted,
		Redactions: ce.Redactions, real: e.real, sum: ie.Sum}
	if prev != nil && prev.sum == ie.Sum {
		f.Content, f.HasContent = prev.Content, true
	}
	return result{file: f, stat: ie}, true
}

// loadFile reads one file. Problems with the file are skips.
func loadFile(root *treeRoot, e entry, opts Options) result {
	skip := func(reason string) result {
		return result{skip: &ctxd.Skipped{Path: e.rel, Reason: reason}, read: true, stat: statEntry{Stat: e.stat, Skip: reason}}
	}
	data, err := readCapped(root, e.real, opts.MaxFileBytes, opts.AllowHardLinks)
	if err != nil {
		r := skip(err.Error())
		var swapped *notRegularError
		var escaped *escapeError
		if strings.HasPrefix(err.Error(), "unreadable") || errors.As(err, &swapped) || errors.As(err, &escaped) {
			// May be transient (permissions, EIO, a file replaced since
			// the walk): read again next time.
			r.stat.Stat = fileStat{}
		}
		return r
	}
	if bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0 {
		return skip("binary content")
	}
	if !utf8.Valid(data) {
		return skip("not valid UTF-8")
	}
	sum := sha256.Sum256(data)
	file := &File{Path: e.rel, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Content: string(data), HasContent: true, real: e.real, sum: sum}
	if cached, ok := opts.Cache.get(sum, !opts.NoRedact); ok {
		file.Lines, file.Redactions, file.Tokens, file.Counted = cached.Lines, cached.Redactions, cached.Tokens, cached.Counted
		if len(cached.Redactions) > 0 {
			file.Content, _ = redact(file.Content)
		}
	} else {
		if !opts.NoRedact {
			file.Content, file.Redactions = redact(file.Content)
		}
		file.Lines = lineCount(file.Content)
		opts.Cache.put(sum, !opts.NoRedact, cacheEntry{Lines: file.Lines, Redactions: file.Redactions})
	}
	st := e.stat
	if int64(len(data)) != st.Size { // changed between the walk and the read: not proof of anything
		st = fileStat{}
	}
	return result{file: file, read: true, stat: statEntry{Stat: st, Sum: sum}}
}

// readCapped reads file path (below the root) of at most limit bytes (0:
// no limit); its errors are reasons to skip the file. It reads only a
// regular file beneath the root: one replaced since the walk by a named
// pipe, a device or a symbolic link is a *notRegularError, found without
// waiting, and one whose directories were swapped for links an
// *escapeError. A file with more than one link is refused unless
// hardLinks.
func readCapped(root *treeRoot, path string, limit int64, hardLinks bool) ([]byte, error) {
	f, links, err := openRegular(root, path)
	var swapped *notRegularError
	var escaped *escapeError
	if errors.As(err, &swapped) || errors.As(err, &escaped) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("unreadable: %v", errors.Unwrap(err))
	}
	defer f.Close()
	if links > 1 && !hardLinks {
		return nil, fmt.Errorf("has %d hard links: another of them may be a file outside the codex (the daemon's codex.allow_hard_links loads such files)", links)
	}
	// Read at most one byte past the cap: the file may have grown since the walk.
	if limit <= 0 {
		limit = 1 << 62
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("unreadable: %v", err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("over the per-file cap of %d bytes (codex max_file_bytes)", limit)
	}
	return data, nil
}

// lineCount is the number of lines of s (a last line without a newline
// counts).
func lineCount(s string) int {
	n := strings.Count(s, "\n")
	if s != "" && !strings.HasSuffix(s, "\n") {
		n++
	}
	return n
}

// ErrChanged is the error of reading a file whose content is no longer
// what the load found: the reload that follows a change reads it again.
var ErrChanged = errors.New("changed or gone since the codex was loaded")

// Content returns file i's redacted content: the one in memory, or read
// from the disk, checked against the hash the load recorded. A file that
// changed since is an error (a reload will follow its change). It does not
// modify the codex, so it is safe for concurrent use.
func (c *Codex) Content(i int) (string, error) {
	f := &c.Files[i]
	if f.HasContent {
		return f.Content, nil
	}
	data, err := readCapped(c.root, f.real, f.Size, c.hardLinks) // a file grown since cannot be the one loaded
	if err != nil || sha256.Sum256(data) != f.sum {
		return "", fmt.Errorf("codex: %s: %w", f.Path, ErrChanged)
	}
	s := string(data)
	if c.redact && len(f.Redactions) > 0 {
		s, _ = redact(s)
	}
	return s, nil
}

// ReadContent reads the content of every file not in memory (in parallel),
// for rendering the whole codex. It must run before the codex is shared.
func (c *Codex) ReadContent(ctx context.Context) error {
	var read atomic.Int64
	defer func() { c.Read += int(read.Load()) }()
	err := parallel(ctx, len(c.Files), runtime.GOMAXPROCS(0)*2, func(i int) error {
		if c.Files[i].HasContent {
			return nil
		}
		s, err := c.Content(i)
		if err != nil {
			return err
		}
		c.Files[i].Content, c.Files[i].HasContent = s, true
		read.Add(1)
		return nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("codex: load cancelled: %w", err)
	}
	return err
}

// Body is the files rendered between fences, once, on first use: the same
// tree always renders to the same bytes.
func (c *Codex) Body() string {
	c.renderOnce.Do(func() { c.body = render(c.Files) })
	return c.body
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
		body = c.Map(mapChars) + "\n" + c.Totals()
	} else {
		body = c.Body()
	}
	return runcontext.Codex{Name: c.Name, Mode: mode, Files: refs, Body: body}
}

// Map describes a codex too large to load whole: what a model sees of it,
// next to the excerpts retrieved for each question. It lists every file in
// path order if that fits in maxChars (0: no cap); otherwise every
// directory with its number of files; otherwise the directories two levels
// down, then one. The text says which it is: nothing is cut silently.
//
// The map holds nothing an edit changes (no sizes, no totals: Totals has
// those, for the end of the codex block; and path order, not the codex's,
// which an edit moves a file in), so a backend's cache of it and of what
// follows it survives edits; adding or removing a file changes it, at the
// file's line.
func (c *Codex) Map(maxChars int) string {
	head := "This codex is too large to show whole. Excerpts relevant to each question appear with the question.\n"
	var sb strings.Builder
	sb.WriteString(head)
	sb.WriteString("Files:\n")
	paths := make([]string, len(c.Files))
	for i, f := range c.Files {
		paths[i] = f.Path
	}
	slices.Sort(paths)
	var line []byte
	for _, p := range paths {
		line = strconv.AppendQuote(line[:0], p)
		sb.Write(append(line, '\n'))
		if maxChars > 0 && sb.Len() > maxChars {
			break // too long: directories instead
		}
	}
	if maxChars <= 0 || sb.Len() <= maxChars {
		return sb.String()
	}
	for _, depth := range []int{-1, 2, 1} {
		dirs := map[string]int{}
		var names []string
		for _, f := range c.Files {
			d := path.Dir(f.Path)
			if parts := strings.Split(d, "/"); depth > 0 && len(parts) > depth {
				d = strings.Join(parts[:depth], "/")
			}
			if _, ok := dirs[d]; !ok {
				names = append(names, d)
			}
			dirs[d]++
		}
		slices.Sort(names)
		sb.Reset()
		sb.WriteString(head)
		if depth < 0 {
			sb.WriteString("Directories (path, files):\n")
		} else {
			fmt.Fprintf(&sb, "Directories %d level(s) deep, with everything below them (path, files):\n", depth)
		}
		for _, n := range names {
			fmt.Fprintf(&sb, "%s %d\n", quotePath(n), dirs[n])
		}
		if sb.Len() <= maxChars || depth == 1 {
			break
		}
	}
	return sb.String()
}

// Totals is the codex's size in a line, for the end of a codex block
// whose map leaves sizes out.
func (c *Codex) Totals() string {
	var lines int64
	for _, f := range c.Files {
		lines += int64(f.Lines)
	}
	return fmt.Sprintf("The codex holds %d files, %d lines, %d bytes.\n", len(c.Files), lines, c.Bytes())
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

// DropContent forgets the content of every file (Content reads it again
// from the disk, checked against its hash): a tree retrieved from, not
// loaded whole, need not stay in memory. It must run before the codex is
// shared.
func (c *Codex) DropContent() {
	for i := range c.Files {
		c.Files[i].Content, c.Files[i].HasContent = "", false
	}
}
