package llamatok

import (
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/ollama/ollama/llama"
)

var backendOnce sync.Once

// Tokenizer tokenizes with one model's vocabulary. It is safe for
// concurrent use.
type Tokenizer struct {
	path    string
	special []string     // texts the tokenizer turns into special tokens, longest first
	longest int          // bytes of the vocabulary's longest token text
	mu      sync.RWMutex // guards model: tokenizing shares it (llama.cpp's vocabulary is read-only), Close takes it
	model   *llama.Model
}

// Open loads the vocabulary of the GGUF model at path.
func Open(path string) (*Tokenizer, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("llamatok: %w", err)
	}
	special, longest, err := vocabFacts(path)
	if err != nil {
		return nil, err
	}
	backendOnce.Do(llama.BackendInit)
	m, err := llama.LoadModelFromFile(path, llama.ModelParams{VocabOnly: true, UseMmap: true})
	if err != nil {
		return nil, fmt.Errorf("llamatok: load vocabulary of %s: %w", path, err)
	}
	return &Tokenizer{path: path, special: special, longest: longest, model: m}, nil
}

// GGUF token types llama.cpp parses out of a prompt as special tokens
// (llama.h: LLAMA_TOKEN_TYPE_UNKNOWN, _CONTROL, _USER_DEFINED).
const (
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
)

// vocabFacts reads from the model's GGUF metadata the texts of the
// vocabulary's special tokens, longest first, and the length in bytes of
// its longest token text.
func vocabFacts(path string) ([]string, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("llamatok: %w", err)
	}
	defer f.Close()
	g, _, err := ggml.Decode(f, -1)
	if err != nil {
		return nil, 0, fmt.Errorf("llamatok: read %s: %w", path, err)
	}
	kv := g.KV()
	tokens, types := kv.Strings("tokenizer.ggml.tokens"), kv.Uints("tokenizer.ggml.token_type")
	// The bound holds for the vocabularies that keep every byte of a text
	// (SentencePiece and byte-level BPE); WordPiece and Unigram ones
	// normalize and drop white space, so no longest token is stated.
	longest := 0
	if m := kv.String("tokenizer.ggml.model"); m == "llama" || m == "gpt2" {
		for _, t := range tokens {
			longest = max(longest, len(t))
		}
	}
	var out []string
	for i, typ := range types {
		if i < len(tokens) && tokens[i] != "" && (typ == typeUnknown || typ == typeControl || typ == typeUserDefined) {
			out = append(out, tokens[i])
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, longest, nil
}

// MaxTokenBytes is the length in bytes of the vocabulary's longest token
// text: no token stands for more bytes of text (see codex.Bound). It is 0
// (no bound) for vocabularies that normalize text.
func (t *Tokenizer) MaxTokenBytes() int { return t.longest }

// Special lists the texts that tokenize to the vocabulary's special tokens
// (control, user-defined and unknown tokens, as llama.cpp parses them out
// of a prompt), longest first. Content that contains one would turn into
// that token.
func (t *Tokenizer) Special() []string { return slices.Clone(t.special) }

// Tokenize returns the token ids of a whole prompt as the runner makes
// them: special tokens added (BOS where the vocabulary asks for it) and
// special-token text parsed.
func (t *Tokenizer) Tokenize(prompt string) ([]int, error) {
	return t.tokenize(prompt, true)
}

// CountText counts the tokens of a piece of a prompt, without the special
// tokens added at the start of a whole prompt.
func (t *Tokenizer) CountText(text string) (int, error) {
	ids, err := t.tokenize(text, false)
	return len(ids), err
}

// TokenizeText tokenizes a piece of a prompt, without the special tokens
// added at the start of a whole prompt.
func (t *Tokenizer) TokenizeText(text string) ([]int, error) {
	return t.tokenize(text, false)
}

func (t *Tokenizer) tokenize(text string, addSpecial bool) ([]int, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.model == nil {
		return nil, fmt.Errorf("llamatok: tokenizer for %s is closed", t.path)
	}
	if text == "" && !addSpecial {
		return nil, nil
	}
	ids, err := t.model.Tokenize(text, addSpecial, true)
	if err != nil {
		return nil, fmt.Errorf("llamatok: %w", err)
	}
	return ids, nil
}

// Count returns the number of tokens of a whole prompt.
func (t *Tokenizer) Count(prompt string) (int, error) {
	ids, err := t.Tokenize(prompt)
	return len(ids), err
}

// Close frees the vocabulary.
func (t *Tokenizer) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.model != nil {
		llama.FreeModel(t.model)
		t.model = nil
	}
	return nil
}
