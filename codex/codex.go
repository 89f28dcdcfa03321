package codex

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ctxd/ctxd/runcontext"
)

// Options bound what a load reads.
type Options struct {
	MaxFileBytes  int64    // a larger file is skipped and reported
	MaxTotalBytes int64    // the load fails if the kept files exceed it
	Exclude       []string // path.Match patterns of relative paths to leave out
}

// DefaultOptions are sane caps for a source directory.
func DefaultOptions() Options {
	return Options{MaxFileBytes: 256 << 10, MaxTotalBytes: 8 << 20}
}

// File is one loaded file.
type File struct {
	Path    string // slash-separated, relative to the root
	Size    int64
	SHA256  string
	Content string
}

// Skipped is a file that was not loaded, and why.
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Codex is a loaded, rendered tree.
type Codex struct {
	Name    string // base name of the root; never an absolute path
	Files   []File
	Skipped []Skipped
	Body    string // rendered once at load
}

// Load reads the regular files directly inside root (or root itself, if it
// is a file) in sorted order.
func Load(root string, opts Options) (*Codex, error) {
	if err := ValidatePatterns(opts.Exclude); err != nil {
		return nil, err
	}
	info, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("codex: %w", err)
	}
	c := &Codex{Name: filepath.Base(abs)}
	if !info.IsDir() {
		c.Name = filepath.Base(filepath.Dir(abs))
		c.add(filepath.Dir(abs), filepath.Base(abs), opts)
	} else {
		entries, err := os.ReadDir(root)
		if err != nil {
			return nil, fmt.Errorf("codex: read %s: %w", root, err)
		}
		for _, e := range entries { // ReadDir sorts by name
			name := e.Name()
			switch {
			case strings.HasPrefix(name, "."):
				continue // hidden files and .git are not part of a codex
			case e.IsDir():
				continue
			case e.Type()&fs.ModeSymlink != 0:
				c.Skipped = append(c.Skipped, Skipped{name, "symbolic link"})
				continue
			case !e.Type().IsRegular():
				c.Skipped = append(c.Skipped, Skipped{name, "not a regular file"})
				continue
			}
			if pat := excluded(name, opts.Exclude); pat != "" {
				c.Skipped = append(c.Skipped, Skipped{name, "excluded by pattern " + strconv.Quote(pat)})
				continue
			}
			c.add(abs, name, opts)
		}
	}
	var total int64
	for _, f := range c.Files {
		total += f.Size
	}
	if opts.MaxTotalBytes > 0 && total > opts.MaxTotalBytes {
		return nil, fmt.Errorf("codex: %s holds %d bytes of text, more than the cap of %d", root, total, opts.MaxTotalBytes)
	}
	c.Body = render(c.Files)
	return c, nil
}

// excluded returns the first pattern that matches rel, or "".
func excluded(rel string, patterns []string) string {
	for _, p := range patterns {
		if ok, _ := path.Match(p, rel); ok {
			return p
		}
	}
	return ""
}

// ValidatePatterns checks exclude patterns are well-formed.
func ValidatePatterns(patterns []string) error {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("codex: exclude pattern %q: %w", p, err)
		}
	}
	return nil
}

// add loads one file or records why it was skipped.
func (c *Codex) add(dir, name string, opts Options) {
	skip := func(reason string) { c.Skipped = append(c.Skipped, Skipped{name, reason}) }
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		skip(fmt.Sprintf("unreadable: %v", errors.Unwrap(err)))
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		skip(fmt.Sprintf("unreadable: %v", err))
		return
	}
	if opts.MaxFileBytes > 0 && info.Size() > opts.MaxFileBytes {
		skip(fmt.Sprintf("%d bytes, over the per-file cap of %d", info.Size(), opts.MaxFileBytes))
		return
	}
	data, err := io.ReadAll(f)
	if err != nil {
		skip(fmt.Sprintf("unreadable: %v", err))
		return
	}
	if bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0 {
		skip("binary content")
		return
	}
	if !utf8.Valid(data) {
		skip("not valid UTF-8")
		return
	}
	sum := sha256.Sum256(data)
	c.Files = append(c.Files, File{Path: name, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Content: string(data)})
}

// render writes each file between fences longer than any run of the fence
// character that starts a line of the content, so no file can close its own
// block or open another.
func render(files []File) string {
	var sb strings.Builder
	for _, f := range files {
		fence := strings.Repeat("~", max(3, longestLeadingRun(f.Content, '~')+1))
		sb.WriteString(fence)
		sb.WriteString(" file ")
		sb.WriteString(strconv.Quote(f.Path))
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

// Block is the codex as a RunContext block in the given mode.
func (c *Codex) Block(mode string) runcontext.Codex {
	if c == nil || len(c.Files) == 0 {
		return runcontext.Codex{Mode: runcontext.ModeNone}
	}
	refs := make([]runcontext.CodexRef, len(c.Files))
	for i, f := range c.Files {
		refs[i] = runcontext.CodexRef{Path: f.Path, Bytes: f.Size, SHA256: f.SHA256}
	}
	slices.SortFunc(refs, func(a, b runcontext.CodexRef) int { return strings.Compare(a.Path, b.Path) })
	return runcontext.Codex{Name: c.Name, Mode: mode, Files: refs, Body: c.Body}
}

// Bytes is the total size of the loaded files.
func (c *Codex) Bytes() int64 {
	var n int64
	for _, f := range c.Files {
		n += f.Size
	}
	return n
}
