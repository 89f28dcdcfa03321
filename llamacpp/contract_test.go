package llamacpp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ctxd/ctxd"
)

// fixture is one exchange recorded with the real llama-server
// (testdata/fixtures, copied from ../shared/fixtures/llamacpp; its INDEX.md
// says what each shows).
type fixture struct {
	Request struct {
		Method string          `json:"method"`
		Path   string          `json:"path"`
		Body   json.RawMessage `json:"body"`
	} `json:"request"`
	Response struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	} `json:"response"`
}

func load(t *testing.T, name string) fixture {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "fixtures", name))
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// replay serves the fixture's response to a request with its method and
// path, and fails the test on any other request.
func replay(t *testing.T, f fixture) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+r.URL.Path == "GET /health" && f.Request.Path != "/health" {
			// The client's refill after a completion (see Client.refill).
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"status":"ok"}`))
			return
		}
		if got := r.Method + " " + r.URL.RequestURI(); got != f.Request.Method+" "+f.Request.Path {
			t.Errorf("the adapter sent %s, the recording has %s %s", got, f.Request.Method, f.Request.Path)
			http.Error(w, "unexpected", http.StatusTeapot)
			return
		}
		var raw string
		if json.Unmarshal(f.Response.Body, &raw) == nil { // a stream, recorded as its text
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(f.Response.Status)
			w.Write([]byte(raw))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.Response.Status)
		w.Write(f.Response.Body)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func kindIs(t *testing.T, err error, k ctxd.Kind, mention string) {
	t.Helper()
	if ctxd.KindOf(err) != k || !strings.Contains(err.Error(), mention) {
		t.Errorf("error %v (kind %q), want kind %q mentioning %q", err, ctxd.KindOf(err), k, mention)
	}
}

// final decodes a non-streamed /completion answer as the stream's final
// event, which has the same fields.
func final(t *testing.T, f fixture) ctxd.Generation {
	t.Helper()
	var ch chunk
	if err := json.Unmarshal(f.Response.Body, &ch); err != nil {
		t.Fatal(err)
	}
	gen := ctxd.Generation{BackendCached: -1}
	ch.finish(&gen)
	return gen
}

// TestEveryFixture replays every recorded exchange through the adapter:
// each either exercises the method the adapter uses for it, or says why
// the adapter never sends it. A new fixture fails the test until it is
// placed here.
func TestEveryFixture(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := map[string]func(t *testing.T, f fixture){
		"health.json": func(t *testing.T, f fixture) {
			if err := replay(t, f).Health(ctx); err != nil {
				t.Error(err)
			}
		},
		"props.json": func(t *testing.T, f fixture) {
			c := replay(t, f)
			p, err := c.Props(ctx)
			if err != nil || p.TotalSlots != 2 || p.Settings.NCtx != 1024 || p.BOS != "<s>" || p.ModelPath == "" {
				t.Errorf("props %+v %v", p, err)
			}
			// The recordings show ids out of range wrap modulo the slot
			// count; the adapter refuses them instead, without a request.
			if _, err := c.SaveSlot(ctx, 7, "s7.bin"); err == nil || !strings.Contains(err.Error(), "out of range") {
				t.Errorf("slot 7 of 2: %v", err)
			}
			if _, err := c.Generate(ctx, ctxd.GenerateRequest{Prompt: "p", Slot: -1}, func(string) error { return nil }); err == nil {
				t.Error("slot -1 accepted")
			}
		},
		"slots.json":                      slots(2, 0),
		"slots-after-requests.json":       slots(2, 638),
		"slots-after-erase.json":          slots(2, 0),
		"slots-after-restore.json":        slots(2, 638),
		"slots-after-failed-restore.json": slots(2, 0),
		"slot-save.json": func(t *testing.T, f fixture) {
			if n, err := replay(t, f).SaveSlot(ctx, 0, "s0.bin"); err != nil || n != 638 {
				t.Errorf("saved %d, %v", n, err)
			}
		},
		"slot-restore.json": func(t *testing.T, f fixture) {
			if n, err := replay(t, f).RestoreSlot(ctx, 0, "s0.bin"); err != nil || n != 638 {
				t.Errorf("restored %d, %v", n, err)
			}
		},
		"slot-erase.json":   erase,
		"slot-erase-2.json": erase,
		"error-slot-restore-missing-file.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).RestoreSlot(ctx, 0, "does-not-exist.bin")
			kindIs(t, err, ctxd.KindBackend, "Unable to restore slot")
		},
		"error-slot-save-invalid-filename.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).SaveSlot(ctx, 0, "../evil.bin")
			kindIs(t, err, ctxd.KindBackend, "Invalid filename")
		},
		"error-slot-save-without-slot-save-path.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).SaveSlot(ctx, 0, "s0.bin")
			kindIs(t, err, ctxd.KindConflict, "--slot-save-path")
			if !errors.Is(err, ErrSlotsDisabled) {
				t.Errorf("%v is not ErrSlotsDisabled", err)
			}
		},
		"error-slot-restore-without-slot-save-path.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).RestoreSlot(ctx, 0, "s0.bin")
			kindIs(t, err, ctxd.KindConflict, "--slot-save-path")
		},
		"error-slot-erase-without-slot-save-path.json": func(t *testing.T, f fixture) {
			kindIs(t, replay(t, f).EraseSlot(ctx, 0), ctxd.KindConflict, "--slot-save-path")
		},
		"v1-models.json": func(t *testing.T, f fixture) {
			m, err := replay(t, f).ModelMeta(ctx)
			if err != nil || m.NVocab != 512 || m.NCtxTrain != 2048 || m.NEmbd != 64 || m.Size != 1171200 {
				t.Errorf("model meta %+v, %v", m, err)
			}
		},
		"tokenize-plain.json": func(t *testing.T, f fixture) {
			ids, err := replay(t, f).Tokenize(ctx, "Once upon a time", true, true)
			if err != nil || !slices.Equal(ids, []int{1, 403, 407, 261, 378}) {
				t.Errorf("tokens %v, %v", ids, err)
			}
		},
		"completion-stream.json": func(t *testing.T, f fixture) {
			var pieces []string
			gen, err := replay(t, f).Generate(ctx, ctxd.GenerateRequest{Prompt: "Once upon a time", MaxTokens: 8, Slot: 1},
				func(s string) error { pieces = append(pieces, s); return nil })
			if err != nil || strings.Join(pieces, "") != ", there was a little girl" || gen.Text != ", there was a little girl" {
				t.Fatalf("text %q (%q), %v", gen.Text, pieces, err)
			}
			if gen.DoneReason != ctxd.DoneLength || gen.BackendCached != 0 || gen.PromptEvalCount != 5 || gen.EvalCount != 8 || gen.TTFT <= 0 {
				t.Errorf("generation %+v", gen)
			}
		},
		"completion-cache-1-first.json":                   cached(0, 623),
		"completion-cache-2-same-prefix-plus-suffix.json": cached(623, 634),
		"completion-cache-3-diverge-middle.json":          cached(361, 623),
		"completion-after-restore.json":                   cached(622, 623),
		"completion-after-erase-no-restore.json":          cached(0, 623),
		"completion-out-of-range-id-slot-wraps.json": func(t *testing.T, f fixture) {
			// Slot 7 of 2 ran on slot 1: what checkSlot prevents (props.json).
			if gen := final(t, f); gen.PromptEvalCount == 0 {
				t.Errorf("generation %+v", gen)
			}
		},
		"error-prompt-too-long.json":         tooLong,
		"error-prompt-exceeds-slot-ctx.json": tooLong,
		"error-bad-json.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).Generate(ctx, ctxd.GenerateRequest{Prompt: "p"}, func(string) error { return nil })
			kindIs(t, err, ctxd.KindBackend, "parse error")
		},
		"error-completion-missing-prompt.json": func(t *testing.T, f fixture) {
			_, err := replay(t, f).Generate(ctx, ctxd.GenerateRequest{Prompt: "p"}, func(string) error { return nil })
			kindIs(t, err, ctxd.KindBackend, "refused")
		},
		"error-404.json": func(t *testing.T, f fixture) {
			kindIs(t, replay(t, f).do(ctx, http.MethodGet, "/no-such-endpoint", nil, nil), ctxd.KindBackend, "404")
		},
	}
	notSent := map[string]string{
		"detokenize.json":                      "ctxd detokenizes nothing: answers stream as text",
		"detokenize-no-bos.json":               "ctxd detokenizes nothing",
		"tokenize-add-special-true.json":       "ctxd never asks for pieces (with_pieces)",
		"tokenize-add-special-false.json":      "ctxd never asks for pieces (with_pieces)",
		"error-slot-bad-action.json":           "the adapter sends save, restore and erase only",
		"error-slot-non-numeric-id.json":       "slot ids are ints, checked against total_slots",
		"error-slot-id-out-of-int-range.json":  "slot ids are checked against total_slots",
		"slot-save-negative-id-wraps.json":     "negative slot ids are refused before sending",
		"slot-save-out-of-range-id-wraps.json": "slot ids past total_slots are refused before sending",
		"error-metrics-disabled.json":          "ctxd does not read llama-server's metrics",
		"v1-chat-completions.json":             "the OpenAI-compatible routes are not the adapter's: it uses the native API",
		"v1-chat-completions-stream.json":      "the OpenAI-compatible routes are not the adapter's",
		"v1-completions.json":                  "the OpenAI-compatible routes are not the adapter's",
	}
	files, _ := filepath.Glob(filepath.Join("testdata", "fixtures", "*.json"))
	if len(files) != len(cases)+len(notSent) {
		t.Errorf("%d fixtures, %d placed", len(files), len(cases)+len(notSent))
	}
	for _, path := range files {
		name := filepath.Base(path)
		check, ok := cases[name]
		if _, skip := notSent[name]; skip {
			continue
		}
		if !ok {
			t.Errorf("fixture %s is neither replayed nor explained", name)
			continue
		}
		t.Run(name, func(t *testing.T) { check(t, load(t, name)) })
	}
}

func slots(n, prompt0 int) func(*testing.T, fixture) {
	return func(t *testing.T, f fixture) {
		s, err := replay(t, f).Slots(context.Background())
		if err != nil || len(s) != n || s[0].NCtx != 1024 || s[0].NPrompt != prompt0 {
			t.Errorf("slots %+v, %v; want %d slots, slot 0 holding %d", s, err, n, prompt0)
		}
	}
}

func erase(t *testing.T, f fixture) {
	if err := replay(t, f).EraseSlot(context.Background(), 0); err != nil {
		t.Error(err)
	}
}

func cached(cacheN, prompt int) func(*testing.T, fixture) {
	return func(t *testing.T, f fixture) {
		if gen := final(t, f); gen.BackendCached != cacheN || gen.PromptEvalCount != prompt {
			t.Errorf("cache_n %d of %d prompt tokens, want %d of %d", gen.BackendCached, gen.PromptEvalCount, cacheN, prompt)
		}
	}
}

func tooLong(t *testing.T, f fixture) {
	_, err := replay(t, f).Generate(context.Background(), ctxd.GenerateRequest{Prompt: "p"}, func(string) error { return nil })
	kindIs(t, err, ctxd.KindDoesNotFit, "exceeds the available context size")
	if !errors.Is(err, ErrTooLong) {
		t.Errorf("%v is not ErrTooLong", err)
	}
}

// TestOutputParserRejection: llama-server's output parser rejects text that
// is not valid UTF-8 (random-weight models emit stray byte tokens) and
// ends the stream with an error event instead of its final message. The
// answer so far is kept and marked incomplete, with the prompt's
// measurements from the last event that carried them; the stream is the
// real server's (prompt of 20 tokens, timings_per_token on).
func TestOutputParserRejection(t *testing.T) {
	t.Parallel()
	stream := `data: {"index":0,"content":"ecause","tokens":[2046],"stop":false,"id_slot":-1,"tokens_predicted":1,"tokens_evaluated":20,"timings":{"cache_n":12,"prompt_n":8,"prompt_ms":1.6,"prompt_per_token_ms":0.08,"prompt_per_second":12500.0,"predicted_n":1,"predicted_ms":0.001,"predicted_per_token_ms":0.0,"predicted_per_second":0.0}}

data: {"index":0,"content":"start","tokens":[960],"stop":false,"id_slot":-1,"tokens_predicted":2,"tokens_evaluated":20,"timings":{"cache_n":12,"prompt_n":8,"prompt_ms":1.6,"prompt_per_token_ms":0.08,"prompt_per_second":12500.0,"predicted_n":2,"predicted_ms":0.414,"predicted_per_token_ms":0.414,"predicted_per_second":2415.458937198068}}

data: {"error":{"code":500,"message":"The model produced output that does not match the expected Content-only format","type":"server_error"}}

`
	for _, c := range []struct {
		name      string
		stream    string
		cached, n int
	}{
		{"with timings", stream, 12, 20},
		{"without timings", strings.ReplaceAll(stream, `"timings"`, `"other"`), -1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var sent map[string]any
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				json.NewDecoder(r.Body).Decode(&sent)
				w.Header().Set("Content-Type", "text/event-stream")
				w.Write([]byte(c.stream))
			}))
			defer srv.Close()
			cl, err := New(srv.URL, Options{})
			if err != nil {
				t.Fatal(err)
			}
			gen, err := cl.Generate(context.Background(), ctxd.GenerateRequest{Tokens: []int{1, 2, 3}}, nil)
			if err != nil {
				t.Fatalf("the answer so far is lost: %v", err)
			}
			if sent["timings_per_token"] != true {
				t.Errorf("request %v does not ask for timings on every event", sent)
			}
			if gen.Text != "ecausestart" || gen.DoneReason != ctxd.DoneIncomplete || !strings.Contains(gen.Note, "Content-only") {
				t.Errorf("generation %+v", gen)
			}
			if gen.BackendCached != c.cached || gen.PromptEvalCount != c.n {
				t.Errorf("measured %d cached of %d, want %d of %d", gen.BackendCached, gen.PromptEvalCount, c.cached, c.n)
			}
		})
	}
}

// TestPromptProgressOfAStoppedGeneration: the adapter asks llama-server to
// report its progress through the prompt (return_progress); a generation
// stopped while the prompt is read says how much of it the slot held at
// the last report, and how much of that it reused. The events are the real server's shape (processed
// counts reused and read tokens alike).
func TestPromptProgressOfAStoppedGeneration(t *testing.T) {
	t.Parallel()
	var sent map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&sent)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {\"prompt_progress\":{\"total\":12720,\"cache\":1,\"processed\":1,\"time_ms\":0}}\n\n"))
		w.Write([]byte("data: {\"prompt_progress\":{\"total\":12720,\"cache\":1,\"processed\":1537,\"time_ms\":1740}}\n\n"))
		// The stream ends there: the server stopped while it read the
		// prompt (as when ctxd's client goes away).
	}))
	defer srv.Close()
	cl, err := New(srv.URL, Options{})
	if err != nil {
		t.Fatal(err)
	}
	gen, err := cl.Generate(t.Context(), ctxd.GenerateRequest{Tokens: []int{1, 2, 3}}, nil)
	if err == nil {
		t.Fatal("a stopped generation returned no error")
	}
	if sent["return_progress"] != true {
		t.Errorf("request %v does not ask for the prompt's progress", sent)
	}
	if gen.PromptRead != 1537 || gen.BackendCached != 1 {
		t.Errorf("read %d, cached %d; want 1537 read, 1 of them reused", gen.PromptRead, gen.BackendCached)
	}
}
