package bringup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/chattemplate"
	"github.com/ctxd/ctxd/formatters"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/openai"
)

// openOpenAI is the Opener for a server of the OpenAI completions API
// (always external: ctxd does not run it). The model and its window come
// from the server's /v1/models (backend.num_ctx where it says none);
// tokens are counted with the model file where backend.gguf names one,
// else with the server's /tokenize; the prompt goes as token ids where the
// server takes them.
func (c Config) openOpenAI(ctx context.Context, onRestart func()) (_ *Model, err error) {
	b := c.Backend
	m := &Model{Info: BackendInfo{Mode: b.Mode, Kind: b.Kind, Model: b.Model, Slots: b.Slots}}
	var cl closers
	m.Close = cl.close
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	routing := openai.DefaultRouting()
	if b.Routing != nil {
		routing = openai.Routing{Headers: maps.Clone(b.Routing.Headers), Fields: maps.Clone(b.Routing.Fields)}
	}
	opts := openai.Options{Model: b.Model, APIKey: b.APIKey, CAFile: b.CAFile, Temperature: b.Temperature, Seed: b.Seed,
		Retries: b.Retries, IdleTimeout: b.IdleTimeout.Duration, Routing: routing, Logger: c.Logger}
	client, err := openai.New(b.URL, opts)
	if err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.url: %w", err)
	}
	models, err := client.Models(ctx)
	if err != nil {
		return nil, err
	}
	served, err := openai.FindModel(models, b.Model)
	if err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "bringup: %s: %w", client.Addr(), err)
	}
	if opts.Model != served.ID { // "" took the only model
		opts.Model = served.ID
		if client, err = openai.New(b.URL, opts); err != nil {
			return nil, err
		}
	}
	m.Info.Model, m.Info.URL, m.Info.Version = served.ID, client.Addr(), "OpenAI-compatible ("+served.OwnedBy+")"
	if err := c.openAIWindow(m, served); err != nil {
		return nil, err
	}
	if err := c.openAIFacts(m); err != nil {
		return nil, err
	}
	tok, jinja, local, err := c.openAITokenizer(ctx, client)
	if err != nil {
		return nil, err
	}
	cl.add(tok.Close)
	spec := formatters.FormatSpec{Jinja: jinja, Specials: tok.Special()}
	if m.Format, m.Info.Format, err = c.pickFormat(b.Format, spec, "the model's chat template from backend.gguf (the OpenAI API has no route to check the server's own rendering against)", func() (*chattemplate.Format, error) {
		if jinja == "" {
			return nil, fmt.Errorf("%w (the server's API does not give its template: name the model file as backend.gguf)", chattemplate.ErrNoTemplate)
		}
		return chattemplate.FromJinja(jinja, tok.Special())
	}); err != nil {
		return nil, err
	}
	c.Logger.Info("prompt format", "format", m.Info.Format.Name, "append_only", m.Info.Format.AppendOnly, "reason", m.Info.Format.Reason)
	if client, err = c.openAIPromptAs(ctx, client, opts, tok); err != nil {
		return nil, err
	}
	m.Backend, m.Tokenizer, m.TokenizerID = client, tok, served.ID
	if local {
		m.TokenizerID = b.GGUF
	}
	c.Memory.SetPlan(0, false) // the model runs elsewhere
	return m, nil
}

// openAIWindow sets the window: backend.num_ctx, else what the server
// says (/v1/models), capped by backend.max_num_ctx; one per slot, since
// ctxd cannot see how the server shares its memory.
func (c Config) openAIWindow(m *Model, served openai.Model) error {
	b := c.Backend
	n, reason := b.NumCtx, "backend.num_ctx"
	if n == 0 {
		if n = served.Window(); n == 0 {
			return ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.num_ctx: the server's /v1/models does not say model %s's window (neither max_model_len nor meta.n_ctx): set num_ctx to it", served.ID)
		}
		reason = "set by the server (/v1/models)"
		if n > b.MaxNumCtx {
			n, reason = b.MaxNumCtx, fmt.Sprintf("the server's %d, capped by backend.max_num_ctx", served.Window())
		}
	} else if w := served.Window(); w > 0 && n > w {
		return ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.num_ctx = %d is over the %d tokens the server serves model %s with", n, w, served.ID)
	}
	if min := 2*c.Limits.AnswerReserve + 256; n < min {
		return ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.num_ctx: the window is %d tokens (%s), under the %d the answer reserve needs", n, reason, min)
	}
	m.Window = governor.WindowPlan{NumCtx: n, Slots: b.Slots, CacheType: governor.CacheF16, Reason: reason}
	m.Facts = governor.ModelFacts{Architecture: "unknown (served over the OpenAI API)", ContextLength: served.TrainedWindow()}
	if meta := served.Meta; meta != nil {
		m.Facts.Embedding, m.Facts.WeightsBytes = meta.NEmbd, meta.Size
	}
	m.Info.NumCtx, m.Info.Slots, m.Info.KVCacheType = n, b.Slots, "the server's"
	m.Info.Architecture, m.Info.TrainedCtx = m.Facts.Architecture, m.Facts.ContextLength
	return nil
}

// openAIFacts reads the model's facts from backend.gguf where it names
// the served model's file: its architecture, size and sliding window
// (which the server serves whole only with its own setting, such as
// llama-server's --swa-full).
func (c Config) openAIFacts(m *Model) error {
	if c.Backend.GGUF == "" {
		return nil
	}
	facts, err := ggufFacts(c.Backend.GGUF)
	if err != nil {
		return err
	}
	mf, err := governor.FactsFromModelInfo(facts.Info)
	if err != nil {
		return ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.gguf: %w", err)
	}
	if mf.ContextLength == 0 {
		mf.ContextLength = m.Facts.ContextLength
	}
	m.Facts = mf
	m.Window.SlidingWindow = mf.SlidingWindow
	m.Info.Architecture, m.Info.TrainedCtx = mf.Architecture, mf.ContextLength
	if mf.SlidingWindow > 0 {
		c.Logger.Warn("the model attends over a sliding window: unless the server keeps those layers' cache whole (llama-server's --swa-full; vLLM and SGLang by their own settings), it cannot reuse a cached prefix longer than the window (ctxd's summaries show it as reuse below what ctxd expected)",
			"sliding_window", mf.SlidingWindow)
	}
	return nil
}

// openAITokenizer is the model's tokenizer and its Jinja template: the
// model file's where backend.gguf names one (local), else the server's
// /tokenize (and no template).
func (c Config) openAITokenizer(ctx context.Context, client *openai.Client) (tok llamaTok, jinja string, local bool, err error) {
	if gguf := c.Backend.GGUF; gguf != "" {
		if err := readable(gguf); err != nil {
			return nil, "", false, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.gguf %s is not readable (%v): name the served model's file as ctxd sees it, or leave it empty to count tokens with the server's /tokenize", gguf, err)
		}
		lt, err := llamatok.Open(gguf)
		if err != nil {
			return nil, "", false, fmt.Errorf("bringup: tokenizer for %s: %w", gguf, err)
		}
		_, jinja, err := llamacpp.ModelInfo(gguf)
		if err != nil {
			lt.Close()
			return nil, "", false, err
		}
		return lt, jinja, true, nil
	}
	rt, err := llamacpp.NewTokenizer(ctx, client, "")
	if errors.Is(err, openai.ErrNoTokenize) {
		return nil, "", false, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.gguf: the server offers no /tokenize to count tokens with (%v): name the served model's GGUF file as backend.gguf", err)
	}
	if err != nil {
		return nil, "", false, err
	}
	c.Logger.Info("counting tokens with the server's /tokenize (a request per count; set backend.gguf to count locally and use the model's chat template)")
	return rt, "", false, nil
}

// openAIPromptAs applies backend.prompt: token ids when asked, or, for
// auto, when the server takes a prompt of ids (tried once, with a
// one-token answer); else text.
func (c Config) openAIPromptAs(ctx context.Context, client *openai.Client, opts openai.Options, tok ctxd.Tokenizer) (*openai.Client, error) {
	switch c.Backend.Prompt {
	case "text":
		return client, nil
	case "auto":
		ids, err := tok.Tokenize("Hello")
		if err != nil {
			return nil, fmt.Errorf("bringup: tokenizing a probe: %w", err)
		}
		if err := client.AcceptsTokens(ctx, ids); err != nil {
			// Only a refusal of the prompt itself means text; a server
			// that is down or refuses the key fails the start, named.
			if st := openai.StatusOf(err); st != http.StatusBadRequest && st != http.StatusUnprocessableEntity && st != http.StatusInternalServerError {
				return nil, fmt.Errorf("bringup: backend.prompt = \"auto\": asking the server whether it takes token ids: %w", err)
			}
			c.Logger.Info("the server does not take a prompt of token ids: sending text", "err", err)
			return client, nil
		}
	}
	opts.Tokens = true
	c.Logger.Info("sending prompts as token ids")
	return openai.New(c.Backend.URL, opts)
}
