package llamatok

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/runcontext"
)

// open writes the model for c and opens its vocabulary, closed at cleanup.
func open(t *testing.T, c modelgen.Config) *Tokenizer {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.gguf")
	if err := modelgen.WriteFile(path, c); err != nil {
		t.Fatal(err)
	}
	tok, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tok.Close() })
	return tok
}

func TestTokenizeBothVocabularies(t *testing.T) {
	for _, vocab := range []string{modelgen.VocabSPM, modelgen.VocabBPE} {
		t.Run(vocab, func(t *testing.T) {
			c := modelgen.DefaultConfig()
			c.Vocab = vocab
			tok := open(t, c)
			ids, err := tok.Tokenize("func main() { return nil }")
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) < 3 || len(ids) > 27 {
				t.Fatalf("got %d tokens %v for 26 bytes of code", len(ids), ids)
			}
			if vocab == modelgen.VocabSPM && ids[0] != 1 {
				t.Errorf("SentencePiece vocabulary should start with BOS (1), got %v", ids)
			}
			for _, id := range ids {
				if id < 0 || id >= c.VocabSize {
					t.Fatalf("token id %d outside vocabulary of %d", id, c.VocabSize)
				}
			}
		})
	}
}

// TestTurnMarkersAreFewTokens guards what the benchmarks rely on: the
// generated vocabularies hold ctxd's turn markers in a few tokens each, as
// a real model's vocabulary holds its chat template's, so a turn's cost is
// its text and not its headers.
func TestTurnMarkersAreFewTokens(t *testing.T) {
	for _, vocab := range []string{modelgen.VocabSPM, modelgen.VocabBPE} {
		t.Run(vocab, func(t *testing.T) {
			c := modelgen.DefaultConfig()
			c.Vocab, c.VocabSize = vocab, 4096
			tok := open(t, c)
			markers := runcontext.RenderAnswer("") + runcontext.RenderQuery("", nil)
			ids, err := tok.TokenizeText(markers)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) > 10 {
				t.Errorf("the markers between two turns %q take %d tokens, want at most 10", markers, len(ids))
			}
		})
	}
}

func TestOpenMissingFile(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Fatal("Open of a missing file succeeded")
	}
}

// TestChatTemplateMarkersAreSpecialTokens: a templated model's markers are
// one special token each, listed by Special, and its turn boundary takes
// a few tokens.
func TestChatTemplateMarkersAreSpecialTokens(t *testing.T) {
	for _, tc := range []struct{ template, vocab, boundary string }{
		{modelgen.TemplateChatML, modelgen.VocabSPM, "<|im_end|>\n<|im_start|>user\n"},
		{modelgen.TemplateChatML, modelgen.VocabBPE, "<|im_end|>\n<|im_start|>user\n"},
		{modelgen.TemplateLlama3, modelgen.VocabSPM, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"},
		{modelgen.TemplateLlama3, modelgen.VocabBPE, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"},
	} {
		t.Run(tc.template+"-"+tc.vocab, func(t *testing.T) {
			c := modelgen.DefaultConfig()
			c.Vocab, c.VocabSize, c.Template = tc.vocab, 2048, tc.template
			tok := open(t, c)
			special := tok.Special()
			for _, s := range []string{"<|im_start|>", "<|im_end|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"} {
				if !strings.Contains(tc.boundary, s) {
					continue
				}
				if !slices.Contains(special, s) {
					t.Errorf("%s is not among the special tokens %q", s, special)
				}
				if ids, _ := tok.TokenizeText(s); len(ids) != 1 {
					t.Errorf("%s tokenizes to %v, want one token", s, ids)
				}
			}
			if ids, _ := tok.TokenizeText(tc.boundary); len(ids) > 8 {
				t.Errorf("the turn boundary %q takes %d tokens, want at most 8", tc.boundary, len(ids))
			}
		})
	}
}
