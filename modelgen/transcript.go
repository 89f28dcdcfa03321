package modelgen

import (
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// transcriptTurns is how many rendered turns the training text carries:
// enough that every turn marker is merged into a few tokens.
const transcriptTurns = 120

// trainingText is the corpus followed by a conversation rendered with
// ctxd's own turn markers. A real model's vocabulary holds its chat
// template's markers as one or a few tokens; without this, a vocabulary
// trained on Go source alone spells "ASSISTANT" letter by letter and every
// turn pays a dozen tokens for its headers.
func trainingText() string {
	var lines []string
	for _, l := range strings.Split(corpus, "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(l), "// "); ok && len(t) > 20 {
			lines = append(lines, t)
		}
	}
	var sb strings.Builder
	sb.WriteString(corpus)
	sb.WriteString("\n")
	for i := 0; i < transcriptTurns && 2*i+1 < len(lines); i++ {
		sb.WriteString(runcontext.RenderQuery(lines[2*i], nil))
		sb.WriteString(runcontext.RenderAnswer(lines[2*i+1]))
	}
	return sb.String()
}
