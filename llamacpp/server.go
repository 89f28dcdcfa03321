package llamacpp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/ctxd/ctxd/supervise"
)

// ServeConfig says how to run a private llama-server.
type ServeConfig struct {
	Binary string // path to llama-server
	// Addr is a loopback host:port (port 0 picks a free one) or the path of
	// a Unix socket ending in .sock.
	Addr         string
	Model        string // the GGUF file
	CtxPerSlot   int    // each slot's window; the server gets CtxPerSlot × Slots
	Slots        int
	SlotSavePath string // where slots are saved and restored
	CacheRAMMiB  int    // the host-memory prompt cache (--cache-ram); 0: none
	CacheReuse   int    // the smallest chunk shifted from the cache past a change (--cache-reuse); 0: none
	Threads      int    // 0: the server's default
	BatchSize    int    // 0: the server's default
	// SWAFull keeps the whole window's cache in a sliding-window model's
	// windowed layers (--swa-full): without it llama-server keeps only the
	// window there and cannot reuse a cached prefix longer than the window
	// ("forcing full prompt re-processing").
	SWAFull     bool
	LogPath     string
	Env         []string // the server's environment, KEY=VALUE pairs (PATH...); ctxd adds its API key
	Logger      *slog.Logger
	OnRestart   func()
	StopTimeout time.Duration
}

// Server is a supervised llama-server. Its Client sends the server's API
// key and dials only the process started (the supervisor's DialContext).
type Server struct {
	*supervise.Process
	*Client
}

// Args are the flags a managed server gets: every slot its own window
// (-np given, so the KV cache is not unified), a sliding-window model's
// cache whole where SWAFull says so, the host-RAM prompt cache
// the memory plan counted (none by default: ctxd keeps prefixes warm in
// the slots and in saved slot files), chunk reuse where CacheReuse asks
// for it, no web UI.
func (c ServeConfig) Args(host string, port int) []string {
	args := []string{"-m", c.Model, "--host", host}
	if port > 0 {
		args = append(args, "--port", strconv.Itoa(port))
	}
	args = append(args, "-c", strconv.Itoa(c.CtxPerSlot*max(1, c.Slots)), "-np", strconv.Itoa(max(1, c.Slots)),
		"--slot-save-path", c.SlotSavePath, "--cache-ram", strconv.Itoa(max(0, c.CacheRAMMiB)), "--no-webui")
	if c.CacheReuse > 0 {
		args = append(args, "--cache-reuse", strconv.Itoa(c.CacheReuse))
	}
	if c.Threads > 0 {
		args = append(args, "-t", strconv.Itoa(c.Threads))
	}
	if c.BatchSize > 0 {
		args = append(args, "-b", strconv.Itoa(c.BatchSize))
	}
	if c.SWAFull {
		args = append(args, "--swa-full")
	}
	return args
}

// Start starts llama-server and returns once it has loaded the model,
// holding its address itself (another process answering there is refused).
// The server requires an API key: opts.APIKey, or a random one made for
// this server when that is empty. It goes to the server in its environment
// (LLAMA_API_KEY), not on its command line, which every local user can
// read, and is never logged.
func Start(ctx context.Context, cfg ServeConfig, opts Options) (*Server, error) {
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("llamacpp: serve: binary %q: %w (set backend.binary or CTXD_LLAMA_SERVER)", cfg.Binary, err)
	}
	if err := os.MkdirAll(cfg.SlotSavePath, 0o700); err != nil {
		return nil, fmt.Errorf("llamacpp: serve: %w", err)
	}
	var host, addr, network, listen string
	port := 0
	if strings.HasSuffix(cfg.Addr, ".sock") {
		host, addr, network, listen = cfg.Addr, cfg.Addr, "unix", cfg.Addr
	} else {
		h, p, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("llamacpp: serve: addr %q: %w", cfg.Addr, err)
		}
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("llamacpp: serve: addr %q: a managed server listens on a loopback address or a Unix socket only", cfg.Addr)
		}
		if p == "0" {
			ln, err := net.Listen("tcp", net.JoinHostPort(h, "0"))
			if err != nil {
				return nil, fmt.Errorf("llamacpp: serve: pick a port: %w", err)
			}
			p = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
			ln.Close()
		}
		port, _ = strconv.Atoi(p)
		host, addr, network, listen = h, "http://"+net.JoinHostPort(h, p), "tcp", net.JoinHostPort(h, p)
	}
	if opts.APIKey == "" {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("llamacpp: serve: api key: %w", err)
		}
		opts.APIKey = hex.EncodeToString(key)
	}
	// The readiness check asks /health, which llama-server answers without
	// the key: whatever answers is asked before the supervisor has checked
	// who it is, so it gets no key.
	ping, err := New(addr, Options{})
	if err != nil {
		return nil, err
	}
	args := cfg.Args(host, port)
	env := append(slices.Clip(cfg.Env), "LLAMA_API_KEY="+opts.APIKey)
	proc, err := supervise.Start(ctx, supervise.Config{
		Name: "llama-server",
		Command: func() *exec.Cmd {
			if network == "unix" {
				clearSocket(listen, cfg.Logger)
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = env
			return cmd
		},
		LogPath: cfg.LogPath, Ready: ping.Health, Network: network, Addr: listen, OnRestart: cfg.OnRestart,
		StopTimeout: cfg.StopTimeout, Logger: cfg.Logger,
		ReadyTimeout: 5 * time.Minute, // a large model loads for a while
	})
	if err != nil {
		return nil, fmt.Errorf("llamacpp: %w", err)
	}
	opts.Dial = proc.DialContext
	client, err := New(addr, opts)
	if err != nil {
		proc.Close()
		return nil, err
	}
	if cfg.Logger != nil {
		cfg.Logger.Info("llama-server is up", "addr", addr, "slots", cfg.Slots, "ctx_per_slot", cfg.CtxPerSlot, "log", cfg.LogPath)
	}
	return &Server{Process: proc, Client: client}, nil
}

// clearSocket removes the socket file of a server that is gone (one that
// crashed): llama-server does not bind over it. A path that is not a
// socket, or one something still answers on, stays: the server then fails
// to start, and the supervisor says who holds the socket.
func clearSocket(path string, log *slog.Logger) {
	info, err := os.Lstat(path)
	if err != nil || info.Mode().Type() != fs.ModeSocket {
		return
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		if err := os.Remove(path); err != nil && log != nil {
			log.Warn("cannot remove a stale llama-server socket", "path", path, "err", err)
		}
	}
}

// VocabSizeKey is the key ModelInfo adds for the vocabulary's size.
const VocabSizeKey = "ctxd.vocab_size"

// ModelInfo reads a GGUF's metadata the way the governor reads Ollama's
// /api/show model_info (numbers as float64), and its Jinja chat template.
func ModelInfo(path string) (map[string]any, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("llamacpp: %w", err)
	}
	defer f.Close()
	g, _, err := ggml.Decode(f, 1024)
	if err != nil {
		return nil, "", fmt.Errorf("llamacpp: read %s: %w", path, err)
	}
	info := map[string]any{}
	for k, v := range g.KV() {
		switch v := v.(type) {
		case string, bool:
			info[k] = v
		case uint8:
			info[k] = float64(v)
		case int8:
			info[k] = float64(v)
		case uint16:
			info[k] = float64(v)
		case int16:
			info[k] = float64(v)
		case uint32:
			info[k] = float64(v)
		case int32:
			info[k] = float64(v)
		case uint64:
			info[k] = float64(v)
		case int64:
			info[k] = float64(v)
		case float32:
			info[k] = float64(v)
		case float64:
			info[k] = v
		}
	}
	// The vocabulary's size, from the token embeddings' shape (the token
	// list itself is not kept: it is longer than the arrays decoded).
	for _, t := range g.Tensors().Items("token_embd") {
		if t.Name == "token_embd.weight" && len(t.Shape) == 2 {
			info[VocabSizeKey] = float64(t.Shape[1])
		}
	}
	tmpl, _ := info["tokenizer.chat_template"].(string)
	return info, tmpl, nil
}
