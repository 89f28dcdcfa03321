package codex

import (
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/ctxd/ctxd"
)

// Cache remembers, by content hash, what processing a file found: its token
// count (for one tokenizer) and its redactions. A reload re-reads and
// re-hashes files but re-scans and re-counts only changed ones. It is safe
// for concurrent use and saved as one file.
type Cache struct {
	path      string
	tokenizer string // counts are valid for this tokenizer only

	mu      sync.Mutex // guards entries, dirty
	entries map[cacheKey]cacheEntry
	dirty   bool
}

type cacheKey struct {
	Sum    [32]byte
	Redact bool
}

type cacheEntry struct {
	Tokens     int
	Counted    bool
	Redactions []ctxd.Redaction
}

type cacheFile struct {
	Version   int
	Tokenizer string
	Entries   map[cacheKey]cacheEntry
}

const cacheVersion = 1

// OpenCache loads the cache at path for the given tokenizer identity (for
// example the model file's digest). A missing or stale cache starts empty.
func OpenCache(path, tokenizer string) (*Cache, error) {
	c := &Cache{path: path, tokenizer: tokenizer, entries: map[cacheKey]cacheEntry{}}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("codex: cache: %w", err)
	}
	defer f.Close()
	var cf cacheFile
	if err := gob.NewDecoder(f).Decode(&cf); err != nil || cf.Version != cacheVersion || cf.Tokenizer != tokenizer {
		return c, nil // unreadable or for another tokenizer: start over
	}
	c.entries = cf.Entries
	return c, nil
}

func (c *Cache) get(sum [32]byte, redact bool) (cacheEntry, bool) {
	if c == nil {
		return cacheEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[cacheKey{sum, redact}]
	return e, ok
}

func (c *Cache) put(sum [32]byte, redact bool, e cacheEntry) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[cacheKey{sum, redact}] = e
	c.dirty = true
}

// Len is the number of cached contents.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// Save writes the cache atomically if it changed.
func (c *Cache) Save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".codex-cache-*")
	if err != nil {
		return fmt.Errorf("codex: cache: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := gob.NewEncoder(tmp).Encode(cacheFile{Version: cacheVersion, Tokenizer: c.tokenizer, Entries: c.entries}); err != nil {
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
