// Package chattemplate renders a RunContext in the model's own chat
// template, with the code Ollama runs for its /api/chat (Ollama's template
// package, over the Go template Ollama derived from the model's GGUF), so
// the prompt ctxd sends raw is the prompt Ollama itself would build.
//
// The blocks map onto messages in cache order: identity, codex,
// environment, sigil and karma are the system message (their plain
// renderings, ### headers and stable artifacts included, as its content);
// a condensed summary of earlier turns is a second system message, which
// the template joins to the first; the state is the alternating user and
// assistant turns, each user turn carrying the codex excerpts retrieved
// for it; the query is the last user message (its excerpts, then the
// volatile artifacts, then its text). The rendered prompt is still seven blocks: the
// template's text before the system content joins the identity block, its
// text after it (the close of the system message and the turns) is the
// state, and the query block starts at the last user message's content.
// No message content starts or ends with white space (the karma block's
// closing blank line is left out, user and assistant content is trimmed),
// so templates that trim content, as Llama 3's Jinja does, render ctxd's
// messages exactly as Ollama's Go templates do.
//
// Content cannot forge a marker: the template's role markers are special
// tokens, and every piece of content is escaped against the vocabulary's
// special token texts (runcontext.Specials). The system message holds the
// blocks' ### headers, so its content, the summary included, is escaped as
// the plain format escapes it (runcontext.Escape); so are the excerpts and
// artifacts of a user message, rendered as in the plain format. A query's
// and an answer's own text is not: no ### line marks a turn there.
//
// A template is checked when it is loaded: it must place message content
// verbatim (so the stable blocks can be rendered once and shared, not
// re-rendered per request), and rendering turn n+1 should extend turn n
// plus its answer byte for byte. A template that does not is reported,
// not trusted.
package chattemplate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/template"

	"github.com/ctxd/ctxd/runcontext"
)

// DefaultTemplate is what Ollama serves for a model without a chat
// template: the prompt as it is. Such a model gets ctxd's plain format.
const DefaultTemplate = "{{ .Prompt }}"

// Format renders prompts in one chat template.
type Format struct {
	tmpl    *template.Template
	stop    []string
	special runcontext.Specials
	check   Check
	tools   toolSupport
}

var _ runcontext.Format = (*Format)(nil)

// Check is what loading found about a template.
type Check struct {
	// AppendOnly: turn n+1's prompt extends turn n's plus its answer.
	AppendOnly bool `json:"append_only"`
	// Note says why not, and which block breaks, when it is not.
	Note string `json:"note,omitempty"`
	// Tools says what the template does with tools: whether it offers
	// the client's tools, and the syntax it writes a call in.
	Tools string `json:"tools,omitempty"`
}

// Sentinels stand for the system content and the query while the template
// renders: the stable blocks are put in afterwards, unrendered, so the
// codex is never copied through the template engine per request.
const (
	systemSentinel = "\x1fctxd:system\x1f"
	querySentinel  = "\x1fctxd:query\x1f"
)

// ErrNoTemplate means the model has no chat template of its own.
var ErrNoTemplate = errors.New("chattemplate: the model has no chat template")

// New parses a Go chat template (as Ollama's /api/show returns it) with
// the stop sequences of the model's parameters and the special token texts
// of its vocabulary, and checks it. A template that cannot render ctxd's
// blocks verbatim is an error; one that is not append-only is usable, and
// Check says so.
func New(text string, stop []string, special runcontext.Specials) (*Format, error) {
	if strings.TrimSpace(text) == "" || strings.TrimSpace(text) == DefaultTemplate {
		return nil, ErrNoTemplate
	}
	t, err := template.Parse(text)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: parse: %w", err)
	}
	f := &Format{tmpl: t, stop: stop, special: special}
	if err := f.verify(); err != nil {
		return nil, err
	}
	f.loadTools()
	return f, nil
}

// Name is "template".
func (f *Format) Name() string { return "template" }

// Stop is the template's stop sequences.
func (f *Format) Stop() []string { return f.stop }

// Specials is what content is escaped against.
func (f *Format) Specials() runcontext.Specials { return f.special }

// Check is what loading found.
func (f *Format) Check() Check { return f.check }

// Answer is the answer's content as the next prompt holds it, right after
// the prompt it answered (trimmed, escaped; tool calls the session
// recorded as the template writes calls); the template's end-of-turn text
// follows it.
func (f *Format) Answer(answer string) string {
	if text, ok := f.callsText(answer); ok {
		return text
	}
	return f.answerText(answer)
}

// answerText is a text answer as a message's content: trimmed, escaped.
func (f *Format) answerText(answer string) string { return f.special.Escape(strings.TrimSpace(answer)) }

// Render renders rc in the template. It does not validate.
func (f *Format) Render(rc *runcontext.RunContext) (runcontext.Rendered, error) {
	r := f.stable(rc)
	tools, err := f.apiTools(rc)
	if err != nil {
		return r, err
	}
	out, err := f.execute(f.messages(rc, systemSentinel, querySentinel), tools)
	if err != nil {
		return r, err
	}
	si, qi := strings.Index(out, systemSentinel), strings.LastIndex(out, querySentinel)
	if si < 0 || qi < si || strings.Count(out, systemSentinel) != 1 {
		return r, fmt.Errorf("chattemplate: the template does not place the system message verbatim")
	}
	r.Blocks[runcontext.BlockIdentity] = out[:si] + r.Blocks[runcontext.BlockIdentity]
	r.Blocks[runcontext.BlockState] = out[si+len(systemSentinel) : qi]
	r.Blocks[runcontext.BlockQuery] = f.query(rc) + out[qi+len(querySentinel):]
	return r, nil
}

// stable renders the stable blocks as the system message holds them: the
// plain renderings with their artifacts (the codex prerendered and
// escaped), escaped, without the blank line that closes the last.
func (f *Format) stable(rc *runcontext.RunContext) runcontext.Rendered {
	r := runcontext.RenderStable(rc, f.special)
	r.Blocks[runcontext.BlockKarma] = strings.TrimRight(r.Blocks[runcontext.BlockKarma], " \t\n")
	return r
}

// messages maps rc's blocks onto chat messages, with system and query as
// the contents of the system message and the last user message.
func (f *Format) messages(rc *runcontext.RunContext, system, query string) []api.Message {
	msgs := []api.Message{{Role: "system", Content: system}}
	if s := rc.State.Summary; s != "" {
		// System content, next to the blocks' ### headers: escaped as
		// the blocks are, so it cannot add one.
		msgs = append(msgs, api.Message{Role: "system", Content: "[summary of earlier turns]\n" + f.special.Escape(runcontext.Escape(strings.TrimSpace(s)))})
	}
	for _, t := range rc.State.Turns {
		msgs = append(msgs,
			api.Message{Role: "user", Content: f.userContent(t.Query, t.Excerpts, "")},
			f.assistant(t.Answer))
	}
	return append(msgs, api.Message{Role: "user", Content: query})
}

// query is the last user message's content: the query's excerpts, the
// volatile artifacts, the query's text.
func (f *Format) query(rc *runcontext.RunContext) string {
	return f.userContent(rc.Query.Text, rc.Query.Excerpts, runcontext.RenderArtifacts(rc.Artifacts, runcontext.BlockQuery))
}

// userContent is a user turn's content: its codex excerpts, then the
// rendered volatile artifacts arts (the query's only), then its text.
func (f *Format) userContent(text string, excerpts []runcontext.Excerpt, arts string) string {
	var sb strings.Builder
	for _, e := range excerpts {
		sb.WriteString(runcontext.RenderExcerpt(e))
	}
	sb.WriteString(arts)
	sb.WriteString(text)
	return f.special.Escape(strings.TrimSpace(sb.String()))
}

func (f *Format) execute(msgs []api.Message, tools api.Tools) (string, error) {
	var sb strings.Builder
	if err := f.tmpl.Execute(&sb, template.Values{Messages: msgs, Tools: tools}); err != nil {
		return "", fmt.Errorf("chattemplate: render: %w", err)
	}
	return sb.String(), nil
}

// Messages is the conversation a prompt renders, as chat messages with
// their content in full: what a client of Ollama's /api/chat would send
// for the same prompt.
func (f *Format) Messages(rc *runcontext.RunContext) []api.Message {
	r := f.stable(rc)
	return f.messages(rc, r.Prompt(), f.query(rc))
}

// verify checks, on a probe conversation, that rendering with the
// sentinels equals rendering the messages in full (content verbatim), and
// whether each turn extends the one before.
func (f *Format) verify() error {
	c, err := f.checkTurns(probe())
	f.check = c
	return err
}

// checkTurns renders rc's conversation one turn longer each time: an
// error if the template does not render content verbatim, and whether
// each turn extends the one before.
func (f *Format) checkTurns(rc *runcontext.RunContext) (Check, error) {
	var prev runcontext.Rendered
	check := Check{AppendOnly: true}
	for n := 0; n <= len(rc.State.Turns); n++ {
		cur := *rc
		cur.State.Turns = rc.State.Turns[:n]
		if n < len(rc.State.Turns) {
			cur.Query = runcontext.Query{Text: rc.State.Turns[n].Query, Excerpts: rc.State.Turns[n].Excerpts}
		}
		r, err := f.Render(&cur)
		if err != nil {
			return check, err
		}
		tools, err := f.apiTools(&cur)
		if err != nil {
			return check, err
		}
		whole, err := f.execute(f.Messages(&cur), tools)
		if err != nil {
			return check, err
		}
		if r.Prompt() != whole {
			return check, fmt.Errorf("chattemplate: the template does not render message content verbatim (it trims or rewrites it): ctxd cannot share the stable blocks between requests")
		}
		if n > 0 && check.AppendOnly {
			answer := f.Answer(rc.State.Turns[n-1].Answer)
			if b := runcontext.Compare(prev, r, answer); b != nil {
				check = Check{AppendOnly: false, Note: fmt.Sprintf("turn %d does not extend turn %d and its answer: the %s block changes (%s)", n+1, n, b.Block, b.Reason)}
			} else if !strings.HasPrefix(r.Prompt(), prev.Prompt()+answer) {
				check = Check{AppendOnly: false, Note: fmt.Sprintf("turn %d does not extend turn %d and its answer", n+1, n)}
			}
		}
		prev = r
	}
	return check, nil
}

// probe is a conversation that exercises what ctxd renders: whitespace at
// the ends of content, excerpts, several turns.
func probe() *runcontext.RunContext {
	return &runcontext.RunContext{
		Identity:    runcontext.Identity{Name: "probe", Persona: "Persona line.\n"},
		Codex:       runcontext.Codex{Mode: runcontext.ModeNone},
		Environment: runcontext.Environment{VRAM: "low", GPU: "none", Power: "ac", Connectivity: "online"},
		Sigil:       runcontext.Sigil{Name: "default", Scopes: []string{"ask"}},
		State: runcontext.State{Turns: []runcontext.Turn{
			{Query: "first question", Answer: " an answer with spaces \n", Excerpts: []runcontext.Excerpt{{Path: "a.go", Lines: "1-2", Text: "package a\n"}}},
			{Query: "second question\n", Answer: "second answer"},
			{Query: "third question", Answer: "third answer"},
		}},
		Query: runcontext.Query{Text: "last question"},
	}
}

// FromJinja is the format for a model whose GGUF carries the Jinja chat
// template jinja, as Ollama would render it: the Go template Ollama's own
// index maps the Jinja to (what /api/create stores), with its stop
// sequences. A Jinja Ollama does not know is ErrUnknownJinja.
func FromJinja(jinja string, special runcontext.Specials) (*Format, error) {
	return fromJinja(jinja, special, false)
}

// fromJinja is FromJinja, with the Go template's trailing whitespace left
// out when trim is set.
func fromJinja(jinja string, special runcontext.Specials, trim bool) (*Format, error) {
	if strings.TrimSpace(jinja) == "" {
		return nil, ErrNoTemplate
	}
	n, err := template.Named(jinja)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnknownJinja, err)
	}
	var stop []string
	if n.Parameters != nil {
		stop = n.Parameters.Stop
	}
	text := string(n.Bytes)
	if trim {
		text = strings.TrimRight(text, " \t\n")
	}
	return New(text, stop, special)
}

// FromJinjaTrimmed is FromJinja with the Go template's trailing
// whitespace left out. Ollama's templates are files that end with a
// newline, which it renders after the generation prompt; a model's own
// Jinja may not write it (Gemma 3's: "<start_of_turn>model\n", where
// Ollama's gemma3-instruct renders "<start_of_turn>model\n\n", so that
// its turns do not extend one another). A renderer that runs the Jinja
// itself (llama-server) is matched by this one.
func FromJinjaTrimmed(jinja string, special runcontext.Specials) (*Format, error) {
	return fromJinja(jinja, special, true)
}

// ErrUnknownJinja means no Go template matches the model's Jinja one.
var ErrUnknownJinja = errors.New("chattemplate: no Go template matches the model's Jinja chat template")

// Agrees checks the format against another renderer of the same template
// (llama-server's /apply-template, which runs the model's Jinja): the probe
// conversation, one turn longer each time, must render the same, but for
// a BOS token's text the other may write before it (ctxd's prompt carries
// BOS as a token).
func (f *Format) Agrees(other func([]Message) (string, error), bos string) error {
	rc := probe()
	for n := 0; n <= len(rc.State.Turns); n++ {
		cur := *rc
		cur.State.Turns = rc.State.Turns[:n]
		if n < len(rc.State.Turns) {
			cur.Query = runcontext.Query{Text: rc.State.Turns[n].Query, Excerpts: rc.State.Turns[n].Excerpts}
		}
		r, err := f.Render(&cur)
		if err != nil {
			return err
		}
		theirs, err := other(plainMessages(f.Messages(&cur)))
		if err != nil {
			return fmt.Errorf("chattemplate: the other renderer: %w", err)
		}
		// The other renderer may write the BOS token's text first, where
		// ctxd's prompt carries BOS as a token; but a template may also
		// open with that text itself (SmolLM2's BOS is <|im_start|>, with
		// which every ChatML turn opens): only a leading BOS more than
		// ctxd's prompt has is left out.
		if bos != "" && theirs != r.Prompt() {
			theirs = strings.TrimPrefix(theirs, bos)
		}
		if theirs != r.Prompt() {
			i := 0
			for i < len(theirs) && i < len(r.Prompt()) && theirs[i] == r.Prompt()[i] {
				i++
			}
			return fmt.Errorf("chattemplate: the model's own template renders %d turns differently from byte %d: %q, where ctxd has %q",
				n, i, clip(theirs[i:]), clip(r.Prompt()[i:]))
		}
	}
	return nil
}

func clip(s string) string { return s[:min(len(s), 60)] }

// Message is one message of a conversation as another renderer of the
// template takes it (llama-server's /apply-template): a role and its text.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// plainMessages are msgs as Messages (the probe conversation has no tool
// calls or images).
func plainMessages(msgs []api.Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = Message{Role: m.Role, Content: m.Content}
	}
	return out
}
