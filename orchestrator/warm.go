package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd/scheduler"
)

// SlotStore saves a backend slot's KV cache to a named file and restores
// it into a slot (llama-server's /slots actions). Each returns the tokens
// saved or restored.
type SlotStore interface {
	SaveSlot(ctx context.Context, slot int, name string) (int, error)
	RestoreSlot(ctx context.Context, slot int, name string) (int, error)
}

// WarmConfig turns warm restarts on: the first slot that evaluates a
// stable prefix is saved, and a slot that lacks the prefix later (after a
// backend or daemon restart, or a reassignment) gets it restored instead of
// evaluated.
type WarmConfig struct {
	Store    SlotStore
	Dir      string        // where the backend writes the files, if ctxd can see it ("" otherwise: no listing, no pruning)
	Model    string        // names the model; part of every fingerprint
	MaxBytes int64         // files beyond this total are pruned, oldest first; 0: 2 GiB
	MaxAge   time.Duration // older files are pruned; 0: 7 days
}

// warmer tracks which prefixes have a saved slot.
type warmer struct {
	cfg WarmConfig
	log *slog.Logger

	mu    sync.Mutex     // guards saved, last and lastFP
	saved map[string]int // fingerprint → tokens of the saved prefix
	// last is the prefix fingerprinted last, and lastFP its fingerprint:
	// requests over one codex share their stable prefix, and comparing it
	// costs a fraction of hashing it again.
	last   []int
	lastFP string
}

const warmPrefix, warmSuffix = "ctxd-", ".bin"

func newWarmer(cfg WarmConfig, log *slog.Logger) *warmer {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 2 << 30
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 7 * 24 * time.Hour
	}
	w := &warmer{cfg: cfg, log: log, saved: map[string]int{}}
	// Files of earlier runs: a daemon restart starts warm. Their prefix
	// length is not known until one is restored; -1 marks them.
	if cfg.Dir != "" {
		entries, _ := os.ReadDir(cfg.Dir)
		for _, e := range entries {
			if fp, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), warmPrefix), warmSuffix); ok && strings.HasPrefix(e.Name(), warmPrefix) {
				w.saved[fp] = -1
			}
		}
	}
	return w
}

// fingerprint names a stable prefix of one model: the SHA-256 of the
// model's name, a zero byte and the prefix's ids (32-bit, little-endian).
func (w *warmer) fingerprint(prefix []int) string {
	w.mu.Lock()
	if w.lastFP != "" && slices.Equal(w.last, prefix) {
		fp := w.lastFP
		w.mu.Unlock()
		return fp
	}
	w.mu.Unlock()
	b := make([]byte, 0, len(w.cfg.Model)+1+4*len(prefix))
	b = append(append(b, w.cfg.Model...), 0)
	for _, id := range prefix {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	sum := sha256.Sum256(b)
	fp := hex.EncodeToString(sum[:12])
	w.mu.Lock()
	w.last, w.lastFP = slices.Clone(prefix), fp
	w.mu.Unlock()
	return fp
}

// restorable is how many tokens a restore of the prefix would give.
func (w *warmer) restorable(fp string, prefix int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.saved[fp]; ok {
		return prefix
	}
	return 0
}

// restore loads the saved prefix into the lease's slot. It reports
// whether the slot now holds it; a failed restore leaves the slot empty.
func (w *warmer) restore(ctx context.Context, lease *scheduler.Lease, fp string, prefix []int) bool {
	n, err := w.cfg.Store.RestoreSlot(ctx, lease.Slot, warmPrefix+fp+warmSuffix)
	if err != nil || n < len(prefix) {
		w.log.Warn("warm restore failed; the prefix is evaluated instead", "slot", lease.Slot, "fingerprint", fp, "restored", n, "err", err)
		w.mu.Lock()
		delete(w.saved, fp)
		w.mu.Unlock()
		lease.Record(nil)
		return false
	}
	w.log.Info("prefix restored from a saved slot", "slot", lease.Slot, "fingerprint", fp, "tokens", n)
	lease.Record(prefix)
	lease.Prefix(fp)
	return true
}

// save saves the lease's slot (which holds the prefix) unless the prefix
// is saved already.
func (w *warmer) save(ctx context.Context, lease *scheduler.Lease, fp string, prefix int) {
	w.mu.Lock()
	_, done := w.saved[fp]
	w.mu.Unlock()
	lease.Prefix(fp)
	if done {
		return
	}
	n, err := w.cfg.Store.SaveSlot(ctx, lease.Slot, warmPrefix+fp+warmSuffix)
	if err != nil || n < prefix {
		w.log.Warn("slot not saved; warm restarts will evaluate this prefix", "slot", lease.Slot, "fingerprint", fp, "saved", n, "err", err)
		return
	}
	w.mu.Lock()
	w.saved[fp] = prefix
	w.mu.Unlock()
	w.log.Info("slot saved for warm restarts", "slot", lease.Slot, "fingerprint", fp, "tokens", n)
	w.prune(fp)
}

// prune deletes saved slots beyond the age and size bounds, oldest first,
// never keep's.
func (w *warmer) prune(keep string) {
	if w.cfg.Dir == "" {
		return
	}
	type file struct {
		name string
		size int64
		mod  time.Time
	}
	var files []file
	_ = filepath.WalkDir(w.cfg.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasPrefix(d.Name(), warmPrefix) || !strings.HasSuffix(d.Name(), warmSuffix) {
			return nil
		}
		if info, err := d.Info(); err == nil {
			files = append(files, file{d.Name(), info.Size(), info.ModTime()})
		}
		return nil
	})
	slices.SortFunc(files, func(a, b file) int { return b.mod.Compare(a.mod) }) // newest first
	var total int64
	for _, f := range files {
		total += f.size
		if f.name == warmPrefix+keep+warmSuffix || total <= w.cfg.MaxBytes && time.Since(f.mod) <= w.cfg.MaxAge {
			continue
		}
		if err := os.Remove(filepath.Join(w.cfg.Dir, f.name)); err == nil {
			fp := strings.TrimSuffix(strings.TrimPrefix(f.name, warmPrefix), warmSuffix)
			w.mu.Lock()
			delete(w.saved, fp)
			w.mu.Unlock()
			w.log.Info("pruned a saved slot", "file", f.name, "bytes", f.size)
		}
	}
}
