package codex

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
)

// Cache remembers what loading a tree found, so a reload need not find it
// again. It holds two things, saved together as one file:
//
//   - by content hash and redaction rules: what processing a file's
//     content found (its lines, redactions and, once counted, its tokens
//     for one tokenizer). Entries found with other rules (an upgrade of
//     package secrets) are never used, and dropped on saving, so new
//     rules read every file again;
//   - the stat index of the last tree loaded: each file's path, size,
//     modification and change times (nanoseconds), inode and device, and
//     the hash of the content they described, as git's index does. A file
//     whose metadata is unchanged is not opened again. It keeps the order
//     the files were rendered in, too.
//
// Content entries no file of the stat index references are pruned when the
// cache is saved. It is safe for concurrent use.
type Cache struct {
	path      string
	tokenizer string // counts are valid for this tokenizer only

	mu      sync.Mutex // guards everything below
	entries map[cacheKey]cacheEntry
	index   statIndex
	dirty   bool
}

// cacheKey is a content and how it was read: Rules is the version of
// the redaction rules it was redacted with, "" if it was not.
type cacheKey struct {
	Sum   [32]byte
	Rules string
}

// keyFor is the key of a content read with or without redaction, by the
// rules of this build.
func keyFor(sum [32]byte, redact bool) cacheKey {
	if redact {
		return cacheKey{sum, redactRules}
	}
	return cacheKey{Sum: sum}
}

type cacheEntry struct {
	Lines      int
	Tokens     int
	Counted    bool
	Redactions []ctxd.Redaction
}

// fileStat is the metadata that, unchanged, means unchanged content.
type fileStat struct {
	Size             int64
	MtimeNs, CtimeNs int64
	Ino, Dev         uint64
}

// statEntry is one file of the stat index: its metadata when it was read,
// and what reading found: the content's hash, or why it was skipped.
type statEntry struct {
	Stat fileStat
	Sum  [32]byte
	Skip string // non-empty: the file was skipped for this reason
}

// statIndex is the stat index of one tree, loaded with one set of options.
type statIndex struct {
	Root    string // the tree's resolved root
	Options string // what changes the outcome of reading a file (redaction, caps)
	ScanNs  int64  // when the scan that wrote it began
	Files   map[string]statEntry
	// The order the files were in (OrderKind, as Options.Order), and
	// where it came from: a restart keeps the order the backend's saved
	// caches hold.
	OrderKind, OrderSource string
	Order                  []string
}

type cacheFile struct {
	Tokenizer string
	Entries   map[cacheKey]cacheEntry
	Index     statIndex
}

// OpenCache loads the cache at path for the given tokenizer identity (for
// example the model file's digest). A missing, unreadable or stale cache
// starts empty.
func OpenCache(path, tokenizer string) (*Cache, error) {
	c := &Cache{path: path, tokenizer: tokenizer, entries: map[cacheKey]cacheEntry{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("codex: cache: %w", err)
	}
	var cf cacheFile
	if err := cf.decode(data); err != nil || cf.Tokenizer != tokenizer {
		return c, nil // unreadable or for another tokenizer: start over
	}
	c.entries, c.index = cf.Entries, cf.Index
	return c, nil
}

func (c *Cache) get(sum [32]byte, redact bool) (cacheEntry, bool) {
	if c == nil {
		return cacheEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[keyFor(sum, redact)]
	return e, ok
}

func (c *Cache) put(sum [32]byte, redact bool, e cacheEntry) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[keyFor(sum, redact)] = e
	c.dirty = true
}

// setTokens records a content's exact token count, if the cache still
// holds the content (a count finishing after its entry was pruned must not
// leave an entry without lines and redactions).
func (c *Cache) setTokens(sum [32]byte, redact bool, tokens int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := keyFor(sum, redact)
	e, ok := c.entries[k]
	if !ok {
		return
	}
	e.Tokens, e.Counted = tokens, true
	c.entries[k] = e
	c.dirty = true
}

// statIndexFor returns the stat index if it describes root read with the
// same options; otherwise an empty one.
func (c *Cache) statIndexFor(root, options string) statIndex {
	if c == nil {
		return statIndex{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.index.Root != root || c.index.Options != options {
		return statIndex{}
	}
	return c.index
}

// setStatIndex replaces the stat index.
func (c *Cache) setStatIndex(x statIndex) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index = x
	c.dirty = true
}

// Len is the number of cached contents.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Save writes the cache atomically if it changed, after pruning the
// content entries that no file of the stat index references.
func (c *Cache) Save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	c.prune()
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".codex-cache-*")
	if err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	cf := cacheFile{Tokenizer: c.tokenizer, Entries: c.entries, Index: c.index}
	if _, err := tmp.Write(cf.encode()); err != nil {
		tmp.Close()
		return fmt.Errorf("codex: cache: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), c.path); err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	c.dirty = false
	return nil
}

// prune drops content entries redacted with other rules than this
// build's, and those no file of the stat index references (with no stat
// index, nothing loaded yet, none of these). The caller holds c.mu.
func (c *Cache) prune() {
	for k := range c.entries {
		if k.Rules != "" && k.Rules != redactRules {
			delete(c.entries, k)
		}
	}
	if c.index.Files == nil {
		return
	}
	live := make(map[[32]byte]bool, len(c.index.Files))
	for _, e := range c.index.Files {
		if e.Skip == "" {
			live[e.Sum] = true
		}
	}
	for k := range c.entries {
		if !live[k.Sum] {
			delete(c.entries, k)
		}
	}
}

// racyGuard is how close to a scan's start a file's modification may be
// for its metadata to prove nothing: a file changed again within the
// timestamp's granularity keeps the same times. Times with a zero
// nanosecond part come from a file system that keeps seconds (or two, on
// FAT); finer ones from the kernel's coarse clock, a few milliseconds.
func racyGuard(st fileStat) time.Duration {
	if st.MtimeNs%1e9 == 0 {
		return 2 * time.Second
	}
	return 20 * time.Millisecond
}

// racy reports whether an index entry written by the scan that began at
// scanNs must be read again whatever its metadata says ("racily clean"):
// its content may have changed again after it was read, within the same
// timestamp. As in git, the modification time decides; the change time
// only has to match.
func racy(st fileStat, scanNs int64) bool {
	return st.MtimeNs >= scanNs-racyGuard(st).Nanoseconds()
}
