package llamatok

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/ctxd/ctxd/codex"
	"github.com/ctxd/ctxd/internal/reporoot"
	"github.com/ctxd/ctxd/modelgen"
)

// boundTexts are adversarial for codex.Bound: runs of one character (the
// longest merges), multi-byte Unicode (byte fallback), special-token
// lookalikes, and real code.
func boundTexts(special []string) []string {
	texts := []string{
		"", "a", " ", "\n", "▁",
		strings.Repeat("a", 20000), strings.Repeat(" ", 20000), strings.Repeat("\n", 5000), strings.Repeat("-", 8000),
		strings.Repeat("ab", 6000), strings.Repeat("\t\t", 3000), strings.Repeat("0", 9000),
		strings.Repeat("日本語のテキスト", 500), strings.Repeat("🙂🚀", 1500), strings.Repeat("e\u0301", 2000), strings.Repeat("\u200b", 3000),
		strings.Repeat("<s></s><unk>", 500), strings.Repeat("<|im_start|>user\n", 300), strings.Repeat("<|eot_id|>", 400),
		"func main() {\n\tfmt.Println(\"hello, world\")\n}\n",
	}
	for _, s := range special {
		texts = append(texts, strings.Repeat(s, 200), s+" "+s)
	}
	rng := rand.New(rand.NewPCG(7, 9))
	alphabet := []rune("aZ09 _\n\t-=<>|/▁日🙂é\u0301")
	for range 200 {
		r := make([]rune, rng.IntN(3000))
		for i := range r {
			r[i] = alphabet[rng.IntN(len(alphabet))]
		}
		texts = append(texts, string(r))
	}
	return texts
}

// TestBoundHolds: on both vocabulary kinds (and the trained stories260K,
// when ../shared has it), every adversarial text's exact count lies within
// codex.Bound's bounds for its length.
func TestBoundHolds(t *testing.T) {
	check := func(t *testing.T, tok *Tokenizer) {
		b := codex.Bound{MaxTokenBytes: tok.MaxTokenBytes()}
		if b.MaxTokenBytes <= 0 {
			t.Fatalf("longest token %d bytes", b.MaxTokenBytes)
		}
		tight := 0
		for _, s := range boundTexts(tok.Special()) {
			n, err := tok.CountText(s)
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := b.Lower(int64(len(s))), b.Upper(int64(len(s)))
			if int64(n) < lo || int64(n) > hi {
				t.Errorf("%d bytes (%.40q…): %d tokens, outside the bound [%d, %d]", len(s), s, n, lo, hi)
			}
			if int64(n) == hi && n > 0 {
				tight++
			}
		}
		t.Logf("longest token %d bytes; upper bound reached exactly by %d texts", b.MaxTokenBytes, tight)
	}
	for _, vocab := range []string{modelgen.VocabSPM, modelgen.VocabBPE} {
		t.Run(vocab, func(t *testing.T) {
			c := modelgen.DemoConfig()
			c.Vocab = vocab
			check(t, open(t, c))
		})
	}
	t.Run("stories260K", func(t *testing.T) {
		root, err := reporoot.Find()
		if err != nil {
			t.Skip(err)
		}
		path := root + "/../shared/models/stories260K.gguf"
		if _, err := os.Stat(path); err != nil {
			t.Skip("../shared/models/stories260K.gguf not found: the trained vocabulary is checked where ../shared is")
		}
		tok, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer tok.Close()
		check(t, tok)
	})
}
