package openai

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Model is one entry of GET /v1/models, with the window fields the
// engines add beside the standard ones.
type Model struct {
	ID      string `json:"id"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is vLLM's and SGLang's window (max_model_len).
	MaxModelLen int `json:"max_model_len"`
	// Meta is llama-server's: n_ctx is each slot's window, n_ctx_train the
	// model's trained one.
	Meta *struct {
		NCtx      int   `json:"n_ctx"`
		NCtxTrain int   `json:"n_ctx_train"`
		NEmbd     int   `json:"n_embd"`
		Size      int64 `json:"size"`
	} `json:"meta"`
}

// Window is the context window the server says it serves the model with;
// 0 when it does not say.
func (m Model) Window() int {
	switch {
	case m.MaxModelLen > 0:
		return m.MaxModelLen
	case m.Meta != nil && m.Meta.NCtx > 0:
		return m.Meta.NCtx
	}
	return 0
}

// TrainedWindow is the model's trained window where the server says it,
// else Window.
func (m Model) TrainedWindow() int {
	if m.Meta != nil && m.Meta.NCtxTrain > 0 {
		return m.Meta.NCtxTrain
	}
	return m.Window()
}

// Models reads GET /v1/models.
func (c *Client) Models(ctx context.Context) ([]Model, error) {
	var out struct {
		Data []Model `json:"data"`
	}
	if err := c.getJSON(ctx, request{method: http.MethodGet, path: "/v1/models", idempotent: true}, &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// FindModel is the served model named name, or the only one served when
// name is "". The error lists what the server serves.
func FindModel(models []Model, name string) (Model, error) {
	ids := make([]string, len(models))
	for i, m := range models {
		ids[i] = m.ID
		if name != "" && (m.ID == name || m.ID == name+":latest") { // Ollama tags a bare name :latest
			return m, nil
		}
	}
	slices.Sort(ids)
	switch {
	case len(models) == 0:
		return Model{}, errors.New("the server's /v1/models lists no model")
	case name == "" && len(models) == 1:
		return models[0], nil
	case name == "":
		return Model{}, fmt.Errorf("the server serves several models (%s): name one as backend.model", strings.Join(ids, ", "))
	}
	return Model{}, fmt.Errorf("backend.model %q is not among the server's models (%s)", name, strings.Join(ids, ", "))
}

// tokenizeShape is how a server's /tokenize takes its text: llama-server's
// {"content"} or vLLM's and SGLang's {"model", "prompt"}.
type tokenizeShape int

const (
	shapeUnknown tokenizeShape = iota
	shapeLlama
	shapeVLLM
)

// Tokenize tokenizes text with the server's vocabulary (POST /tokenize):
// with the tokens a whole prompt starts with if addSpecial, and
// special-token text parsed into those tokens if parseSpecial (vLLM's and
// SGLang's always parse it). ErrNoTokenize when the server has no such
// route.
func (c *Client) Tokenize(ctx context.Context, text string, addSpecial, parseSpecial bool) ([]int, error) {
	var out struct {
		Tokens []int `json:"tokens"`
	}
	shapes := []tokenizeShape{tokenizeShape(c.shape.Load())}
	if shapes[0] == shapeUnknown {
		shapes = []tokenizeShape{shapeLlama, shapeVLLM}
	}
	var err error
	for _, sh := range shapes {
		body := map[string]any{"content": text, "add_special": addSpecial, "parse_special": parseSpecial}
		if sh == shapeVLLM {
			body = map[string]any{"model": c.opts.Model, "prompt": text, "add_special_tokens": addSpecial}
		}
		if err = c.getJSON(ctx, request{method: http.MethodPost, path: "/tokenize", body: body, idempotent: true}, &out); err == nil {
			c.shape.Store(int32(sh))
			return out.Tokens, nil
		}
		if st := StatusOf(err); st != http.StatusBadRequest && st != http.StatusNotFound && st != http.StatusUnprocessableEntity {
			return nil, err // not a question of shape
		}
	}
	if StatusOf(err) == http.StatusNotFound {
		return nil, fmt.Errorf("%w: %w", ErrNoTokenize, err)
	}
	return nil, err
}

// AcceptsTokens is nil when the server takes a prompt of token ids: it
// sends ids for an answer of one token.
func (c *Client) AcceptsTokens(ctx context.Context, ids []int) error {
	body := map[string]any{"model": c.opts.Model, "prompt": ids, "max_tokens": 1, "temperature": 0}
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := c.getJSON(ctx, request{method: http.MethodPost, path: "/v1/completions", body: body}, &out); err != nil {
		return err
	}
	if len(out.Choices) == 0 {
		return errors.New("the answer to a prompt of token ids has no choices")
	}
	return nil
}
