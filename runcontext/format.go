package runcontext

import (
	"strings"
	"unicode/utf8"
)

// Format is how a RunContext becomes the text a model reads: ctxd's own
// plain format, or the model's chat template (package chattemplate). Either
// way the prompt is seven blocks in cache order, each depending only on
// its own fields, and content never forms a special token.
type Format interface {
	// Name names the format for status and logs.
	Name() string
	// Render renders rc. It does not validate; call Validate first.
	Render(rc *RunContext) (Rendered, error)
	// Answer is the text an answer adds to the prompt, right after the
	// prompt it answered: turn n+1's prompt starts with turn n's prompt
	// followed by Answer(answer), for an append-only format.
	Answer(answer string) string
	// Stop lists the stop sequences an answer ends at (besides the
	// vocabulary's end-of-turn tokens).
	Stop() []string
	// Specials is what content is escaped against.
	Specials() Specials
}

// Specials are the texts the model's tokenizer turns into special tokens
// (control tokens such as <s> or <|im_start|>), longest first. Content that
// holds one would become that token on a backend that parses special
// tokens in the prompt text (Ollama does): a query could then open a turn
// of its own.
type Specials []string

// zeroWidthSpace breaks a special token's text without changing how it
// reads.
const zeroWidthSpace = "\u200b"

// Escape breaks every special token text in s with a zero-width space
// after its first character, so it tokenizes as ordinary text. Text with
// none is returned as it is. The mapping is deterministic.
func (sp Specials) Escape(s string) string {
	found := false
	for _, t := range sp {
		if strings.Contains(s, t) {
			found = true
			break
		}
	}
	if !found {
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		matched := ""
		for _, t := range sp {
			if strings.HasPrefix(s[i:], t) {
				matched = t
				break
			}
		}
		if matched == "" {
			sb.WriteByte(s[i])
			i++
			continue
		}
		_, n := utf8.DecodeRuneInString(matched)
		sb.WriteString(matched[:n])
		sb.WriteString(zeroWidthSpace)
		i += n
	}
	return sb.String()
}

// Plain is ctxd's own format: blocks with ### headers, turns marked
// "### USER" and "### ASSISTANT", for models without a chat template.
type Plain struct {
	Special Specials
}

var _ Format = Plain{}

// Name is "plain".
func (Plain) Name() string { return "plain" }

// Render renders rc in the plain format, escaping special token texts in
// every block; the codex block was escaped when it was prerendered.
func (p Plain) Render(rc *RunContext) (Rendered, error) { return render(rc, p.Special, false), nil }

// Answer is the answer as the next turn's state holds it.
func (p Plain) Answer(answer string) string { return p.Special.Escape(RenderAnswer(answer)) }

// Stop is the next user turn's marker.
func (Plain) Stop() []string { return []string{StopSequence} }

// Specials is what content is escaped against.
func (p Plain) Specials() Specials { return p.Special }
