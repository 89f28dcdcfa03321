package realmodel

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/modelgen"
)

// TestWithChatTemplate gives a generated model without a template one,
// then another in its place: the file reads back with that template and
// every other key as it was, and its weights are the same bytes at the
// end of the file.
func TestWithChatTemplate(t *testing.T) {
	dir := t.TempDir()
	src, one, two := filepath.Join(dir, "m.gguf"), filepath.Join(dir, "one.gguf"), filepath.Join(dir, "two.gguf")
	cfg := modelgen.Config{Name: "t", Vocab: modelgen.VocabSPM, VocabSize: 512, Embedding: 64, Layers: 2, Heads: 4, KVHeads: 2, FeedForward: 128, ContextLength: 1024, Seed: 3}
	if err := modelgen.WriteFile(src, cfg); err != nil {
		t.Fatal(err)
	}
	before, _, err := llamacpp.ModelInfo(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := before[chatTemplateKey]; ok {
		t.Fatal("the generated model already has a template")
	}
	jinja, err := OllamaTemplate("gemma3-instruct")
	if err != nil {
		t.Fatal(err)
	}
	if err := WithChatTemplate(src, one, "{{ first }}"); err != nil {
		t.Fatal(err)
	}
	if err := WithChatTemplate(one, two, jinja); err != nil {
		t.Fatal(err)
	}
	after, _, err := llamacpp.ModelInfo(two)
	if err != nil {
		t.Fatal(err)
	}
	if after[chatTemplateKey] != jinja {
		t.Errorf("template %q", after[chatTemplateKey])
	}
	delete(after, chatTemplateKey)
	if len(after) != len(before) {
		t.Errorf("%d keys, the model had %d", len(after), len(before))
	}
	for k, v := range before {
		if a, ok := after[k]; !ok || !equalValue(a, v) {
			t.Errorf("%s: %v, was %v", k, a, v)
		}
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(two)
	const tail = 64 << 10
	if len(a) < tail || !bytes.Equal(a[len(a)-tail:], b[len(b)-tail:]) {
		t.Error("the weights at the end of the file differ")
	}
}

func equalValue(a, b any) bool {
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok != bok {
		return false
	}
	if !aok {
		return a == b
	}
	if len(as) != len(bs) {
		return false
	}
	for i := range as {
		if as[i] != bs[i] {
			return false
		}
	}
	return true
}
