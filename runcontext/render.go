package runcontext

import (
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
// Each block depends only on its own fields, which is what keeps the
// bytes of earlier blocks fixed when a later one changes.
func Render(rc *RunContext) Rendered {
	var r Rendered
	r.Blocks[BlockIdentity] = renderIdentity(rc.Identity)
	r.Blocks[BlockCodex] = renderCodex(rc.Codex)
	r.Blocks[BlockEnvironment] = renderEnvironment(rc.Environment)
	r.Blocks[BlockSigil] = renderSigil(rc.Sigil)
	r.Blocks[BlockKarma] = renderKarma(rc.Karma)
	r.Blocks[BlockState] = RenderState(rc.State)
	r.Blocks[BlockQuery] = RenderQuery(rc.Query.Text, rc.Query.Excerpts)
	return r
}

func renderIdentity(id Identity) string {
	out := "### IDENTITY " + id.Name + "\n" + escape(id.Persona) + "\n\n"
	if strings.TrimSpace(id.Instructions) != "" {
		out += "### INSTRUCTIONS\n" + escape(strings.TrimSpace(id.Instructions)) + "\n\n"
	}
	return out
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
	sb.WriteString(c.Mode)
	sb.WriteString(" files=")
	sb.WriteString(strconv.Itoa(len(c.Files)))
	sb.WriteString("\n")
	sb.WriteString(c.Body)
	if !strings.HasSuffix(c.Body, "\n") {
		sb.WriteString("\n")
	}
	sb.WriteString("\n")
	return sb.String()
}

func renderEnvironment(e Environment) string {
	return "### ENVIRONMENT\nvram_pressure: " + e.VRAM + "\ngpu: " + e.GPU +
		"\npower: " + e.Power + "\nconnectivity: " + e.Connectivity + "\n\n"
}

func renderSigil(s Sigil) string {
	out := "### SIGIL " + s.Name + "\nscopes: " + strings.Join(s.Scopes, " ") + "\n"
	for _, t := range s.Tools {
		out += "tool: " + t + "\n"
	}
	if len(s.ClientTools) > 0 {
		out += ToolProtocol
		for _, t := range s.ClientTools {
			out += "- " + t.Name
			if d := strings.TrimSpace(t.Description); d != "" {
				out += ": " + escape(strings.Join(strings.Fields(d), " "))
			}
			out += "\n"
			if t.Parameters != "" {
				out += "  parameters: " + t.Parameters + "\n"
			}
		}
	}
	return out + "\n"
}

// ToolProtocol tells the model how to call the client's tools: an answer
// that is only a JSON object (or one per line) naming an offered tool is a
// tool call (package toolcall reads it).
const ToolProtocol = "client tools (to call one, answer with only a JSON object per call, one per line: {\"name\": \"TOOL\", \"arguments\": {...}}):\n"

func renderKarma(k Karma) string {
	var sb strings.Builder
	sb.WriteString("### KARMA epoch=")
	sb.WriteString(strconv.Itoa(k.Epoch))
	sb.WriteString("\n")
	if len(k.Entries) == 0 {
		sb.WriteString("(none)\n")
	}
	for _, e := range k.Entries {
		sb.WriteString("- [")
		sb.WriteString(e.ID)
		sb.WriteString("] ")
		sb.WriteString(escape(e.Text))
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
	var sb strings.Builder
	sb.WriteString(userMarker)
	for _, e := range excerpts {
		sb.WriteString(RenderExcerpt(e))
	}
	sb.WriteString(escape(text))
	sb.WriteString("\n")
	sb.WriteString(assistantMarker)
	return sb.String()
}

// RenderExcerpt renders a codex excerpt as it precedes the question it was
// retrieved for.
func RenderExcerpt(e Excerpt) string {
	var sb strings.Builder
	sb.WriteString("[excerpt ")
	sb.WriteString(strconv.Quote(e.Path))
	if e.Lines != "" {
		sb.WriteString(" lines ")
		sb.WriteString(e.Lines)
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

// escape keeps free text from opening a block or a turn of its own: a line
// that starts with "###" (or with backslashes then "###") gets one more
// leading backslash. The mapping is reversible and deterministic.
func escape(s string) string {
	if !strings.Contains(s, "###") {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimLeft(l, `\`), "###") {
			lines[i] = `\` + l
		}
	}
	return strings.Join(lines, "")
}
