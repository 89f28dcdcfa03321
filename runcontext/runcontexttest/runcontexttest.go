package runcontexttest

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line is one line of a text: Text without its line break, which starts
// at byte Start of the text.
type Line struct {
	Text  string
	Start int
}

// Lines splits s at every line break, as the package doc lists them. A
// text that ends with a line break has no empty last line.
func Lines(s string) []Line {
	var out []Line
	start := 0
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\n', '\v', '\f', '\x1c', '\x1d', '\x1e', '\u0085', '\u2028', '\u2029':
		case '\r':
			if strings.HasPrefix(s[i+1:], "\n") {
				n = 2
			}
		default:
			i += n
			continue
		}
		out = append(out, Line{Text: s[start:i], Start: start})
		i += n
		start = i
	}
	if start < len(s) {
		out = append(out, Line{Text: s[start:], Start: start})
	}
	return out
}

// fold is the ASCII character r reads as, if any.
func fold(r rune) (byte, bool) {
	if r < utf8.RuneSelf {
		return byte(r), true
	}
	if r >= 0xE0020 && r <= 0xE007E {
		return byte(r - 0xE0000), true
	}
	c, ok := nfkc[r]
	return c, ok
}

// invisible reports whether r is dropped wherever it is: a format
// character or a combining mark.
func invisible(r rune) bool { return unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me) }

// Reading is how a lenient reader reads a line: folded to ASCII where a
// character's NFKC form is one, invisible characters dropped, leading
// white space and control characters dropped.
func Reading(line string) string {
	var sb strings.Builder
	leading := true
	for _, r := range line {
		if c, ok := fold(r); ok {
			if leading && (c == ' ' || c == '\t' || c < 0x20 || c == 0x7f) {
				continue
			}
			sb.WriteByte(c)
			leading = false
			continue
		}
		if invisible(r) {
			continue
		}
		if leading && (unicode.IsSpace(r) || unicode.IsControl(r)) {
			continue
		}
		sb.WriteRune(r)
		leading = false
	}
	return sb.String()
}

func isBidi(r rune) bool { return r >= 0x202A && r <= 0x202E || r >= 0x2066 && r <= 0x2069 }

// Displayed is line as a bidi-aware viewer shows it, roughly: what comes
// before its first explicit bidi control, then the rest reversed. A line
// without one displays as it is.
func Displayed(line string) string {
	i := strings.IndexFunc(line, isBidi)
	if i < 0 {
		return line
	}
	rest := []rune(line[i:])
	slices.Reverse(rest)
	return line[:i] + string(rest)
}

var markerPrefixes = []string{"[excerpt", "[/excerpt", "[summary", "[/summary"}

// IsMarker reports whether a lenient reader takes line for one of ctxd's
// markers: a block header, a turn marker, an excerpt's or a summary's
// bracket.
func IsMarker(line string) bool {
	for _, l := range []string{line, Displayed(line)} {
		r := Reading(l)
		if strings.HasPrefix(r, "###") {
			return true
		}
		lower := strings.ToLower(r)
		for _, p := range markerPrefixes {
			if strings.HasPrefix(lower, p) {
				return true
			}
		}
	}
	return false
}

// Markers lists the lines of s that a lenient reader takes for markers,
// as they are written.
func Markers(s string) []string {
	var out []string
	for _, l := range Lines(s) {
		if IsMarker(l.Text) {
			out = append(out, l.Text)
		}
	}
	return out
}

// Tildes is how many tildes the reading of line starts with.
func Tildes(line string) int {
	r := Reading(line)
	return len(r) - len(strings.TrimLeft(r, "~"))
}

// File is one file of a codex block as a lenient reader finds it.
type File struct {
	Header  string // the opening fence's line
	Fence   string // its tildes
	Content string // what lies between the fences, line breaks included
}

var fenceRE = regexp.MustCompile(`^(~{3,}) file "(?:[^"\\]|\\.)*"( lines [0-9]+-[0-9]+)?$`)

// Fenced reads the files of a codex body: fenced files, one after the
// other, nothing else. It fails where a line that would open or close a
// file is not what ctxd writes.
func Fenced(body string) ([]File, error) {
	var files []File
	lines := Lines(body)
	for i := 0; i < len(lines); {
		open := lines[i]
		m := fenceRE.FindStringSubmatch(open.Text)
		if m == nil {
			return files, fmt.Errorf("line %d %q does not open a file", i+1, open.Text)
		}
		fence := m[1]
		j := i + 1
		for j < len(lines) && Tildes(lines[j].Text) < len(fence) {
			j++
		}
		if j == len(lines) {
			return files, fmt.Errorf("the file opened on line %d is not closed", i+1)
		}
		if lines[j].Text != fence {
			return files, fmt.Errorf("line %d %q closes the file opened on line %d (%q) but is not its fence", j+1, lines[j].Text, i+1, open.Text)
		}
		start := len(body)
		if i+1 < len(lines) {
			start = lines[i+1].Start
		}
		files = append(files, File{Header: open.Text, Fence: fence, Content: body[start:lines[j].Start]})
		i = j + 1
	}
	return files, nil
}

// Fold is the ASCII character r reads as, if any: for checking another
// implementation of the fold against this one.
func Fold(r rune) (byte, bool) { return fold(r) }
