package ctxd

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCheckSessionID checks any string as a session id. One that passes
// is safe where ids go: a file or URL path segment of its own (not empty,
// not . or .., no slash), a log field or header value (printable ASCII,
// no space), at most 128 bytes, not taken for a flag (no leading -). One
// that fails is an error of kind KindInvalid that quotes it and names
// the pattern, on one line.
func FuzzCheckSessionID(f *testing.F) {
	for _, s := range []string{
		"s1", "mine.1", "oai-0123456789abcdef0123", "a_b-c.d", strings.Repeat("x", 128),
		strings.Repeat("x", 129), "", ".", "..", "../etc", "-rf", "_x", "a/b", "a b", "a\nb", "é", "a\x00", "s1\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := CheckSessionID(id)
		if err != nil {
			msg := err.Error()
			if KindOf(err) != KindInvalid || !strings.Contains(msg, SessionIDPattern.String()) || strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("%q refused with %v (kind %s)", id, err, KindOf(err))
			}
			return
		}
		switch {
		case len(id) == 0 || len(id) > 128:
			t.Fatalf("%q passes with %d bytes", id, len(id))
		case id == "." || id == ".." || strings.ContainsAny(id, `/\`) || filepath.Base(id) != id:
			t.Fatalf("%q passes and is no path segment of its own", id)
		case strings.HasPrefix(id, "-") || strings.HasPrefix(id, "."):
			t.Fatalf("%q passes with a leading %q", id, id[:1])
		case !utf8.ValidString(id):
			t.Fatalf("%q passes and is not UTF-8", id)
		}
		for _, r := range id {
			if r <= ' ' || r >= 0x7f {
				t.Fatalf("%q passes with %q", id, r)
			}
		}
	})
}
