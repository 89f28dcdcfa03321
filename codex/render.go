package codex

import (
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// render writes each file between fences that no line of its content can
// close, so no file can close its own block or open another. The path is
// quoted, so no path can either.
func render(files []File) string {
	pieces := make([]Piece, len(files))
	for i, f := range files {
		pieces[i] = Piece{Path: f.Path, Content: f.Content}
	}
	return RenderPieces(pieces)
}

// Piece is a file, or some of its lines, as the codex block shows it.
type Piece struct {
	Path    string
	Lines   string // "10-42"; "": the whole file
	Content string
}

// RenderPieces renders pieces as the whole codex renders files: between
// fences that the content cannot close, the path quoted, and for part of a
// file, its lines.
//
// A fence is runcontext.Fence: tildes, one more than the longest run that
// starts a line of the content as a lenient reader reads it (after any
// line break a tokenizer may take for one, at any indentation, invisible
// characters skipped, ～ read as ~), so no line of the content closes it.
// Lines of the content that would read as one of ctxd's block or turn
// markers are escaped when the codex block renders (package runcontext),
// not here: the body is what the files hold, fenced.
func RenderPieces(pieces []Piece) string {
	n := 0
	for _, p := range pieces {
		n += len(p.Content) + len(p.Path) + 40
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, p := range pieces {
		fence := runcontext.Fence(p.Content)
		sb.WriteString(fence)
		sb.WriteString(" file ")
		sb.WriteString(quotePath(p.Path))
		if p.Lines != "" {
			sb.WriteString(" lines ")
			sb.WriteString(p.Lines)
		}
		sb.WriteString("\n")
		sb.WriteString(p.Content)
		if !strings.HasSuffix(p.Content, "\n") {
			sb.WriteString("\n")
		}
		sb.WriteString(fence)
		sb.WriteString("\n")
	}
	return sb.String()
}
