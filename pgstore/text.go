package pgstore

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
)

// PostgreSQL's text holds neither the NUL character nor bytes that are
// not UTF-8, where SQLite's holds any string; a turn may carry either.
// Such a string is stored escaped: escMark, then the string as a Go
// quoted string (strconv.Quote). Every other string is stored as it is,
// except one that begins with escMark, which is escaped too so that
// reading never mistakes it. Every text the store writes goes through
// toDB and every text it reads through fromDB (the scanner text).
const escMark = "\uFFFF" // a Unicode noncharacter: no text carries it

// toDB is s as a text column stores it.
func toDB(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 && !strings.HasPrefix(s, escMark) {
		return s
	}
	return escMark + strconv.Quote(s)
}

// fromDB is the string a stored text holds (toDB undone).
func fromDB(stored string) (string, error) {
	quoted, ok := strings.CutPrefix(stored, escMark)
	if !ok {
		return stored, nil
	}
	s, err := strconv.Unquote(quoted)
	if err != nil {
		return "", fmt.Errorf("an escaped text that does not unquote: %w", err)
	}
	return s, nil
}

// text scans a text column into *dst through fromDB.
type text struct{ dst *string }

// ScanText implements pgtype.TextScanner.
func (t text) ScanText(v pgtype.Text) error {
	if !v.Valid {
		return fmt.Errorf("a NULL text")
	}
	s, err := fromDB(v.String)
	*t.dst = s
	return err
}

// dec is the scan target that reads a stored text into *dst.
func dec(dst *string) text { return text{dst} }

// words are the words a search looks for in text: runs of letters and
// digits, lower-cased (package sqlite's textMatch).
func words(text string) []string {
	return lowerFields(text, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) })
}

// indexed are the words a document is found by, as SQLite's FTS5 index
// (its unicode61 tokenizer) takes them: runs of letters, numbers and
// private-use characters (its token categories, L* N* Co) and combining
// diacritics (which it keeps in a word), lower-cased. A search word
// matches only a whole indexed word, as in SQLite: a search for "c" does
// not find "c²", nor "e" a decomposed "é".
func indexed(text string) []string {
	return lowerFields(text, func(r rune) bool {
		return unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Co, r) || '\u0300' <= r && r <= '\u036f'
	})
}

// lowerFields are the runs of text's characters that in says are in one,
// lower-cased.
func lowerFields(text string, in func(rune) bool) []string {
	fs := strings.FieldsFunc(text, func(r rune) bool { return !in(r) })
	for i, f := range fs {
		fs[i] = strings.ToLower(f)
	}
	return fs
}

// A tsvector holds words (lexemes) of at most 2047 bytes (MAXSTRLEN), and
// under a megabyte of them in all (MAXSTRPOS); PostgreSQL's
// array_to_tsvector checks neither (a longer word or document corrupts the
// vector), so docWords keeps within maxLexeme and maxDocument.
const (
	maxLexeme   = 1<<11 - 1
	maxDocument = 1 << 19
)

// docWords are the distinct words of a document (a trace's query, answer
// and note), as its tsvector holds them: a word longer than maxLexeme is
// left out (no search finds it), and so are the words past maxDocument
// bytes (a document of a megabyte of distinct words).
func docWords(parts ...string) []string {
	seen := map[string]bool{}
	out := []string{}
	size := 0
	for _, p := range parts {
		for _, w := range indexed(p) {
			if seen[w] || len(w) > maxLexeme || size+len(w) > maxDocument {
				continue
			}
			seen[w] = true
			size += len(w)
			out = append(out, w)
		}
	}
	return out
}

// tsQuery is the tsquery that matches the documents holding every word
// of text: each a quoted lexeme (no tsquery syntax in text has effect),
// joined by &. It is "" when text has no words, or one longer than any
// document holds: such a search matches nothing.
func tsQuery(text string) string {
	ws := words(text)
	for i, w := range ws {
		if len(w) > maxLexeme {
			return ""
		}
		ws[i] = "'" + strings.NewReplacer(`'`, `''`, `\`, `\\`).Replace(w) + "'"
	}
	return strings.Join(ws, " & ")
}
