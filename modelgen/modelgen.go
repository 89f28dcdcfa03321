package modelgen

import (
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ollama/ollama/fs/ggml"
	"github.com/x448/float16"
)

//go:embed corpus.txt
var corpus string

// Version changes whenever the same Config would write different bytes,
// so caches of generated models can key on it.
const Version = "4"

// Vocabulary kinds.
const (
	VocabSPM = "spm" // SentencePiece-style, GGUF tokenizer model "llama"
	VocabBPE = "bpe" // byte-level BPE, GGUF tokenizer model "gpt2"
)

// Config sizes a generated model.
type Config struct {
	Name          string // general.name
	Vocab         string // VocabSPM or VocabBPE
	VocabSize     int    // target vocabulary size (special and byte tokens included)
	Embedding     int    // n_embd
	Layers        int    // n_layer
	Heads         int    // n_head
	KVHeads       int    // n_head_kv
	FeedForward   int    // n_ff
	ContextLength int    // n_ctx_train
	F16           bool   // store weight matrices as f16 instead of f32
	Seed          uint64 // weight seed
	Template      string // chat template: "" (none), TemplateChatML or TemplateLlama3
}

// DefaultConfig is a tiny model that loads and evaluates fast.
func DefaultConfig() Config {
	return Config{
		Name: "ctxd-tiny", Vocab: VocabSPM, VocabSize: 1024,
		Embedding: 64, Layers: 2, Heads: 4, KVHeads: 2, FeedForward: 128,
		ContextLength: 8192, Seed: 1,
	}
}

// DemoConfig is the model `make run` serves: small enough to load in a
// second, big enough that a cold prompt takes visible time on a laptop CPU
// (5M parameters, 16k window), with a ChatML chat template as most models
// people run have.
func DemoConfig() Config {
	return Config{
		Name: "ctxd-demo", Vocab: VocabSPM, VocabSize: 4096,
		Embedding: 256, Layers: 4, Heads: 8, KVHeads: 4, FeedForward: 768,
		ContextLength: 16384, Seed: 1, Template: TemplateChatML,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Vocab != VocabSPM && c.Vocab != VocabBPE:
		return fmt.Errorf("modelgen: vocab %q: want %q or %q", c.Vocab, VocabSPM, VocabBPE)
	case c.VocabSize < 300:
		return fmt.Errorf("modelgen: vocab size %d: want at least 300", c.VocabSize)
	case c.Embedding <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.FeedForward <= 0:
		return errors.New("modelgen: embedding, layers, heads, kv heads and feed-forward must be positive")
	case c.Embedding%c.Heads != 0:
		return fmt.Errorf("modelgen: embedding %d is not a multiple of heads %d", c.Embedding, c.Heads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("modelgen: heads %d is not a multiple of kv heads %d", c.Heads, c.KVHeads)
	case (c.Embedding/c.Heads)%2 != 0:
		return fmt.Errorf("modelgen: head dimension %d must be even for rope", c.Embedding/c.Heads)
	case c.ContextLength < 16:
		return fmt.Errorf("modelgen: context length %d: want at least 16", c.ContextLength)
	case c.Template != "" && chatTemplates[c.Template].jinja == "":
		return fmt.Errorf("modelgen: template %q: want %q, %q or none", c.Template, TemplateChatML, TemplateLlama3)
	}
	return nil
}

// Params is the number of weights the model has.
func (c Config) Params() int64 {
	e, f, v := int64(c.Embedding), int64(c.FeedForward), int64(c.VocabSize)
	kv := e / int64(c.Heads) * int64(c.KVHeads)
	perLayer := 2*e + e*e*2 + 2*e*kv + 3*e*f
	return 2*e*v + e + int64(c.Layers)*perLayer
}

// WriteFile writes the model to path atomically (a temporary file renamed
// into place), so a crash never leaves half a model behind.
func WriteFile(path string, c Config) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".modelgen-*")
	if err != nil {
		return fmt.Errorf("modelgen: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := Write(tmp, c); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("modelgen: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("modelgen: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("modelgen: %w", err)
	}
	return nil
}

// keyKV is the GGUF key under which a generated model records Config.Key.
const keyKV = "ctxd.modelgen.key"

// Key names what Write would produce for c: the generator's Version and a
// digest of the config. Two files with the same key hold the same bytes.
func (c Config) Key() string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%+v", c))
	return Version + "-" + hex.EncodeToString(sum[:8])
}

// Current reports whether path holds the model Write would produce for c,
// reading only the file's metadata. A missing file is not current; a file
// that is not GGUF, or that another generator version wrote, is not either.
func Current(path string, c Config) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("modelgen: %w", err)
	}
	defer f.Close()
	g, _, err := ggml.Decode(f, 1)
	if err != nil {
		return false, nil
	}
	key, _ := g.KV()[keyKV].(string) // KV.String would prefix the architecture
	return key == c.Key(), nil
}

// Ensure writes the model to path unless path already holds it, and
// reports whether it wrote.
func Ensure(path string, c Config) (bool, error) {
	if ok, err := Current(path, c); err != nil || ok {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, fmt.Errorf("modelgen: %w", err)
	}
	return true, WriteFile(path, c)
}

// Write writes the model as GGUF to ws.
func Write(ws io.WriteSeeker, c Config) error {
	if err := c.Validate(); err != nil {
		return err
	}
	kv, err := c.tokenizerKV()
	if err != nil {
		return err
	}
	if t := chatTemplates[c.Template]; t.jinja != "" {
		kv["tokenizer.chat_template"] = t.jinja
	}
	maps := map[string]any{
		"general.architecture":                   "llama",
		"general.name":                           c.Name,
		"general.file_type":                      uint32(c.fileType()),
		"llama.context_length":                   uint32(c.ContextLength),
		"llama.embedding_length":                 uint32(c.Embedding),
		"llama.block_count":                      uint32(c.Layers),
		"llama.feed_forward_length":              uint32(c.FeedForward),
		"llama.attention.head_count":             uint32(c.Heads),
		"llama.attention.head_count_kv":          uint32(c.KVHeads),
		"llama.rope.dimension_count":             uint32(c.Embedding / c.Heads),
		"llama.rope.freq_base":                   float32(10000),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.vocab_size":                       uint32(c.VocabSize),
		keyKV:                                    c.Key(),
	}
	for k, v := range maps {
		kv[k] = v
	}
	tokens, _ := kv["tokenizer.ggml.tokens"].([]string)
	if err := ggml.WriteGGUF(ws, kv, c.tensors(brokenUTF8(tokens, kv["tokenizer.ggml.model"] == "gpt2"))); err != nil {
		return fmt.Errorf("modelgen: write gguf: %w", err)
	}
	return nil
}

func (c Config) fileType() int {
	if c.F16 {
		return 1 // MOSTLY_F16
	}
	return 0 // ALL_F32
}

// brokenUTF8 lists the tokens whose text alone is not valid UTF-8: the
// byte tokens of non-ASCII bytes, and (byte-level BPE) merges that split a
// character.
func brokenUTF8(tokens []string, byteLevel bool) []int {
	var ids []int
	for id, t := range tokens {
		var b []byte
		switch {
		case byteLevel:
			for _, r := range t {
				if x, ok := runeToByte[r]; ok {
					b = append(b, x)
				} else {
					b = utf8.AppendRune(b, r) // a special token's own text
				}
			}
		case len(t) == 6 && strings.HasPrefix(t, "<0x") && strings.HasSuffix(t, ">"):
			x, err := strconv.ParseUint(t[3:5], 16, 8)
			if err != nil {
				continue
			}
			b = []byte{byte(x)}
		default:
			b = []byte(t)
		}
		if !utf8.Valid(b) {
			ids = append(ids, id)
		}
	}
	return ids
}

// tensors are the weights. The output rows of the tokens in mute are zero:
// their logit is 0 where the others spread around it, so with the usual
// top-k sampling the model never emits them. A trained model does not
// emit half a character; a random one would, every few tokens, and
// llama-server's output parser rejects text that is not valid UTF-8.
func (c Config) tensors(mute []int) []ggml.Tensor {
	rng := rand.New(rand.NewPCG(c.Seed, 0x637478640a))
	e, f, v := uint64(c.Embedding), uint64(c.FeedForward), uint64(c.VocabSize)
	kvDim := e / uint64(c.Heads) * uint64(c.KVHeads)
	// Shapes are given outermost first (rows, cols); WriteGGUF reverses them.
	matrix := func(name string, rows, cols uint64) ggml.Tensor {
		return c.randomTensor(rng, name, []uint64{rows, cols}, 1/math.Sqrt(float64(cols)))
	}
	ts := []ggml.Tensor{
		matrix("token_embd.weight", v, e),
		ones("output_norm.weight", e),
		zeroRows(matrix("output.weight", v, e), mute),
	}
	for i := range c.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts,
			ones(p+"attn_norm.weight", e),
			matrix(p+"attn_q.weight", e, e),
			matrix(p+"attn_k.weight", kvDim, e),
			matrix(p+"attn_v.weight", kvDim, e),
			matrix(p+"attn_output.weight", e, e),
			ones(p+"ffn_norm.weight", e),
			matrix(p+"ffn_gate.weight", f, e),
			matrix(p+"ffn_up.weight", f, e),
			matrix(p+"ffn_down.weight", e, f),
		)
	}
	return ts
}

// randomTensor fills a weight matrix with uniform values in ±scale.
func (c Config) randomTensor(rng *rand.Rand, name string, shape []uint64, scale float64) ggml.Tensor {
	n := shape[0] * shape[1]
	if c.F16 {
		buf := make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(buf[2*i:], float16.Fromfloat32(float32((rng.Float64()*2-1)*scale)).Bits())
		}
		return ggml.Tensor{Name: name, Kind: 1, Shape: shape, WriterTo: bytesWriter(buf)}
	}
	buf := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32((rng.Float64()*2-1)*scale)))
	}
	return ggml.Tensor{Name: name, Kind: 0, Shape: shape, WriterTo: bytesWriter(buf)}
}

// zeroRows zeroes rows of a matrix from randomTensor.
func zeroRows(t ggml.Tensor, rows []int) ggml.Tensor {
	buf := t.WriterTo.(bytesWriter)
	rowBytes := len(buf) / int(t.Shape[0])
	for _, r := range rows {
		clear(buf[r*rowBytes : (r+1)*rowBytes])
	}
	return t
}

func ones(name string, n uint64) ggml.Tensor {
	buf := make([]byte, 4*n)
	for i := range n {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(1))
	}
	return ggml.Tensor{Name: name, Kind: 0, Shape: []uint64{n}, WriterTo: bytesWriter(buf)}
}

type bytesWriter []byte

func (b bytesWriter) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(b)
	return int64(n), err
}

// Token types as llama.cpp numbers them.
const (
	tokNormal  int32 = 1
	tokUnknown int32 = 2
	tokControl int32 = 3
	tokByte    int32 = 6
)

// tokenizerKV trains the vocabulary and returns its GGUF keys.
func (c Config) tokenizerKV() (ggml.KV, error) {
	if c.Vocab == VocabBPE {
		return c.bpeKV()
	}
	return c.spmKV()
}

func (c Config) spmKV() (ggml.KV, error) {
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{tokUnknown, tokControl, tokControl}
	for _, s := range chatTemplates[c.Template].special {
		tokens = append(tokens, s)
		types = append(types, tokControl)
	}
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, tokByte)
	}
	seen := map[string]bool{}
	add := func(piece string) {
		if seen[piece] || len(tokens) >= c.VocabSize {
			return
		}
		seen[piece] = true
		tokens = append(tokens, piece)
		types = append(types, tokNormal)
	}
	// Base characters first: printable ASCII and the space marker.
	add("▁")
	for r := rune('!'); r <= '~'; r++ {
		add(string(r))
	}
	words := countWords(c.trainingText(), spmSplit, utf8Symbols)
	for _, m := range trainMerges(words, c.VocabSize) {
		add(m.a + m.b)
	}
	if len(tokens) < c.VocabSize {
		return nil, fmt.Errorf("modelgen: corpus yields only %d tokens, want %d", len(tokens), c.VocabSize)
	}
	// Earlier merges score higher, as SentencePiece's BPE scores do.
	scores := make([]float32, len(tokens))
	for i := range scores {
		if types[i] == tokNormal {
			scores[i] = -float32(i)
		}
	}
	return ggml.KV{
		"tokenizer.ggml.model":            "llama",
		"tokenizer.ggml.tokens":           tokens,
		"tokenizer.ggml.scores":           scores,
		"tokenizer.ggml.token_type":       types,
		"tokenizer.ggml.unknown_token_id": uint32(0),
		"tokenizer.ggml.bos_token_id":     uint32(1),
		"tokenizer.ggml.eos_token_id":     uint32(2),
		"tokenizer.ggml.add_bos_token":    true,
		"tokenizer.ggml.add_eos_token":    false,
	}, nil
}

func (c Config) bpeKV() (ggml.KV, error) {
	tokens := make([]string, 0, c.VocabSize)
	types := make([]int32, 0, c.VocabSize)
	for b := range 256 {
		tokens = append(tokens, string(byteToRune[b]))
		types = append(types, tokNormal)
	}
	seen := map[string]bool{}
	for _, t := range tokens {
		seen[t] = true
	}
	words := countWords(c.trainingText(), gpt2Split, utf8Symbols)
	special := append([]string{"<|endoftext|>"}, chatTemplates[c.Template].special...)
	var merges []string
	for _, m := range trainMerges(words, c.VocabSize) {
		if len(tokens) >= c.VocabSize-len(special) {
			break
		}
		joined := m.a + m.b
		merges = append(merges, m.a+" "+m.b)
		if !seen[joined] {
			seen[joined] = true
			tokens = append(tokens, joined)
			types = append(types, tokNormal)
		}
	}
	if len(tokens) < c.VocabSize-len(special) {
		return nil, fmt.Errorf("modelgen: corpus yields only %d tokens, want %d", len(tokens)+len(special), c.VocabSize)
	}
	eos := uint32(len(tokens))
	for _, s := range special {
		tokens = append(tokens, s)
		types = append(types, tokControl)
	}
	return ggml.KV{
		"tokenizer.ggml.model":         "gpt2",
		"tokenizer.ggml.pre":           "gpt-2",
		"tokenizer.ggml.tokens":        tokens,
		"tokenizer.ggml.token_type":    types,
		"tokenizer.ggml.merges":        slices.Clip(merges),
		"tokenizer.ggml.bos_token_id":  eos,
		"tokenizer.ggml.eos_token_id":  eos,
		"tokenizer.ggml.add_bos_token": false,
	}, nil
}
