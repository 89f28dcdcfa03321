package realmodel

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/internal/reporoot"
)

// chatTemplateKey is the GGUF key of a model's Jinja chat template.
const chatTemplateKey = "tokenizer.chat_template"

// WithChatTemplate writes dst: the GGUF model src with its chat template
// set to jinja (added, or in place of the one it has), every other key,
// tensor and byte of weights as they were. It is how the tests give a
// model published without a template (Gemma 3 270M, the base model) the
// template its instruction-tuned sibling carries.
func WithChatTemplate(src, dst, jinja string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	r := &countingReader{r: bufio.NewReaderSize(in, 1<<20)}
	var head struct {
		Magic   [4]byte
		Version uint32
		Tensors uint64
		KVs     uint64
	}
	if err := binary.Read(r, binary.LittleEndian, &head); err != nil {
		return fmt.Errorf("realmodel: %s: %w", src, err)
	}
	if string(head.Magic[:]) != "GGUF" || head.Version < 2 {
		return fmt.Errorf("realmodel: %s is not a GGUF v2 or v3 file", src)
	}
	// The keys, raw, but the template's; the alignment of the data.
	var kvs []byte
	kvCount := head.KVs
	alignment := uint64(32)
	for range head.KVs {
		key, err := readString(r)
		if err != nil {
			return fmt.Errorf("realmodel: %s: key: %w", src, err)
		}
		var typ uint32
		if err := binary.Read(r, binary.LittleEndian, &typ); err != nil {
			return err
		}
		val, err := readValue(r, typ)
		if err != nil {
			return fmt.Errorf("realmodel: %s: %s: %w", src, key, err)
		}
		if key == chatTemplateKey {
			kvCount--
			continue
		}
		if key == "general.alignment" && typ == 4 {
			alignment = uint64(binary.LittleEndian.Uint32(val))
		}
		kvs = append(kvs, ggufString(key)...)
		kvs = binary.LittleEndian.AppendUint32(kvs, typ)
		kvs = append(kvs, val...)
	}
	kvs = append(kvs, ggufString(chatTemplateKey)...)
	kvs = binary.LittleEndian.AppendUint32(kvs, 8)
	kvs = append(kvs, ggufString(jinja)...)
	kvCount++
	// The tensor infos: their offsets are relative to the data section,
	// which only moves.
	var infos []byte
	for range head.Tensors {
		name, err := readString(r)
		if err != nil {
			return fmt.Errorf("realmodel: %s: tensor: %w", src, err)
		}
		var dims uint32
		if err := binary.Read(r, binary.LittleEndian, &dims); err != nil {
			return err
		}
		rest := make([]byte, 8*int(dims)+4+8) // the dimensions, the type, the offset
		if _, err := io.ReadFull(r, rest); err != nil {
			return err
		}
		infos = append(infos, ggufString(name)...)
		infos = binary.LittleEndian.AppendUint32(infos, dims)
		infos = append(infos, rest...)
	}
	if pad := (alignment - r.n%alignment) % alignment; pad > 0 {
		if _, err := io.CopyN(io.Discard, r, int64(pad)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".gguf-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	w := bufio.NewWriterSize(tmp, 1<<20)
	out := binary.LittleEndian.AppendUint32([]byte("GGUF"), head.Version)
	out = binary.LittleEndian.AppendUint64(out, head.Tensors)
	out = binary.LittleEndian.AppendUint64(out, kvCount)
	out = append(append(out, kvs...), infos...)
	out = append(out, make([]byte, (alignment-uint64(len(out))%alignment)%alignment)...)
	if _, err := w.Write(out); err != nil {
		tmp.Close()
		return err
	}
	if _, err := io.Copy(w, r); err != nil {
		tmp.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// countingReader counts the bytes read, for the alignment of the data.
type countingReader struct {
	r io.Reader
	n uint64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += uint64(n)
	return n, err
}

func ggufString(s string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(len(s))), s...)
}

func readString(r io.Reader) (string, error) {
	var n uint64
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return "", err
	}
	if n > 1<<30 {
		return "", errors.New("a string longer than 1 GiB")
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return string(b), err
}

// scalarSize is the size of GGUF's fixed-size value types.
var scalarSize = map[uint32]int{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

// readValue reads a value of type typ and returns its bytes as stored.
func readValue(r io.Reader, typ uint32) ([]byte, error) {
	if n, ok := scalarSize[typ]; ok {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	switch typ {
	case 8:
		s, err := readString(r)
		return ggufString(s), err
	case 9:
		var head [12]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return nil, err
		}
		elem, count := binary.LittleEndian.Uint32(head[:4]), binary.LittleEndian.Uint64(head[4:])
		out := head[:]
		for range count {
			v, err := readValue(r, elem)
			if err != nil {
				return nil, err
			}
			out = append(out, v...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown value type %d", typ)
}

// Gemma3Chat is Gemma 3 270M (the base model, published without a chat
// template) with the template of Gemma 3's instruction-tuned models, as
// Ollama's template index lists it (its gemma3-instruct entry, read from
// the Ollama module ctxd builds with), written once beside the model. The
// weights stay the base model's: the template tests get Gemma's own
// vocabulary, BOS, turn markers and system folding; the answers are a base
// model's.
func Gemma3Chat(tb testing.TB) string {
	tb.Helper()
	src := Path(tb, Gemma3)
	dst := filepath.Join(filepath.Dir(src), "gemma-3-270m-q4_k_m+chat-template.gguf")
	if _, err := os.Stat(dst); err == nil {
		return dst
	}
	jinja, err := OllamaTemplate("gemma3-instruct")
	if err != nil {
		tb.Fatal(err)
	}
	if err := WithChatTemplate(src, dst, jinja); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// OllamaTemplate is the Jinja text of the named entry of the template
// index of the Ollama module in go.mod.
func OllamaTemplate(name string) (string, error) {
	root, err := reporoot.Find()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("realmodel: the Ollama module's directory: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "template", "index.json"))
	if err != nil {
		return "", fmt.Errorf("realmodel: Ollama's template index: %w", err)
	}
	var index []struct{ Name, Template string }
	if err := json.Unmarshal(b, &index); err != nil {
		return "", fmt.Errorf("realmodel: Ollama's template index: %w", err)
	}
	for _, e := range index {
		if e.Name == name {
			return e.Template, nil
		}
	}
	return "", fmt.Errorf("realmodel: Ollama's template index has no %s", name)
}
