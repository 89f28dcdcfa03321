// Package toolmanifest is the formatter that offers the model its tools:
// in the sigil block, the daemon's tools the sigil's scopes allow (such as
// search_codex) and the client's tools the scopes allow, with the
// protocol for calling them. It is a stable artifact injector (package
// formatters): the manifest changes only when the sigil or the client's
// tools do.
//
// It renders what the orchestrator put in the RunContext's sigil
// (Sigil.Tools, Sigil.ClientTools, already filtered by scope and sorted);
// it decides nothing about which tools a sigil may use. Package toolcall
// reads the calls the protocol asks for.
package toolmanifest

import (
	"context"
	"strings"

	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/runcontext"
)

// Name is the formatter's name.
const Name = "toolmanifest"

// Protocol tells the model how to call the client's tools: an answer that
// is only a JSON object (or one per line) naming an offered tool is a tool
// call (package toolcall reads it).
const Protocol = "client tools (to call one, answer with only a JSON object per call, one per line: {\"name\": \"TOOL\", \"arguments\": {...}}):\n"

// Injector is the tool manifest formatter. The zero value is ready.
type Injector struct{}

var _ formatters.Injector = Injector{}

// New returns the tool manifest formatter.
func New() Injector { return Injector{} }

// Name is "toolmanifest".
func (Injector) Name() string { return Name }

// Block is the sigil block.
func (Injector) Block() int { return runcontext.BlockSigil }

// Stable is true.
func (Injector) Stable() bool { return true }

// Inject renders the manifest of in.RunContext's sigil; "" when it offers
// no tool.
func (Injector) Inject(_ context.Context, in formatters.Input) (string, error) {
	if in.RunContext == nil {
		return "", nil
	}
	return Render(in.RunContext.Sigil), nil
}

// Render is the manifest of a sigil's tools: a "tool:" line per daemon
// tool, then the protocol and an entry per client tool (its description on
// one line, its parameters' JSON Schema below it); "" when there are none.
// The client's tools are left out when the model's chat template offers
// them (Sigil.ToolFormat).
func Render(s runcontext.Sigil) string {
	var sb strings.Builder
	for _, t := range s.Tools {
		sb.WriteString("tool: ")
		sb.WriteString(t)
		sb.WriteString("\n")
	}
	if len(s.ClientTools) > 0 && s.ToolFormat != runcontext.ToolFormatTemplate {
		sb.WriteString(Protocol)
		for _, t := range s.ClientTools {
			sb.WriteString("- ")
			sb.WriteString(t.Name)
			if d := strings.Join(strings.Fields(t.Description), " "); d != "" {
				sb.WriteString(": ")
				sb.WriteString(d)
			}
			sb.WriteString("\n")
			if t.Parameters != "" {
				sb.WriteString("  parameters: ")
				sb.WriteString(t.Parameters)
				sb.WriteString("\n")
			}
		}
	}
	return sb.String()
}
