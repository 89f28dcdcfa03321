package codex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"

	"github.com/ctxd/ctxd"
)

// The cache file is a flat binary record (a stat index of ten thousand
// files decodes in a few milliseconds; gob took ten times as long):
//
//	magic, tokenizer, entries (sum, redaction rules, lines, tokens,
//	counted, redactions (rule, line)…), stat index (root, options, scan
//	time, files (path, size, mtime, ctime, inode, device, sum, skip
//	reason)…, the order's kind and source, the files in order…)
//
// integers as varints, strings and lists length-prefixed. Any other
// content is not a cache of this version: it is started over. The
// redaction rules' version is in each entry's key, not in the magic: an
// upgrade of the rules reads the files again but keeps the stat index and
// the token counts of files read without redaction.
const cacheMagic = "ctxd-codex-cache-5\n"

var errCacheFormat = errors.New("codex: cache: not a cache of this version")

func (cf *cacheFile) encode() []byte {
	b := []byte(cacheMagic)
	b = appendString(b, cf.Tokenizer)
	keys := make([]cacheKey, 0, len(cf.Entries))
	for k := range cf.Entries {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b cacheKey) int { return compareKeys(a, b) })
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		e := cf.Entries[k]
		b = append(b, k.Sum[:]...)
		b = appendString(b, k.Rules)
		b = binary.AppendUvarint(b, uint64(e.Lines))
		b = binary.AppendVarint(b, int64(e.Tokens))
		b = appendBool(b, e.Counted)
		b = binary.AppendUvarint(b, uint64(len(e.Redactions)))
		for _, r := range e.Redactions {
			b = appendString(b, r.Rule)
			b = binary.AppendUvarint(b, uint64(r.Line))
		}
	}
	x := cf.Index
	b = appendString(b, x.Root)
	b = appendString(b, x.Options)
	b = binary.AppendVarint(b, x.ScanNs)
	paths := make([]string, 0, len(x.Files))
	for p := range x.Files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	b = binary.AppendUvarint(b, uint64(len(paths)))
	for _, p := range paths {
		e := x.Files[p]
		b = appendString(b, p)
		b = binary.AppendVarint(b, e.Stat.Size)
		b = binary.AppendVarint(b, e.Stat.MtimeNs)
		b = binary.AppendVarint(b, e.Stat.CtimeNs)
		b = binary.AppendUvarint(b, e.Stat.Ino)
		b = binary.AppendUvarint(b, e.Stat.Dev)
		b = append(b, e.Sum[:]...)
		b = appendString(b, e.Skip)
	}
	b = appendString(b, x.OrderKind)
	b = appendString(b, x.OrderSource)
	b = binary.AppendUvarint(b, uint64(len(x.Order)))
	for _, p := range x.Order {
		b = appendString(b, p)
	}
	return b
}

func compareKeys(a, b cacheKey) int {
	if c := bytes.Compare(a.Sum[:], b.Sum[:]); c != 0 {
		return c
	}
	return strings.Compare(a.Rules, b.Rules)
}

func (cf *cacheFile) decode(data []byte) error {
	d := decoder{b: data}
	if string(d.bytes(len(cacheMagic))) != cacheMagic {
		return errCacheFormat
	}
	cf.Tokenizer = d.string()
	n := d.uvarint()
	// Size hints no larger than the data could hold: a damaged count must
	// not allocate more than the file.
	cf.Entries = make(map[cacheKey]cacheEntry, min(n, uint64(len(data)/36)))
	for range n {
		if d.err != nil {
			break
		}
		var k cacheKey
		copy(k.Sum[:], d.bytes(32))
		k.Rules = d.string()
		e := cacheEntry{Lines: int(d.uvarint()), Tokens: int(d.varint()), Counted: d.bool()}
		for range d.uvarint() {
			if d.err != nil {
				break
			}
			e.Redactions = append(e.Redactions, ctxd.Redaction{Rule: d.string(), Line: int(d.uvarint())})
		}
		cf.Entries[k] = e
	}
	x := &cf.Index
	x.Root, x.Options, x.ScanNs = d.string(), d.string(), d.varint()
	n = d.uvarint()
	x.Files = make(map[string]statEntry, min(n, uint64(len(data)/40)))
	for range n {
		if d.err != nil {
			break
		}
		p := d.string()
		var e statEntry
		e.Stat = fileStat{Size: d.varint(), MtimeNs: d.varint(), CtimeNs: d.varint(), Ino: d.uvarint(), Dev: d.uvarint()}
		copy(e.Sum[:], d.bytes(32))
		e.Skip = d.string()
		x.Files[p] = e
	}
	x.OrderKind, x.OrderSource = d.string(), d.string()
	n = d.uvarint()
	x.Order = make([]string, 0, min(n, uint64(len(data))))
	for range n {
		if d.err != nil {
			break
		}
		x.Order = append(x.Order, d.string())
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = errCacheFormat
	}
	return d.err
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// decoder reads the cache file; the first error sticks and every later
// read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		d.err = errCacheFormat
		return make([]byte, max(n, 0))
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCacheFormat
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errCacheFormat
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bool() bool { return d.bytes(1)[0] == 1 }

func (d *decoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = errCacheFormat
		return ""
	}
	return string(d.bytes(int(n)))
}
