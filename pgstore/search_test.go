package pgstore

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/internal/storetest"
	"github.com/ctxd/ctxd/sqlite"
)

// TestTextSearchMatchesSQLite records the same traces in both stores and
// searches both alike: the words a document is found by (SQLite's FTS5
// tokenizer there, indexed here) and the words of a search (textMatch
// there, words here) must agree, beyond the contract's plain English.
// One difference is known and left out: SQLite's FTS5 does not lower the
// Turkish İ (U+0130) of a document, which a search (lowered by Go, to i)
// never finds there; here it is lowered as the search is, and found.
func TestTextSearchMatchesSQLite(t *testing.T) {
	ctx := t.Context()
	lite, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "ctxd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	pg := openTest(t)
	texts := []string{
		"C++ templates", "x² and ½ of it", "naïve café", "e\u0301 combining", "emoji 😀 smile", "ÜBER ünïcode",
		"snake_case_name", "v1.2.3 release", "\ue000private use", "ǅungla titlecase", "ΣΊΣΥΦΟΣ σίσυφος",
		"日本語のテキスト", "tab\tand\nnewline", "hyphen-ated words", "O'Brien's", "١٢٣ arabic digits", "ﬁ ligature",
		"mc a\u0903b", "me c\u20ddd", "sc f$g", "cf h\u00adj", "zwj k\u200dl", "po m·n", "sk o^p", "sm q+r", "no s¹t", "nl u\u2160w",
	}
	for i, text := range texts {
		for _, s := range []ctxd.KarmaStore{lite, pg} {
			if _, err := s.RecordTrace(ctx, ctxd.Trace{Session: "s", Sigil: "dev", Query: text, Answer: "a", CreatedAt: storetest.T0.Add(time.Duration(i) * time.Second)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	searches := []string{
		"c", "C++", "templates", "x", "x²", "½", "naïve", "naive", "cafe", "café", "e", "e\u0301", "😀", "smile", "über", "ÜBER",
		"ünïcode", "snake", "snake_case_name", "case", "v1", "1", "2", "release", "private", "\ue000private", "ǆungla", "ǅungla",
		"σίσυφος", "ΣΊΣΥΦΟΣ", "日本語のテキスト", "日本語", "tab", "newline", "hyphen", "ated",
		"hyphen-ated", "o", "brien", "s", "١٢٣", "123", "arabic", "ﬁ", "fi", "ligature",
		"a", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "w",
	}
	for _, q := range searches {
		want, err1 := lite.Traces(ctx, ctxd.TraceFilter{Text: q})
		got, err2 := pg.Traces(ctx, ctxd.TraceFilter{Text: q})
		if err1 != nil || err2 != nil || !slices.Equal(traceIDs(got), traceIDs(want)) {
			t.Errorf("search %q: PostgreSQL finds %v (%v), SQLite %v (%v)", q, traceIDs(got), err2, traceIDs(want), err1)
		}
	}
}

func traceIDs(ts []ctxd.Trace) []int64 {
	out := []int64{}
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}
