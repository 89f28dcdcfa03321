package pgstore

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/storetest"
)

func TestTextEscapes(t *testing.T) {
	for _, c := range []struct {
		in      string
		escaped bool
	}{
		{"", false},
		{"plain text, ünïcode and ### marks", false},
		{"a\x00b", true},
		{"bytes \xff\xfe", true},
		{escMark + "begins with the mark", true},
		{"holds the mark " + escMark + " later", false},
		{escMark, true},
		{`"quoted" \ and ` + "`" + ` back`, false},
	} {
		stored := toDB(c.in)
		if strings.HasPrefix(stored, escMark) != c.escaped || strings.IndexByte(stored, 0) >= 0 || !utf8Valid(stored) {
			t.Errorf("toDB(%q) = %q; escaped %v, want %v, valid text for PostgreSQL", c.in, stored, !c.escaped, c.escaped)
		}
		if back, err := fromDB(stored); err != nil || back != c.in {
			t.Errorf("fromDB(toDB(%q)) = %q, %v", c.in, back, err)
		}
	}
	if _, err := fromDB(escMark + "not quoted"); err == nil {
		t.Error("a badly escaped text read without an error")
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "") == s }

func TestWords(t *testing.T) {
	if got := words("How do I retry a Timeout? x_y naïve 42nd"); !slices.Equal(got, []string{"how", "do", "i", "retry", "a", "timeout", "x", "y", "naïve", "42nd"}) {
		t.Errorf("words = %q", got)
	}
	if got := indexed("x² C++ \ue000pua ½"); !slices.Equal(got, []string{"x²", "c", "\ue000pua", "½"}) {
		t.Errorf("indexed = %q", got)
	}
	if got := words("x² ½"); !slices.Equal(got, []string{"x"}) {
		t.Errorf("words of a search = %q", got)
	}
	long := strings.Repeat("x", maxLexeme+1)
	if got := docWords("a b a", long, "B c"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("docWords = %q; want the distinct words, the over-long one left out", got)
	}
	var many strings.Builder
	for i := range maxDocument / 8 {
		fmt.Fprintf(&many, "w%07d ", i)
	}
	ws := docWords(many.String())
	size := 0
	for _, w := range ws {
		size += len(w)
	}
	if size > maxDocument || len(ws) == 0 {
		t.Errorf("a document of %d bytes of words kept %d bytes of them; want at most %d", many.Len(), size, maxDocument)
	}
	for text, want := range map[string]string{
		"Timeout retry":  "'timeout' & 'retry'",
		`it's "x" OR *`:  "'it' & 's' & 'x' & 'or'",
		"?!":             "",
		long + " a":      "",
		"ÉTÉ":            "'été'",
		`back\slash's y`: `'back' & 'slash' & 's' & 'y'`,
	} {
		if got := tsQuery(text); got != want {
			t.Errorf("tsQuery(%q) = %q, want %q", text, got, want)
		}
	}
}

// TestOddTextIsKept: text PostgreSQL's text type refuses (NUL, bytes that
// are not UTF-8) and documents past a tsvector's limits are stored and
// read back as given, and searched by their other words.
func TestOddTextIsKept(t *testing.T) {
	ctx := t.Context()
	s := openTest(t)
	var huge strings.Builder
	for i := range 50_000 { // 700 KB of distinct words: past the document budget
		fmt.Fprintf(&huge, "distinct%06d ", i)
	}
	in := ctxd.Trace{Session: "s\x00", Sigil: "dev\xff", Query: "needle " + strings.Repeat("y", 5000) + " haystack",
		Answer: huge.String(), Model: escMark + "m", CreatedAt: storetest.T0}
	id, err := s.RecordTrace(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Trace(ctx, id)
	if err != nil || got.Session != in.Session || got.Sigil != in.Sigil || got.Query != in.Query || got.Answer != in.Answer || got.Model != in.Model {
		t.Fatalf("read back: %q %q %q %v", got.Session, got.Sigil, got.Model, err)
	}
	if ts, err := s.Traces(ctx, ctxd.TraceFilter{Sigil: "dev\xff", Session: "s\x00", Text: "needle haystack"}); err != nil || len(ts) != 1 {
		t.Errorf("searched: %d traces, %v; want it", len(ts), err)
	}
	storetest.Event(t, s, ctxd.KarmaEvent{Trace: id, Action: ctxd.KarmaVerify, Note: "n\x00te", At: storetest.T0})
	if el, err := s.Eligible(ctx, "dev\xff"); err != nil || len(el) != 1 || el[0].Note != "n\x00te" {
		t.Errorf("eligible: %+v, %v", el, err)
	}
}
