package codex

import (
	"path"
	"strings"
)

// Chunk is a piece of a file for retrieval: a function, a section under a
// heading, or a paragraph, never longer than maxChunkChars.
type Chunk struct {
	Path  string
	Start int // first line, 1-based
	End   int // last line
	Text  string
}

const maxChunkChars = 1600

// ChunkFile splits a file at function and heading boundaries.
func ChunkFile(f File) []Chunk { return chunkFile(f.Path, f.Content) }

// starts reports whether line starts a new piece in a file of this kind: a
// top-level declaration in code, a heading in Markdown, the first line
// after a blank one in prose.
func starts(kind, line, prev string) bool {
	switch kind {
	case "markdown":
		return strings.HasPrefix(line, "#")
	case "code":
		for _, p := range []string{"func ", "type ", "class ", "def ", "async def ", "fn ", "pub fn ", "pub struct ", "impl ",
			"struct ", "interface ", "export ", "function ", "const ", "var ", "module "} {
			if strings.HasPrefix(line, p) {
				return true
			}
		}
		return false
	default:
		return strings.TrimSpace(prev) == "" && strings.TrimSpace(line) != ""
	}
}

// leadingComment reports a top-level comment or annotation line, which
// belongs to the declaration after it.
func leadingComment(line string) bool {
	for _, p := range []string{"//", "#", "/*", " *", "@", "--"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func kindOf(p string) string {
	switch strings.ToLower(path.Ext(p)) {
	case ".md", ".markdown", ".rst", ".adoc":
		return "markdown"
	case ".go", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".py", ".js", ".ts", ".tsx", ".jsx", ".java", ".kt",
		".swift", ".rb", ".php", ".cs", ".scala", ".zig", ".lua", ".sh":
		return "code"
	}
	return "text"
}

// chunkFile splits content before each declaration (with its doc comment)
// or heading, then splits pieces over maxChunkChars at line boundaries.
func chunkFile(p, content string) []Chunk {
	kind := kindOf(p)
	lines := strings.SplitAfter(content, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	splits := []int{0}
	commentRun := -1
	prev := ""
	for i, line := range lines {
		t := strings.TrimRight(line, "\n")
		if i > 0 && starts(kind, t, prev) {
			at := i
			if kind == "code" && commentRun >= 0 {
				at = commentRun
			}
			if at > splits[len(splits)-1] {
				splits = append(splits, at)
			}
		}
		if kind == "code" && leadingComment(t) {
			if commentRun < 0 {
				commentRun = i
			}
		} else {
			commentRun = -1
		}
		prev = t
	}
	splits = append(splits, len(lines))
	var out []Chunk
	for s := 0; s+1 < len(splits); s++ {
		var sb strings.Builder
		start := splits[s]
		for i := splits[s]; i < splits[s+1]; i++ {
			if sb.Len() > 0 && sb.Len()+len(lines[i]) > maxChunkChars {
				out = appendChunk(out, p, start, i, sb.String())
				sb.Reset()
				start = i
			}
			sb.WriteString(lines[i])
		}
		out = appendChunk(out, p, start, splits[s+1], sb.String())
	}
	return out
}

// appendChunk adds lines [from, to) (0-based) unless they are blank.
func appendChunk(out []Chunk, p string, from, to int, text string) []Chunk {
	if strings.TrimSpace(text) == "" {
		return out
	}
	return append(out, Chunk{Path: p, Start: from + 1, End: to, Text: text})
}
