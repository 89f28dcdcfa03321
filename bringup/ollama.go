package bringup

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/llamatok"
	"github.com/ctxd/ctxd/ollama"
)

// openOllama is the Opener for Ollama: in managed mode it starts a private
// `ollama serve` (supervised, restarted if it crashes) and imports the
// configured GGUF; in external mode it connects to the configured URL.
// Then it plans the window, loads the model and opens its tokenizer.
func (c Config) openOllama(ctx context.Context, onRestart func()) (_ *Model, err error) {
	b := c.Backend
	m := &Model{Info: BackendInfo{Kind: b.Kind, Mode: b.Mode, Model: b.Model, Slots: b.Slots}}
	var cl closers
	m.Close = cl.close
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	var (
		base *url.URL
		dial func(context.Context, string, string) (net.Conn, error) // managed: only to the process started
	)
	switch {
	case c.Shared != nil: // another persona's server: this model loads beside its
		base, dial = c.Shared.Base, c.Shared.Dial
	case b.Mode == "managed":
		dir := filepath.Join(c.StateDir, "ollama")
		m.Loads = newLineCounter(filepath.Join(dir, "ollama.log"), ollamaLoadMarker).Count
		s, err := ollama.Start(ctx, ollama.ServeConfig{
			Binary: b.ServerBinary(), Addr: cmp.Or(b.Listen, "127.0.0.1:0"), NumParallel: b.Slots, MaxLoaded: c.MaxLoaded,
			ModelsDir: filepath.Join(dir, "models"), HomeDir: filepath.Join(dir, "home"),
			LogPath: filepath.Join(dir, "ollama.log"),
			Env:     append(c.Env, kvCacheEnv(c.Limits.KVCacheType)...),
			Logger:  c.Logger, OnRestart: onRestart,
		})
		if err != nil {
			return nil, err
		}
		cl.add(func() error {
			err := s.Close()
			c.Logger.Info("managed ollama stopped")
			return err
		})
		m.Restarts = s.Restarts
		base, dial = s.URL(), s.DialContext
	default:
		if base, err = url.Parse(b.URL); err != nil {
			return nil, ctxd.Errorf(ctxd.KindInvalid, "bringup: backend.url: %w", err)
		}
	}
	m.Server = &Server{Base: base, Dial: dial}
	m.Info.URL = base.String()

	probe := ollama.New(base, b.Model, ollama.Options{Dial: dial})
	if m.Info.Version, err = probe.Version(ctx); err != nil {
		return nil, err
	}
	if (b.Mode == "managed" || c.Shared != nil) && b.GGUF != "" {
		c.Logger.Info("importing model", "model", b.Model, "gguf", b.GGUF)
		if err := probe.Import(ctx, b.GGUF); err != nil {
			return nil, err
		}
	}
	of, err := probe.Facts(ctx)
	if err != nil {
		return nil, err
	}
	facts := Facts{Architecture: of.Architecture, ContextLength: of.ContextLength, GGUFPath: of.GGUFPath,
		Info: of.Info, Template: of.Template, Stop: of.Stop}
	m.Info.Architecture, m.Info.TrainedCtx = facts.Architecture, facts.ContextLength
	m.ModelInfo = facts.Info
	if m.Facts, m.Window, err = c.planWindow(facts); err != nil {
		return nil, err
	}
	m.Planned = PlannedBytes(m.Window, VocabSize(facts.Info), 0)
	if m.Facts.SlidingWindow > 0 {
		c.Logger.Warn("the model attends over a sliding window, and Ollama's cache keeps only the window in those layers: a new session over the same codex, and any turn that does not extend the last, evaluate their whole prompt; llama-server (backend.kind = \"llamacpp\"), which ctxd starts with --swa-full, reuses them (docs/models.md)",
			"sliding_window", m.Facts.SlidingWindow, "swa_layers", m.Facts.SWALayers, "layers", m.Facts.BlockCount)
	}
	m.Info.NumCtx, m.Info.KVCacheType = m.Window.NumCtx, string(m.Window.CacheType)
	keepAlive := b.KeepAlive.Duration
	client := ollama.New(base, b.Model, ollama.Options{
		NumCtx: m.Window.NumCtx, NumBatch: b.NumBatch, NumThread: b.NumThread, KeepAlive: &keepAlive,
		Temperature: b.Temperature, Seed: b.Seed, Dial: dial,
	})
	tok, err := llamatok.Open(facts.GGUFPath)
	if err != nil {
		return nil, fmt.Errorf("bringup: tokenizer for %s: %w", b.Model, err)
	}
	cl.add(tok.Close)
	if m.Format, m.Info.Format, err = c.chooseFormat(b.Format, facts, tok.Special()); err != nil {
		return nil, err
	}
	c.Logger.Info("prompt format", "format", m.Info.Format.Name, "append_only", m.Info.Format.AppendOnly, "note", m.Info.Format.Note, "reason", m.Info.Format.Reason)
	c.Logger.Info("loading model", "model", b.Model, "num_ctx", m.Window.NumCtx, "slots", m.Window.Slots, "num_batch", b.NumBatch,
		"kv_cache", m.Window.CacheType, "kv_bytes", m.Window.KVBytes, "plan", m.Window.Reason)
	if err := client.Load(ctx); err != nil {
		return nil, err
	}
	c.Memory.SetPlan(uint64(m.Window.WeightsBytes+m.Window.KVBytes), true) // loaded: the used memory holds it
	m.Backend, m.Tokenizer, m.TokenizerID = client, tok, filepath.Base(facts.GGUFPath)
	// Evacuated: the model unloads (Ollama cannot save a slot, so a return
	// evaluates its prompt again); restored: loaded again.
	m.Suspend, m.Resume = client.Unload, client.Load
	if b.Mode == "managed" || c.Shared != nil {
		var last atomic.Int64 // the runner found last: checked first, so that most reads scan nothing
		m.PID = func() int {
			if pid := int(last.Load()); pid > 0 && isRunner(pid, facts.GGUFPath) {
				return pid
			}
			pid := runnerPID(facts.GGUFPath)
			last.Store(int64(pid))
			return pid
		}
	}
	return m, nil
}

// runnerPID is the process id of the Ollama runner that serves the model
// file at path (Ollama runs one per loaded model: `ollama runner --model
// PATH ...`), 0 if none runs.
func runnerPID(path string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if pid, _ := strconv.Atoi(filepath.Base(p)); isRunner(pid, path) {
			return pid
		}
	}
	return 0
}

// isRunner reports whether process pid is an Ollama runner serving the
// model file at path.
func isRunner(pid int, path string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	return len(args) > 2 && args[1] == "runner" && slices.Contains(args, path)
}

// kvCacheEnv is the managed server's environment for a KV cache type:
// Ollama quantizes the cache only with flash attention on.
func kvCacheEnv(cacheType string) []string {
	if cacheType == "" || cacheType == string(governor.CacheF16) {
		return nil
	}
	return []string{"OLLAMA_FLASH_ATTENTION=1", "OLLAMA_KV_CACHE_TYPE=" + cacheType}
}
