package runcontext

import (
	"slices"
	"strconv"
	"strings"
)

// Block indexes, in rendering order.
const (
	BlockIdentity = iota
	BlockCodex
	BlockEnvironment
	BlockSigil
	BlockKarma
	BlockState
	BlockQuery
	NumBlocks
)

// BlockNames names the blocks in rendering order.
var BlockNames = [NumBlocks]string{"identity", "codex", "environment", "sigil", "karma", "state", "query"}

// Rendered is a RunContext rendered block by block. Its prompt is the
// blocks concatenated in order.
type Rendered struct {
	Blocks [NumBlocks]string
	// Artifacts are the artifacts the blocks hold, in rendering order:
	// what Compare names when a block changed because one did.
	Artifacts []Artifact
}

// Prompt is the full prompt text.
func (r Rendered) Prompt() string {
	var sb strings.Builder
	sb.Grow(r.Len())
	for _, b := range r.Blocks {
		sb.WriteString(b)
	}
	return sb.String()
}

// Len is the prompt's length in bytes.
func (r Rendered) Len() int {
	n := 0
	for _, b := range r.Blocks {
		n += len(b)
	}
	return n
}

// Offset is the byte offset at which block k starts in the prompt.
func (r Rendered) Offset(k int) int {
	n := 0
	for _, b := range r.Blocks[:k] {
		n += len(b)
	}
	return n
}

// Turn markers. The conversation is a flat sequence of turns with no
// closing marker, so appending a turn only ever appends bytes.
const (
	userMarker      = "### USER\n"
	assistantMarker = "### ASSISTANT\n"
	// StopSequence ends an answer: the model must not write the next user turn.
	StopSequence = "\n### USER"
)

// Render renders rc canonically. It does not validate; call Validate first.
// Each block depends only on its own fields and its artifacts, which is
// what keeps the bytes of earlier blocks fixed when a later one changes.
func Render(rc *RunContext) Rendered { return render(rc, nil, false) }

// RenderStable renders the stable blocks of rc, identity to karma, with
// special token texts escaped against sp as Plain does (the codex block
// was escaped when it was prerendered); the state and query blocks are
// left empty. It is what the stable prefix of a prompt holds, for a
// format that wraps the blocks in messages of its own (package
// chattemplate) or a caller that measures the prefix.
func RenderStable(rc *RunContext, sp Specials) Rendered { return render(rc, sp, true) }

// render renders rc, each block escaped against sp (nil: not at all), the
// state and query only if !stableOnly.
func render(rc *RunContext, sp Specials, stableOnly bool) Rendered {
	var r Rendered
	r.Artifacts = sortArtifacts(rc.Artifacts)
	var arts [NumBlocks]string
	for _, a := range r.Artifacts {
		if k, ok := a.renderBlock(); ok {
			arts[k] += RenderArtifact(a.Text)
		}
	}
	r.Blocks[BlockIdentity] = sp.Escape(renderIdentity(rc.Identity, arts[BlockIdentity]))
	if rc.Codex.Prerendered() {
		// Escaped once, when prerendered: only the artifacts are new.
		r.Blocks[BlockCodex] = withArtifacts(renderCodex(rc.Codex), sp.Escape(arts[BlockCodex]))
	} else {
		r.Blocks[BlockCodex] = sp.Escape(withArtifacts(renderCodex(rc.Codex), arts[BlockCodex]))
	}
	r.Blocks[BlockEnvironment] = sp.Escape(withArtifacts(renderEnvironment(rc.Environment), arts[BlockEnvironment]))
	r.Blocks[BlockSigil] = sp.Escape(withArtifacts(renderSigil(rc.Sigil), arts[BlockSigil]) + renderInstructions(rc.Sigil.Instructions))
	r.Blocks[BlockKarma] = sp.Escape(withArtifacts(renderKarma(rc.Karma), arts[BlockKarma]))
	if !stableOnly {
		r.Blocks[BlockState] = sp.Escape(RenderState(rc.State))
		r.Blocks[BlockQuery] = sp.Escape(renderQuery(rc.Query.Text, rc.Query.Excerpts, arts[BlockQuery]))
	}
	return r
}

// withArtifacts places the rendered artifacts at the end of a block's
// content: before the blank line that closes it.
func withArtifacts(block, arts string) string {
	if arts == "" {
		return block
	}
	return block[:len(block)-1] + arts + "\n"
}

// renderIdentity renders the persona, then its artifacts.
func renderIdentity(id Identity, arts string) string {
	return "### IDENTITY " + escapeInline(id.Name) + "\n" + escape(id.Persona) + "\n" + arts + "\n"
}

// renderInstructions renders the client's system message, if any, as the
// sigil block's last part: after the sigil's tools, which change less
// often (an agent's side requests offer the same tools, or none, under
// system messages of their own).
func renderInstructions(text string) string {
	if strings.TrimSpace(text) == "" {
		return ""
	}
	return "### INSTRUCTIONS\n" + escape(strings.TrimSpace(text)) + "\n\n"
}

func renderCodex(c Codex) string {
	if c.block != "" {
		return c.block
	}
	if c.Mode == ModeNone || c.Mode == "" {
		return "### CODEX\n(none)\n\n"
	}
	var sb strings.Builder
	sb.Grow(len(c.Body) + 64)
	sb.WriteString("### CODEX ")
	sb.WriteString(strconv.Quote(c.Name))
	sb.WriteString(" mode=")
	sb.WriteString(escapeInline(c.Mode))
	sb.WriteString("\n") // no file count: a file added must not change the block's first line
	body := escape(c.Body)
	sb.WriteString(body)
	if !strings.HasSuffix(body, "\n") {
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}

func renderEnvironment(e Environment) string {
	return "### ENVIRONMENT\nvram_pressure: " + escapeInline(e.VRAM) + "\ngpu: " + escapeInline(e.GPU) +
		"\npower: " + escapeInline(e.Power) + "\nconnectivity: " + escapeInline(e.Connectivity) + "\n\n"
}

// renderSigil renders the sigil's name and scopes. The tools it offers are
// an artifact (package formatters/toolmanifest), not hard-coded here.
func renderSigil(s Sigil) string {
	return "### SIGIL " + escapeInline(s.Name) + "\nscopes: " + escapeInline(strings.Join(s.Scopes, " ")) + "\n\n"
}

// renderKarma renders the karma entries. The karma epoch is not rendered:
// a new epoch that chooses the same traces keeps the block's bytes, and
// with them the cached prefix.
func renderKarma(k Karma) string {
	var sb strings.Builder
	sb.WriteString("### KARMA\n")
	if len(k.Entries) == 0 {
		sb.WriteString("(none)\n")
	}
	for _, e := range k.Entries {
		// Escaped as a whole line, "- [" included: an id and a text that
		// hold nothing escaping looks for are written as they are.
		if mayNeedEscape(e.ID) || mayNeedEscape(e.Text) || hasBidiControl(e.ID) || hasBidiControl(e.Text) {
			sb.WriteString(escape("- [" + e.ID + "] " + e.Text))
		} else {
			sb.WriteString("- [")
			sb.WriteString(e.ID)
			sb.WriteString("] ")
			sb.WriteString(e.Text)
		}
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}

// RenderState renders the conversation so far: a header, then each turn
// exactly as its query block was rendered, followed by its answer.
func RenderState(s State) string {
	var sb strings.Builder
	sb.WriteString("### CONVERSATION epoch=")
	sb.WriteString(strconv.Itoa(s.Epoch))
	sb.WriteString("\n")
	if s.Summary != "" {
		sb.WriteString("[summary of earlier turns]\n")
		sb.WriteString(escape(s.Summary))
		sb.WriteString("\n[/summary]\n")
	}
	for _, t := range s.Turns {
		sb.WriteString(RenderQuery(t.Query, t.Excerpts))
		sb.WriteString(RenderAnswer(t.Answer))
	}
	return sb.String()
}

// RenderQuery renders a user turn up to the point where the model answers.
func RenderQuery(text string, excerpts []Excerpt) string {
	return renderQuery(text, excerpts, "")
}

// renderQuery renders a user turn: its excerpts, the rendered volatile
// artifacts arts (the query block's only: past turns have none), its text.
func renderQuery(text string, excerpts []Excerpt, arts string) string {
	var sb strings.Builder
	sb.WriteString(userMarker)
	for _, e := range excerpts {
		sb.WriteString(RenderExcerpt(e))
	}
	sb.WriteString(arts)
	sb.WriteString(escape(text))
	sb.WriteString("\n")
	sb.WriteString(assistantMarker)
	return sb.String()
}

// RenderArtifact renders an artifact's text as a block holds it: escaped
// (Escape), on lines of its own.
func RenderArtifact(text string) string {
	text = escape(text)
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text
}

// RenderArtifacts renders, in order, the artifacts of arts that render in
// block k (a volatile one renders in the query block, whatever it names):
// what the block holds of them, before escaping special token texts.
func RenderArtifacts(arts []Artifact, k int) string {
	var sb strings.Builder
	for _, a := range sortArtifacts(arts) {
		if b, ok := a.renderBlock(); ok && b == k {
			sb.WriteString(RenderArtifact(a.Text))
		}
	}
	return sb.String()
}

// sortArtifacts returns a copy of arts in rendering order: by formatter
// name, then as given.
func sortArtifacts(arts []Artifact) []Artifact {
	if len(arts) == 0 {
		return nil
	}
	arts = slices.Clone(arts)
	slices.SortStableFunc(arts, byFormatter)
	return arts
}

func byFormatter(a, b Artifact) int { return strings.Compare(a.Formatter, b.Formatter) }

// renderBlock is the block an artifact renders in, if any: a volatile one
// in the query block; a stable one in its block, if that is one of the
// stable blocks (Validate refuses the others, and Render leaves them out).
func (a Artifact) renderBlock() (int, bool) {
	switch {
	case !a.Stable:
		return BlockQuery, true
	case a.Block >= 0 && a.Block < BlockState:
		return a.Block, true
	}
	return 0, false
}

// RenderExcerpt renders a codex excerpt as it precedes the question it was
// retrieved for.
func RenderExcerpt(e Excerpt) string {
	var sb strings.Builder
	sb.WriteString("[excerpt ")
	sb.WriteString(strconv.Quote(e.Path))
	if e.Lines != "" {
		sb.WriteString(" lines ")
		sb.WriteString(escapeInline(e.Lines))
	}
	sb.WriteString("]\n")
	sb.WriteString(escape(e.Text))
	sb.WriteString("\n[/excerpt]\n")
	return sb.String()
}

// RenderAnswer renders an answer as it follows its query in the state.
func RenderAnswer(answer string) string {
	return escape(answer) + "\n"
}
