package modelgen

import (
	"strings"

	"github.com/ctxd/ctxd/runcontext"
)

// Chat templates a generated model can carry.
const (
	TemplateChatML = "chatml" // <|im_start|>role ... <|im_end|>, as Qwen and many others
	TemplateLlama3 = "llama3" // <|start_header_id|>role<|end_header_id|> ... <|eot_id|>, as Llama 3
)

// chatTemplate is a template's Jinja text (as a model's GGUF carries it in
// tokenizer.chat_template) and the special tokens its markers use.
type chatTemplate struct {
	jinja   string
	special []string
	// turn renders one message as the template does, for the vocabulary's
	// training text.
	turn func(role, content string) string
}

// chatTemplates holds the Jinja texts byte for byte as Ollama's template
// index lists them, so Ollama recognizes them exactly, and llama.cpp
// renders them from the GGUF itself.
var chatTemplates = map[string]chatTemplate{
	TemplateChatML: {
		jinja:   `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`,
		special: []string{"<|im_start|>", "<|im_end|>"},
		turn: func(role, content string) string {
			return "<|im_start|>" + role + "\n" + content + "<|im_end|>\n"
		},
	},
	TemplateLlama3: {
		jinja:   `{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`,
		special: []string{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
		turn: func(role, content string) string {
			return "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>"
		},
	},
}

// transcriptTurns is how many rendered turns the training text carries:
// enough that every turn marker is merged into a few tokens.
const transcriptTurns = 120

// trainingText is the corpus followed by a conversation rendered in the
// model's own format: its chat template's, or ctxd's plain turn markers
// for a model without one. A real model's vocabulary holds its format's
// role names and separators as one or a few tokens; without this, a
// vocabulary trained on Go source alone spells "ASSISTANT" letter by
// letter and every turn pays a dozen tokens for its headers.
func (c Config) trainingText() string {
	var lines []string
	for _, l := range strings.Split(corpus, "\n") {
		if t, ok := strings.CutPrefix(strings.TrimSpace(l), "// "); ok && len(t) > 20 {
			lines = append(lines, t)
		}
	}
	var sb strings.Builder
	sb.WriteString(corpus)
	sb.WriteString("\n")
	t := chatTemplates[c.Template]
	for i := 0; i < transcriptTurns && 2*i+1 < len(lines); i++ {
		if t.turn != nil {
			sb.WriteString(t.turn("user", lines[2*i]))
			sb.WriteString(t.turn("assistant", lines[2*i+1]))
			continue
		}
		sb.WriteString(runcontext.RenderQuery(lines[2*i], nil))
		sb.WriteString(runcontext.RenderAnswer(lines[2*i+1]))
	}
	if t.turn == nil {
		return sb.String()
	}
	for i := 0; i < 20 && i < len(lines); i++ {
		sb.WriteString(t.turn("system", lines[i]))
	}
	// The special tokens are parsed whole before the vocabulary's merges
	// apply: what merges should learn is the text around them.
	text := sb.String()
	for _, s := range t.special {
		text = strings.ReplaceAll(text, s, "\n")
	}
	return text
}

// ChatTemplate is the Jinja text a model with template name carries, and
// the special tokens its markers use; "" and nil for an unknown name.
func ChatTemplate(name string) (jinja string, special []string) {
	t := chatTemplates[name]
	return t.jinja, t.special
}
