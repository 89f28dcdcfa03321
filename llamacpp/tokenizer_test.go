package llamacpp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// TestTokenizerProbesSpecials: the texts that parse to one token are
// found, from the template, bos and eos, and the known vocabularies (a
// user-defined token is one token whether special tokens are parsed or
// not); a marker-like text of several tokens is not special. Counts are
// the server's, and Close stops them.
func TestTokenizerProbesSpecials(t *testing.T) {
	t.Parallel()
	special := map[string]int{"<|im_start|>": 1000, "<|im_end|>": 1001, "<s>": 1, "<|fim_prefix|>": 1002}
	userDefined := map[string]int{"<think>": 2000} // split out of text even unparsed
	var calls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		var req struct {
			Content      string `json:"content"`
			AddSpecial   bool   `json:"add_special"`
			ParseSpecial bool   `json:"parse_special"`
		}
		if r.URL.Path != "/tokenize" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", 400)
			return
		}
		var ids []int
		if req.AddSpecial {
			ids = append(ids, 1)
		}
		if id, ok := special[req.Content]; ok && req.ParseSpecial {
			ids = append(ids, id)
		} else if id, ok := userDefined[req.Content]; ok {
			ids = append(ids, id)
		} else {
			for _, b := range []byte(req.Content) {
				ids = append(ids, int(b))
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"tokens": ids})
	}))
	defer srv.Close()
	c, err := New(srv.URL, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := NewTokenizer(t.Context(), c, "{{ '<|im_start|>' + m.role }}<b>{{ '<|im_end|>' }}", "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"<|fim_prefix|>", "<|im_start|>", "<|im_end|>", "<think>", "<s>"}
	if got := tok.Special(); !slices.Equal(got, want) {
		t.Errorf("specials %q, want %q (longest first)", got, want)
	}
	if ids, err := tok.Tokenize("ab"); err != nil || !slices.Equal(ids, []int{1, 'a', 'b'}) {
		t.Errorf("Tokenize: %v, %v", ids, err)
	}
	if n, err := tok.CountText("ab"); err != nil || n != 2 {
		t.Errorf("CountText: %d, %v", n, err)
	}
	before := calls
	if ids, err := tok.TokenizeText(""); err != nil || len(ids) != 0 || calls != before {
		t.Errorf("an empty piece: %v, %v, %d requests", ids, err, calls-before)
	}
	tok.Close()
	if _, err := tok.Tokenize("ab"); err == nil {
		t.Error("a closed tokenizer counted")
	}
	srv.Close()
}
