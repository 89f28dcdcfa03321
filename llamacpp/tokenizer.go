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
	c       *Client
	timeout time.Duration
	special []string
}

// tokenizeTimeout bounds one count: the interface has no context, and a
// server that stops answering must not hold a request forever.
const tokenizeTimeout = 60 * time.Second

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
// tokens: <…>, <|…|>, <｜…｜> and [UPPER] markers.
var markerLike = regexp.MustCompile(`<[|｜]?[^<>\s'"{}%]{1,48}[|｜]?>|\[/?[A-Z_]{2,32}\]`)

// NewTokenizer probes which texts the server's vocabulary turns into
// special tokens: the template's markers, bos and eos, and the known
// texts of common vocabularies. A text is special when parsing special
// tokens makes it one token and reading it as plain text does not.
func NewTokenizer(ctx context.Context, c *Client, p Props) (*Tokenizer, error) {
	t := &Tokenizer{c: c, timeout: tokenizeTimeout}
	candidates := append(markerLike.FindAllString(p.ChatTemplate, -1), p.BOS, p.EOS)
	candidates = append(candidates, knownSpecials...)
	slices.Sort(candidates)
	for _, s := range slices.Compact(candidates) {
		if s == "" {
			continue
		}
		parsed, err := c.Tokenize(ctx, s, false, true)
		if err != nil {
			return nil, fmt.Errorf("llamacpp: probing special tokens: %w", err)
		}
		if len(parsed) != 1 {
			continue
		}
		plain, err := c.Tokenize(ctx, s, false, false)
		if err != nil {
			return nil, fmt.Errorf("llamacpp: probing special tokens: %w", err)
		}
		if !slices.Equal(plain, parsed) {
			t.special = append(t.special, s)
		}
	}
	slices.SortStableFunc(t.special, func(a, b string) int { return len(b) - len(a) })
	return t, nil
}

// Special lists the texts found to tokenize to special tokens, longest
// first. Unlike a tokenizer reading the model file it cannot list the
// whole vocabulary's: special tokens that neither the template nor a
// common vocabulary names are not in it.
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
	ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
	defer cancel()
	ids, err := t.c.Tokenize(ctx, text, addSpecial, true)
	if err != nil {
		return nil, fmt.Errorf("llamacpp: tokenizing with the server: %w", err)
	}
	return ids, nil
}

// Close does nothing: the vocabulary is the server's.
func (t *Tokenizer) Close() error { return nil }
