package llamacpp

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Tokenizer counts tokens with the server's own vocabulary through
// POST /tokenize, for a server whose model file ctxd cannot read (it runs
// in a container, or on another machine behind a socket). Counts are
// exact, as the server's own; each one is a request, so a local model file
// (backend.gguf) is faster where there is one. It is safe for concurrent
// use.
type Tokenizer struct {
	c       Vocabulary
	ctx     context.Context // ended by Close: a count in flight stops
	cancel  context.CancelFunc
	timeout time.Duration
	special []string
}

// tokenizeTimeout bounds one count: the interface has no context, and a
// server that stops answering must not hold a request forever.
const tokenizeTimeout = 30 * time.Second

// knownSpecials are special token texts of widespread chat vocabularies,
// probed beside those the template names, so that content spelling one
// stays text even where the template does not use it.
var knownSpecials = []string{
	"<s>", "</s>", "<unk>", "<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_sep|>",
	"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
	"<|python_tag|>", "<|finetune_right_pad_id|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
	"[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
	"[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endofprompt|>",
	"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
	"<tool_call>", "</tool_call>", "<think>", "</think>", "<|start|>", "<|message|>", "<|channel|>", "<|return|>",
	"<|call|>", "<|constrain|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
}

// markerLike finds the texts in a chat template that look like special
// tokens: <…>, <|…|>, <｜…｜> and [MARKER] markers.
var markerLike = regexp.MustCompile(`<[|｜]?[^<>\s'"{}%]{1,48}[|｜]?>|\[/?[A-Za-z_]{2,32}\]`)

// NewTokenizer probes which texts the server's vocabulary turns into
// special tokens: the template's markers, bos and eos, and the known
// texts of common vocabularies. A text is taken as special when it
// tokenizes to one token: the API cannot tell a control or user-defined
// token (which llama.cpp splits out of text even when not parsing special
// tokens) from an ordinary token that happens to look like a marker, and
// escaping one of those only adds a zero-width space.
//
// c is llama-server's Client, or another server's of the same
// vocabulary calls; template is the chat template the server reports
// ("" for none) and also lists texts probed, such as its bos and eos.
func NewTokenizer(ctx context.Context, c Vocabulary, template string, also ...string) (*Tokenizer, error) {
	t := &Tokenizer{c: c, timeout: tokenizeTimeout}
	candidates := append(TemplateMarkers(template), also...)
	candidates = append(candidates, knownSpecials...)
	slices.Sort(candidates)
	for _, s := range slices.Compact(candidates) {
		if s == "" {
			continue
		}
		ids, err := c.Tokenize(ctx, s, false, true)
		if err != nil {
			return nil, fmt.Errorf("probing special tokens with the server: %w", err)
		}
		if len(ids) == 1 {
			t.special = append(t.special, s)
		}
	}
	slices.SortStableFunc(t.special, func(a, b string) int { return len(b) - len(a) })
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// Vocabulary is a server that tokenizes text with its model's
// vocabulary: with the tokens a whole prompt starts with if addSpecial,
// and special-token text parsed into those tokens if parseSpecial.
type Vocabulary interface {
	Tokenize(ctx context.Context, text string, addSpecial, parseSpecial bool) ([]int, error)
}

// TemplateMarkers lists the texts in a chat template that look like
// special tokens: <…>, <|…|>, <｜…｜> and [MARKER] markers.
func TemplateMarkers(template string) []string { return markerLike.FindAllString(template, -1) }

// Special lists the texts found to tokenize to special tokens, longest
// first. Unlike a tokenizer reading the model file it cannot list the
// whole vocabulary's: special tokens that neither the template (as
// literal text) nor a common vocabulary names are not in it.
func (t *Tokenizer) Special() []string { return slices.Clone(t.special) }

// Tokenize tokenizes a whole prompt as the server would a text prompt:
// BOS added where the vocabulary asks for it, special-token text parsed.
func (t *Tokenizer) Tokenize(prompt string) ([]int, error) { return t.tokenize(prompt, true) }

// TokenizeText tokenizes a piece of a prompt, without the tokens added at
// the start of a whole prompt.
func (t *Tokenizer) TokenizeText(text string) ([]int, error) { return t.tokenize(text, false) }

// CountText counts the tokens of a piece of a prompt.
func (t *Tokenizer) CountText(text string) (int, error) {
	ids, err := t.tokenize(text, false)
	return len(ids), err
}

func (t *Tokenizer) tokenize(text string, addSpecial bool) ([]int, error) {
	if text == "" && !addSpecial {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.timeout)
	defer cancel()
	ids, err := t.c.Tokenize(ctx, text, addSpecial, true)
	if err != nil {
		return nil, fmt.Errorf("llamacpp: tokenizing with the server: %w", err)
	}
	return ids, nil
}

// Close stops counts in flight; the vocabulary is the server's.
func (t *Tokenizer) Close() error {
	t.cancel()
	return nil
}
