package modelgen

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// memFile is an in-memory io.WriteSeeker.
type memFile struct {
	buf []byte
	off int64
}

func (m *memFile) Write(p []byte) (int, error) {
	if need := m.off + int64(len(p)); need > int64(len(m.buf)) {
		m.buf = append(m.buf, make([]byte, need-int64(len(m.buf)))...)
	}
	copy(m.buf[m.off:], p)
	m.off += int64(len(p))
	return len(p), nil
}

func (m *memFile) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		m.off = off
	case io.SeekCurrent:
		m.off += off
	case io.SeekEnd:
		m.off = int64(len(m.buf)) + off
	}
	return m.off, nil
}

func TestDeterministicAndReadable(t *testing.T) {
	for _, vocab := range []string{VocabSPM, VocabBPE} {
		t.Run(vocab, func(t *testing.T) {
			c := DefaultConfig()
			c.Vocab = vocab
			var a, b memFile
			if err := Write(&a, c); err != nil {
				t.Fatal(err)
			}
			if err := Write(&b, c); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a.buf, b.buf) {
				t.Fatal("same config wrote different bytes")
			}
			path := filepath.Join(t.TempDir(), "m.gguf")
			if err := os.WriteFile(path, a.buf, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			g, _, err := ggml.Decode(f, -1)
			if err != nil {
				t.Fatalf("Ollama cannot decode the model: %v", err)
			}
			kv := g.KV()
			if kv.Architecture() != "llama" || kv.BlockCount() != uint64(c.Layers) || kv.ContextLength() != uint64(c.ContextLength) {
				t.Errorf("kv: arch %s blocks %d ctx %d", kv.Architecture(), kv.BlockCount(), kv.ContextLength())
			}
			var params uint64
			for _, ts := range g.Tensors().Items() {
				n := uint64(1)
				for _, d := range ts.Shape {
					n *= d
				}
				params += n
			}
			if int64(params) != c.Params() {
				t.Errorf("tensors hold %d parameters, Params says %d", params, c.Params())
			}
			if n := len(kv.Strings("tokenizer.ggml.tokens")); n != c.VocabSize {
				t.Errorf("vocabulary has %d tokens, want %d", n, c.VocabSize)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []Config{DefaultConfig(), DemoConfig()} {
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
	}
	bad := map[string]func(*Config){
		"vocab":      func(c *Config) { c.Vocab = "wordpiece" },
		"vocab size": func(c *Config) { c.VocabSize = 10 },
		"multiple":   func(c *Config) { c.Heads = 3 },
		"kv heads":   func(c *Config) { c.KVHeads = 3 },
		"context":    func(c *Config) { c.ContextLength = 4 },
	}
	for name, mutate := range bad {
		c := DefaultConfig()
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c := DefaultConfig()
	c.VocabSize = 1 << 20
	if err := Write(&memFile{}, c); err == nil || !strings.Contains(err.Error(), "corpus yields") {
		t.Errorf("oversized vocabulary: %v", err)
	}
}

func TestEnsureRewritesOnlyStaleModels(t *testing.T) {
	c := DefaultConfig()
	path := filepath.Join(t.TempDir(), "sub", "m.gguf")
	if ok, err := Current(path, c); err != nil || ok {
		t.Fatalf("Current of a missing file = %v, %v; want false, nil", ok, err)
	}
	if wrote, err := Ensure(path, c); err != nil || !wrote {
		t.Fatalf("first Ensure = %v, %v; want a write", wrote, err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if wrote, err := Ensure(path, c); err != nil || wrote {
		t.Fatalf("second Ensure = %v, %v; want no write", wrote, err)
	}
	if after, _ := os.Stat(path); !after.ModTime().Equal(before.ModTime()) {
		t.Error("Ensure rewrote a current model")
	}
	other := c
	other.Seed++
	if ok, _ := Current(path, other); ok {
		t.Error("a model written with another seed counts as current")
	}
	if wrote, err := Ensure(path, other); err != nil || !wrote {
		t.Fatalf("Ensure with another config = %v, %v; want a write", wrote, err)
	}
	if ok, _ := Current(path, other); !ok {
		t.Error("the rewritten model is not current")
	}
	if err := os.WriteFile(path, []byte("not gguf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := Current(path, other); err != nil || ok {
		t.Errorf("Current of a non-GGUF file = %v, %v; want false, nil", ok, err)
	}
}

// TestHalfCharactersAreMuted: the tokens that are not valid UTF-8 on their
// own (the byte tokens of non-ASCII bytes; in byte-level BPE also merges
// that split a character) are the ones whose output rows are zeroed, and
// no whole character or marker is.
func TestHalfCharactersAreMuted(t *testing.T) {
	for _, vocab := range []string{VocabSPM, VocabBPE} {
		c := DefaultConfig()
		c.Vocab, c.Template = vocab, TemplateChatML
		kv, err := c.tokenizerKV()
		if err != nil {
			t.Fatal(err)
		}
		tokens := kv["tokenizer.ggml.tokens"].([]string)
		muted := brokenUTF8(tokens, vocab == VocabBPE)
		if len(muted) < 128 {
			t.Errorf("%s: %d tokens muted, want at least the 128 non-ASCII bytes", vocab, len(muted))
		}
		for _, id := range muted {
			if tok := tokens[id]; tok == "<|im_start|>" || tok == "<|im_end|>" || tok == "<s>" || tok == "</s>" || tok == "<|endoftext|>" || tok == "a" || tok == "<0x41>" {
				t.Errorf("%s: %q muted", vocab, tok)
			}
		}
	}
	if got := brokenUTF8([]string{"<0x41>", "<0xE2>", "é", "<0xZZ>"}, false); len(got) != 1 || got[0] != 1 {
		t.Errorf("SentencePiece: muted %v, want [1]", got)
	}
	é := string([]rune{byteToRune[0xC3], byteToRune[0xA9]})
	if got := brokenUTF8([]string{é, string(byteToRune[0xC3]), "a"}, true); len(got) != 1 || got[0] != 1 {
		t.Errorf("byte-level BPE: muted %v, want [1]", got)
	}
}
