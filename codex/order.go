package codex

import (
	"context"
	"crypto/sha256"
	"maps"
	"slices"
	"strings"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/stability"
)

// arranged is the order a load put its files in, for the stat index.
type arranged struct {
	kind, source string
	order        []string
}

// arrange puts c.Files (in path order) in the order opts.Order asks for.
//
// Stability order is made anew only at a codex epoch: when no order of
// this kind is known for the tree, from the tree's git history or its
// modification times (package stability). Otherwise the order of the load
// before (the codex this one replaces, or the one the stat index saved
// across a restart) is kept and settled: the files before the first one
// that changed stay where they are, so a backend's cache of them still
// serves; the files from it on are arranged again with this change
// counted, which moves what changed late; or, with opts.EditsLast, only
// the files that changed move, to the end (stability.Last). Path order is
// path order.
func (c *Codex) arrange(ctx context.Context, dir string, opts Options, kept []entry, index statIndex) (arranged, error) {
	kind := opts.Order
	if kind == "" {
		kind = ctxd.OrderPath
	}
	paths := make([]string, len(c.Files))
	sums := make(map[string][32]byte, len(c.Files))
	for i, f := range c.Files {
		paths[i] = f.Path
		sums[f.Path] = f.sum
	}
	// The order before, and what its files held.
	var prev []string
	var prevSums map[string][32]byte
	var source string
	switch {
	case opts.Previous != nil && opts.Previous.Order.Kind == kind:
		prevSums = make(map[string][32]byte, len(opts.Previous.Files))
		for _, f := range opts.Previous.Files {
			prev = append(prev, f.Path)
			prevSums[f.Path] = f.sum
		}
		source = opts.Previous.Order.Source
	case index.OrderKind == kind && len(index.Order) > 0:
		prevSums = make(map[string][32]byte, len(index.Order))
		for _, p := range index.Order {
			if e, ok := index.Files[p]; ok && e.Skip == "" {
				prev = append(prev, p)
				prevSums[p] = e.Sum
			}
		}
		source = index.OrderSource
	}
	changed := map[string]bool{}
	if prev != nil {
		for _, p := range paths {
			if s, ok := prevSums[p]; !ok || s != sums[p] {
				changed[p] = true
			}
		}
	}
	var order []string
	from := -1
	key := versionKey(c.Files) // the files' contents, whatever their order
	sizes := make(map[string]int64, len(c.Files))
	for _, f := range c.Files {
		sizes[f.Path] = f.Size
	}
	rank := func() (stability.Ranking, error) {
		files := make([]stability.File, 0, len(kept))
		real := make(map[string]string, len(kept))
		for _, e := range kept {
			files = append(files, stability.File{Path: e.rel, MtimeNs: e.stat.MtimeNs, Size: e.size})
			real[e.rel] = e.real
		}
		return stability.Rank(ctx, dir, files, stability.Options{
			Read: func(rel string) ([]byte, error) {
				return readCapped(c.root, real[rel], opts.MaxFileBytes, opts.AllowHardLinks)
			},
		})
	}
	switch {
	case kind == ctxd.OrderPath:
		order, source = paths, "path order"
		if prev != nil {
			from = stability.From(prev, order, changed)
		}
	case prev != nil:
		// The weights go on from the codex before; across a restart they
		// are read again (the files edited since HEAD count as changed),
		// but only once a change needs them: a restart over an unchanged
		// tree reads no history.
		moved := len(changed) > 0 || len(prev) != len(paths)
		switch {
		case opts.Previous != nil && opts.Previous.weights != nil:
			c.weights = maps.Clone(opts.Previous.weights)
		case moved:
			rk, err := rank()
			if err != nil {
				return arranged{}, err
			}
			c.weights = rk.Weights()
		}
		if moved {
			c.weights.Step(changed, 0)
		}
		// A version of the tree seen before (a branch switched back, an
		// edit undone) renders in the order it had then: its stable prefix
		// is the one a backend's saved slot holds.
		if opts.Previous != nil {
			c.versions = opts.Previous.versions
		}
		if seen, ok := c.versions.find(key); ok {
			order, from = seen, stability.From(prev, seen, changed)
			c.Order.Revisited = moved
		} else if opts.EditsLast {
			order, from = stability.Last(prev, paths, changed, sizes, c.weights)
			c.Order.EditsLast = moved
		} else {
			order, from = stability.Settle(prev, paths, changed, sizes, c.weights)
		}
	default:
		rk, err := rank()
		if err != nil {
			return arranged{}, err
		}
		c.weights = rk.Weights()
		order, source = rk.Order(paths, sizes), rk.Describe()
	}
	byPath := make(map[string]File, len(c.Files))
	for _, f := range c.Files {
		byPath[f.Path] = f
	}
	files := make([]File, 0, len(order))
	for _, p := range order {
		files = append(files, byPath[p])
	}
	c.Files = files
	revisited, last := c.Order.Revisited, c.Order.EditsLast
	c.Order = ctxd.CodexOrder{Kind: kind, Source: source, Kept: prev != nil, From: from, Revisited: revisited, EditsLast: last}
	c.versions = c.versions.with(key, order)
	if prev != nil {
		for _, p := range order {
			if changed[p] {
				c.Order.Changed = append(c.Order.Changed, p)
			}
		}
		for _, p := range prev {
			if _, ok := sums[p]; !ok {
				c.Order.Removed = append(c.Order.Removed, p)
			}
		}
	}
	return arranged{kind: kind, source: source, order: order}, nil
}

// sameAs reports whether the stat index holds the order a is.
func (a arranged) sameAs(x statIndex) bool {
	return a.kind == x.OrderKind && a.source == x.OrderSource && slices.Equal(a.order, x.Order)
}

// versions remembers the orders of the tree's recent versions (each the
// set of its files and their contents), newest last, so that a version
// seen again renders as it did. Shared between loads: never modified, only
// replaced.
type versions []version

type version struct {
	key   [32]byte
	order []string
}

// maxVersions bounds the versions remembered.
const maxVersions = 32

func (vs versions) find(key [32]byte) ([]string, bool) {
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].key == key {
			return vs[i].order, true
		}
	}
	return nil, false
}

// with is vs with key's order recorded (moved to newest).
func (vs versions) with(key [32]byte, order []string) versions {
	out := make(versions, 0, min(len(vs)+1, maxVersions))
	for _, v := range vs[max(0, len(vs)+1-maxVersions):] {
		if v.key != key {
			out = append(out, v)
		}
	}
	return append(out, version{key: key, order: order})
}

// versionKey identifies a version of the tree: its files' paths and
// contents, whatever their order.
func versionKey(files []File) [32]byte {
	sorted := slices.Clone(files)
	slices.SortFunc(sorted, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	h := sha256.New()
	for _, f := range sorted {
		h.Write([]byte(f.Path))
		h.Write([]byte{0})
		h.Write(f.sum[:])
	}
	var k [32]byte
	copy(k[:], h.Sum(nil))
	return k
}
