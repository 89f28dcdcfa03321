package bringup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/llamacpp"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/orchestrator"
)

// openLlamaCpp is the Opener for llama.cpp's llama-server: in managed mode
// it plans the window from the GGUF and starts a supervised server with
// one window per slot and a slot save path under the state directory; in
// external mode it reads the server's slots and window from /props. ctxd
// counts tokens with the model file where it can read it, else with the
// server's /tokenize, and sends the prompt as token ids.
func (c Config) openLlamaCpp(ctx context.Context, onRestart func()) (_ *Model, err error) {
	b := c.Backend
	m := &Model{Info: BackendInfo{Mode: b.Mode, Kind: b.Kind, Model: b.Model}, ChoosesSlots: true}
	var cl closers
	m.Close = cl.close
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	opts := llamacpp.Options{Temperature: b.Temperature, Seed: b.Seed, APIKey: b.APIKey}
	var client *llamacpp.Client
	gguf, slotDir := b.GGUF, b.SlotSavePath
	if b.Mode == "managed" {
		if client, slotDir, err = c.startLlamaServer(ctx, m, &cl, opts, onRestart); err != nil {
			return nil, err
		}
	} else if client, err = llamacpp.New(b.URL, opts); err != nil {
		return nil, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.url: %w", err)
	}
	props, err := client.Props(ctx)
	if err != nil {
		return nil, err
	}
	m.Info.URL, m.Info.Version = client.Addr(), "llama-server "+props.Build
	local := true // the model file is readable here: count and read facts locally
	if b.Mode == "external" {
		if gguf, local, err = c.externalFacts(ctx, m, client, props); err != nil {
			return nil, err
		}
	}
	if err := checkServerWindow(m, props); err != nil {
		return nil, err
	}
	tok, jinja, err := c.llamaTokenizer(ctx, client, props, gguf, local)
	if err != nil {
		return nil, err
	}
	cl.add(tok.Close)
	if m.Format, m.Info.Format, err = c.chooseLlamaFormat(ctx, b.Format, jinja, tok.Special(), client, props.BOS); err != nil {
		return nil, err
	}
	c.Logger.Info("prompt format", "format", m.Info.Format.Name, "append_only", m.Info.Format.AppendOnly, "reason", m.Info.Format.Reason)
	name := filepath.Base(gguf)
	if gguf == "" {
		name = b.Model
	}
	m.Backend, m.Tokenizer, m.TokenizerID = client, tok, name
	if slotDir != "" {
		m.Warm = &orchestrator.WarmConfig{Store: client, Dir: slotDir, Model: name + "@" + m.Info.Version}
	} else {
		c.Logger.Info("warm restarts are off: set backend.slot_save_path to the server's --slot-save-path to turn them on")
	}
	c.Memory.SetPlan(uint64(max(0, m.Window.WeightsBytes+m.Window.KVBytes)), true) // the server holds its model
	return m, nil
}

// startLlamaServer plans the window from the GGUF and starts the managed,
// supervised llama-server with one window per slot and its slot save path
// under the state directory; cl stops it.
func (c Config) startLlamaServer(ctx context.Context, m *Model, cl *closers, opts llamacpp.Options, onRestart func()) (*llamacpp.Client, string, error) {
	b := c.Backend
	facts, err := ggufFacts(b.GGUF)
	if err != nil {
		return nil, "", err
	}
	if m.Facts, m.Window, err = c.planWindow(facts); err != nil {
		return nil, "", err
	}
	m.Planned = PlannedBytes(m.Window, VocabSize(facts.Info), b.CacheRAMMB)
	dir := filepath.Join(c.StateDir, "llamacpp")
	slotDir := filepath.Join(dir, "slots")
	addr := b.Listen
	if addr == "" {
		if addr, err = privateSocket(dir, cl); err != nil {
			return nil, "", err
		}
	}
	srv, err := llamacpp.Start(ctx, llamacpp.ServeConfig{
		Binary: b.ServerBinary(), Addr: addr, Model: b.GGUF,
		CtxPerSlot: m.Window.NumCtx, Slots: b.Slots, SlotSavePath: slotDir, CacheRAMMiB: b.CacheRAMMB, CacheReuse: b.CacheReuse,
		Threads: b.NumThread, BatchSize: b.NumBatch, SWAFull: m.Facts.SlidingWindow > 0,
		LogPath: filepath.Join(dir, "llama-server.log"), Env: c.Env,
		Logger: c.Logger, OnRestart: onRestart,
	}, opts)
	if err != nil {
		return nil, "", err
	}
	cl.add(func() error {
		err := srv.Process.Close()
		c.Logger.Info("managed llama-server stopped")
		return err
	})
	m.Restarts = srv.Restarts
	m.Suspend = func(context.Context) error { return srv.Pause() }
	m.Resume, m.PID = srv.Resume, srv.PID
	return srv.Client, slotDir, nil
}

// externalFacts reads an external server's model: from its file where ctxd
// can read it (local), else from the server; the window and slots are the
// server's own. It returns the model file's path as ctxd sees it.
func (c Config) externalFacts(ctx context.Context, m *Model, client *llamacpp.Client, props llamacpp.Props) (gguf string, local bool, err error) {
	gguf = c.Backend.GGUF
	if gguf == "" {
		gguf = props.ModelPath
	}
	statErr := readable(gguf)
	switch {
	case statErr != nil && c.Backend.GGUF != "":
		return "", false, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.gguf %s is not readable (%v): name the server's model file as ctxd sees it, or leave it empty to count tokens with the server", gguf, statErr)
	case statErr != nil:
		c.Logger.Info("the server's model file is not readable here: counting tokens with the server's /tokenize (a request per count; set backend.gguf to count locally)", "model", gguf, "err", statErr)
		if m.Facts, err = remoteFacts(ctx, client); err != nil {
			return "", false, err
		}
	default:
		facts, err := ggufFacts(gguf)
		if err != nil {
			return "", false, err
		}
		if m.Facts, err = governor.FactsFromModelInfo(facts.Info); err != nil {
			return "", false, err
		}
		if m.Facts.SlidingWindow > 0 {
			c.Logger.Warn("the model attends over a sliding window: unless the server was started with --swa-full, it cannot reuse a cached prefix longer than the window and evaluates every prompt whole (ctxd's summaries show it as reuse below what ctxd expected)",
				"sliding_window", m.Facts.SlidingWindow, "swa_layers", m.Facts.SWALayers, "layers", m.Facts.BlockCount)
		}
	}
	m.Window = governor.WindowPlan{NumCtx: props.Settings.NCtx, Slots: props.TotalSlots, CacheType: governor.CacheF16,
		Reason: "set by the external server (/props: its slots and each slot's window)"}
	return gguf, statErr == nil, nil
}

// checkServerWindow refuses a server whose slots or window differ from
// the plan, and reports the model's window in m.Info.
func checkServerWindow(m *Model, props llamacpp.Props) error {
	if props.TotalSlots != max(1, m.Window.Slots) {
		return ctxd.Errorf(ctxd.KindInvalid, "bringup: llama-server has %d slots, ctxd planned %d", props.TotalSlots, m.Window.Slots)
	}
	if props.Settings.NCtx > 0 && props.Settings.NCtx != m.Window.NumCtx {
		return ctxd.Errorf(ctxd.KindInvalid, "bringup: llama-server gives each slot %d tokens, ctxd planned %d", props.Settings.NCtx, m.Window.NumCtx)
	}
	m.Info.NumCtx, m.Info.Slots, m.Info.KVCacheType = m.Window.NumCtx, m.Window.Slots, string(m.Window.CacheType)
	m.Info.Architecture = m.Facts.Architecture
	m.Info.TrainedCtx = m.Facts.ContextLength
	return nil
}

// llamaTokenizer is the model's tokenizer and its Jinja chat template:
// from the model file where it is readable here (local), else the
// server's /tokenize and the template /props reports, if it is the
// model's own.
func (c Config) llamaTokenizer(ctx context.Context, client *llamacpp.Client, props llamacpp.Props, gguf string, local bool) (llamaTok, string, error) {
	if !local {
		tok, err := llamacpp.NewTokenizer(ctx, client, props.ChatTemplate, props.BOS, props.EOS)
		if err != nil {
			return nil, "", err
		}
		return tok, ownTemplate(props.ChatTemplate, tok.Special(), c.Logger), nil
	}
	lt, err := llamatok.Open(gguf)
	if err != nil {
		return nil, "", fmt.Errorf("bringup: tokenizer for %s: %w", gguf, err)
	}
	_, jinja, err := llamacpp.ModelInfo(gguf)
	if err != nil {
		lt.Close()
		return nil, "", err
	}
	return lt, jinja, nil
}

// llamaTok is a tokenizer that knows its special tokens and is closed.
type llamaTok interface {
	ctxd.Tokenizer
	Special() []string
	Close() error
}

// ggufFacts reads what the window plan needs from the model file.
func ggufFacts(path string) (facts Facts, err error) {
	info, _, err := llamacpp.ModelInfo(path)
	if err != nil {
		return facts, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.gguf: %w", err)
	}
	arch, _ := info["general.architecture"].(string)
	ctxLen, _ := info[arch+".context_length"].(float64)
	return Facts{Architecture: arch, ContextLength: int(ctxLen), GGUFPath: path, Info: info}, nil
}

// remoteFacts reads what the governor needs of a model whose file ctxd
// cannot read from the server's /v1/models: its trained window, width and
// weights. The layer shapes stay unknown, so KV memory is not estimated
// (the server allocated its own).
func remoteFacts(ctx context.Context, c *llamacpp.Client) (governor.ModelFacts, error) {
	meta, err := c.ModelMeta(ctx)
	if err != nil {
		return governor.ModelFacts{}, fmt.Errorf("bringup: the served model's facts: %w", err)
	}
	return governor.ModelFacts{Architecture: "unknown (model file not readable here)", ContextLength: meta.NCtxTrain,
		Embedding: meta.NEmbd, WeightsBytes: meta.Size}, nil
}

// readable reports why the model file cannot be read here, or nil.
func readable(path string) error {
	if path == "" {
		return errors.New("the server reports no model path")
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Read(make([]byte, 4))
	return err
}

// ownTemplate returns the template /props reports, or "" when it is not
// the model's own: llama-server reports a ChatML fallback for a model
// without a template, whose markers are then plain text in the
// vocabulary. A template whose marker-like texts include none of the
// vocabulary's special tokens is taken as such a fallback.
func ownTemplate(jinja string, special []string, log *slog.Logger) string {
	markers := llamacpp.TemplateMarkers(jinja)
	if len(markers) == 0 {
		return jinja
	}
	for _, m := range markers {
		if slices.Contains(special, m) {
			return jinja
		}
	}
	log.Info("the server's chat template is not the model's: none of its markers is a special token of the vocabulary (llama-server's fallback for a model without one)", "markers", markers)
	return ""
}

// maxSocketPath is the longest Unix socket path this system binds (108
// bytes with its terminating NUL, on Linux).
const maxSocketPath = 107

// privateSocket is where a managed llama-server listens by default: a
// Unix socket in its state directory (dir, made 0700), which no other
// uid can reach, unlike a loopback port. Where that path is too long for
// a socket, a private directory of its own under the system's temporary
// directory holds it (removed with the server, by cl).
func privateSocket(dir string, cl *closers) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("bringup: the llama-server's directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("bringup: the llama-server's directory: %w", err)
	}
	path := filepath.Join(dir, "llama-server.sock")
	if len(path) <= maxSocketPath {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "ctxd-llama-") // made 0700
	if err != nil {
		return "", fmt.Errorf("bringup: a directory for the llama-server's socket: %w", err)
	}
	cl.add(func() error { return os.RemoveAll(tmp) })
	return filepath.Join(tmp, "llama-server.sock"), nil
}
