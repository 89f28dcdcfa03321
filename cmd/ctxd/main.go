// Command ctxd is the context sidecar for local LLM agents: `ctxd serve`
// runs the daemon; the other subcommands are its clients and tools.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/modelgen"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/systemd"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `ctxd — the context sidecar for local LLM agents

Usage:
  ctxd serve    [--config FILE] [--socket PATH] [--model NAME --gguf FILE --num-ctx N] [--backend-url URL]   run the daemon
  ctxd ask      [--session S] [--sigil NAME] [--pin] [--refresh-karma] [--json] QUESTION
  ctxd status   [--json]                          the daemon's state: an overview, or the JSON of GET /v1/status
  ctxd dashboard [--sigil NAME] [--no-open]       the address of the live dashboard (with a short-lived token); opens it on a desktop
  ctxd reload   [--token T]                       have the daemon read its config, sigils and codex settings again (as SIGHUP)
  ctxd log-level [--token T] [LEVEL]              show the daemon's log level, or change it (debug, info, warn, error)
  ctxd sessions [--token T | --sigil NAME]        list the sessions of a sigil (an agent's: its token, or its name on the socket)
  ctxd prompt   [--session S] [--token T | --sigil NAME] [--json]  the exact prompt the session last sent to the backend
  ctxd codex load PATH                            load PATH as the daemon's codex (progress on a terminal)
  ctxd codex stats [--json]                       totals, mode and why, largest files, redactions, skips
  ctxd codex bench --gguf MODEL PATH              time first load, unchanged reload, one-file-changed reload
  ctxd schema                                     print the RunContext JSON Schema
  ctxd mcp      [--socket PATH] [--token TOKEN]   serve MCP on stdin/stdout for an agent (token also from $CTXD_TOKEN)
  ctxd karma list|show|verify|reject|pin|unpin|supersede|epochs   the sigil's traces and their judgements
  ctxd sigil add NAME [--scopes a,b] [--config FILE]  a new sigil and its token (printed once)
  ctxd sigil token NAME                           a new token for sigil NAME (printed once) and its config line
  ctxd sigil revoke NAME --config FILE [--all]    the lines that revoke its token (or the sigil)
  ctxd genmodel --out FILE [flags]                write a random-weight GGUF model
  ctxd systemd-units [--config FILE] DIR          write the systemd unit files (a user service and its socket)
  ctxd version

Clients find the daemon at --socket, else $CTXD_SOCKET, else the default
socket ($XDG_RUNTIME_DIR/ctxd/ctxd.sock or /tmp/ctxd-$UID/ctxd.sock).
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	// Libraries that log through the default logger (llama.cpp's loader
	// via the Ollama module) speak only when something is wrong.
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = cmdServe(args[1:], stderr)
	case "ask":
		err = cmdAsk(args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(args[1:], stdout)
	case "dashboard":
		err = cmdDashboard(args[1:], stdout, stderr)
	case "reload":
		err = cmdReload(args[1:], stdout)
	case "log-level":
		err = cmdLogLevel(args[1:], stdout)
	case "sessions":
		err = cmdGet(args[1:], stdout, "/v1/sessions")
	case "prompt":
		err = cmdPrompt(args[1:], stdout)
	case "codex":
		err = cmdCodex(args[1:], stdout, stderr)
	case "schema":
		_, err = stdout.Write(runcontext.Schema())
	case "mcp":
		err = cmdMCP(args[1:], stderr)
	case "sigil":
		err = cmdSigil(args[1:], stdout)
	case "karma":
		err = cmdKarma(args[1:], stdout)
	case "genmodel":
		err = cmdGenModel(args[1:], stdout)
	case "systemd-units":
		err = cmdUnits(args[1:], stdout)
	case "version":
		fmt.Fprintln(stdout, "ctxd", version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "ctxd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintln(stderr, "ctxd:", err)
		return 1
	}
	return 0
}

func processEnv() config.Env {
	return config.Env{
		UID: os.Getuid(), XDGRuntimeDir: os.Getenv("XDG_RUNTIME_DIR"),
		XDGStateHome: os.Getenv("XDG_STATE_HOME"), Home: os.Getenv("HOME"),
		LlamaServer: os.Getenv("CTXD_LLAMA_SERVER"),
	}
}

// socketPath picks the client's socket: flag, $CTXD_SOCKET, default.
func socketPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if s := os.Getenv("CTXD_SOCKET"); s != "" {
		return s
	}
	return config.DefaultSocket(processEnv())
}

func clientFor(socket string) *client.Client { return client.New(socketPath(socket), daemonUIDs()...) }

// daemonUIDs are the options that let the client trust a daemon running
// as another user: $CTXD_DAEMON_UIDS, comma-separated uids (a system
// service's). A malformed list trusts no one extra, and says so.
func daemonUIDs() []client.Option {
	v := os.Getenv("CTXD_DAEMON_UIDS")
	if v == "" {
		return nil
	}
	var uids []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "ctxd: CTXD_DAEMON_UIDS: %q is not a uid; ignored\n", f)
			continue
		}
		uids = append(uids, n)
	}
	return []client.Option{client.WithDaemonUIDs(uids...)}
}

func cmdServe(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "TOML config file (default: built-in defaults)")
	socket := fs.String("socket", "", "Unix socket path (overrides daemon.socket)")
	// A bigger window is a model trained for it: `make run WINDOW=32768`
	// generates one and passes these three.
	model := fs.String("model", "", "the backend's model name (overrides backend.model)")
	gguf := fs.String("gguf", "", "the model file, relative to the working directory (overrides backend.gguf)")
	numCtx := fs.Int("num-ctx", 0, "the context window in tokens (overrides backend.num_ctx)")
	// A model an Ollama (or llama-server) of the user's own already serves.
	backendURL := fs.String("backend-url", "", "a model server you run (Ollama, or llama-server with backend.kind llamacpp): external mode at this URL, serving --model (overrides backend.mode and backend.url)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	if *gguf != "" {
		abs, err := filepath.Abs(*gguf)
		if err != nil {
			return fmt.Errorf("--gguf: %w", err)
		}
		*gguf = abs
	}
	env := processEnv()
	// load reads the configuration as this command line says: at start,
	// and again for each reload.
	load := func() (config.Config, error) {
		cfg := config.Default(env)
		if *cfgPath != "" {
			var err error
			if cfg, err = config.Load(*cfgPath, env); err != nil {
				return cfg, err
			}
		}
		if *socket != "" {
			cfg.Daemon.Socket = *socket
		} else if s := os.Getenv("CTXD_SOCKET"); s != "" {
			cfg.Daemon.Socket = s
		}
		if *model != "" {
			cfg.Backend.Model = *model
		}
		if *gguf != "" {
			cfg.Backend.GGUF = *gguf
		}
		if *numCtx != 0 {
			cfg.Backend.NumCtx = *numCtx
		}
		if *backendURL != "" {
			// The configuration's managed model file is not that server's.
			cfg.Backend.Mode, cfg.Backend.URL, cfg.Backend.GGUF = "external", *backendURL, *gguf
		}
		return cfg, cfg.Validate()
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Daemon.LogLevel)); err != nil {
		return fmt.Errorf("daemon.log_level: %w", err)
	}
	levelVar := new(slog.LevelVar)
	levelVar.Set(level)
	logger := slog.New(logHandler(stderr, cfg.Daemon.LogFormat, levelVar))
	// Libraries that log through the default logger (llama.cpp's loader
	// via the Ollama module) speak only when something is wrong.
	slog.SetDefault(slog.New(logHandler(stderr, cfg.Daemon.LogFormat, max(level, slog.LevelWarn))))
	configPath := ""
	if *cfgPath != "" {
		if configPath, err = filepath.Abs(*cfgPath); err != nil {
			return fmt.Errorf("--config: %w", err)
		}
	}

	d, err := daemon.New(cfg, daemon.Options{
		Logger: logger, Version: version, LogLevel: levelVar, ConfigPath: configPath, Reread: load,
		BackendEnv: []string{"PATH=" + os.Getenv("PATH")},
	})
	if err != nil {
		return err
	}
	ln, err := listener(cfg.Daemon.Socket)
	if err != nil {
		return err
	}
	defer ln.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sigs, stopSignals := operatorSignals()
	defer stopSignals() // after the daemon stopped: a SIGHUP during its drain is caught
	sigCtx, stopHandling := context.WithCancel(context.Background())
	handled := make(chan struct{})
	go func() { defer close(handled); handleSignals(sigCtx, sigs, d, logger) }()
	defer func() { stopHandling(); <-handled }()
	sd := notifySystemd(ctx, d, logger) // READY=1, STATUS=, WATCHDOG=1, STOPPING=1
	defer sd.stop()
	ready := func() {
		logger.Info("ctxd is ready", "socket", cfg.Daemon.Socket, "try", "ctxd ask \"what is this codebase?\"")
		sd.ready()
	}
	return d.Run(ctx, ln, ready)
}

// listener takes the socket systemd passed, if any, else listens itself.
func listener(path string) (net.Listener, error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("systemd socket activation: %w", err)
	}
	if len(lns) > 0 && lns[0] != nil {
		return lns[0], nil
	}
	return daemon.Listen(path)
}

func cmdAsk(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ask", flag.ContinueOnError)
	session := fs.String("session", "default", "session id")
	sigil := fs.String("sigil", "", "sigil to present (default: the daemon's default)")
	asJSON := fs.Bool("json", false, "print the summary as JSON on stdout after the answer")
	pin := fs.Bool("pin", false, "keep this turn verbatim: never compacted or condensed")
	refresh := fs.Bool("refresh-karma", false, "begin a new karma epoch: take in the latest verified traces")
	socket := fs.String("socket", "", "daemon socket")
	if err := fs.Parse(args); err != nil {
		return err
	}
	query := strings.Join(fs.Args(), " ")
	if strings.TrimSpace(query) == "" {
		return errors.New("ask: give a question, e.g. ctxd ask \"what does the daemon do?\"")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := clientFor(*socket)
	streamed := false
	sum, err := c.Ask(ctx, ctxd.AskRequest{Session: *session, Query: query, Sigil: *sigil, Pin: *pin, RefreshKarma: *refresh}, func(s string) {
		streamed = true
		fmt.Fprint(stdout, s)
	})
	if streamed {
		fmt.Fprintln(stdout)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(sum)
	}
	note := ""
	if sum.PrefixBreak != nil {
		note = fmt.Sprintf(" · prefix broke at %s (%s)", sum.PrefixBreak.Block, sum.PrefixBreak.Reason)
	}
	for _, a := range sum.Governor {
		note += fmt.Sprintf(" · governor %s: %s", a.Kind, a.Reason)
	}
	if sum.DoneNote != "" {
		note += " · answer incomplete: " + sum.DoneNote
	}
	if k := sum.Karma; k != nil && k.Began != "" {
		note += fmt.Sprintf(" · karma epoch %d (%d traces): %s", k.Epoch, len(k.Traces), k.Began)
	}
	if sum.Trace != 0 {
		note += fmt.Sprintf(" · trace %d (ctxd karma verify %d)", sum.Trace, sum.Trace)
	}
	if sum.QueueWaitMs >= 1 {
		note = fmt.Sprintf(" · queued %.0f ms", sum.QueueWaitMs) + note
	}
	if ws := sum.WorkingSet; ws != nil {
		w := fmt.Sprintf(" · working set of %d files held %d of the top excerpts, %d new (%d tokens)", ws.Files, ws.Hits, ws.ExcerptsNew, ws.ExcerptTokensNew)
		if ws.ExcerptsPresent > 0 {
			w += fmt.Sprintf(", %d already in the history", ws.ExcerptsPresent)
		}
		if ws.Moved != "" {
			w += " · working set moved: " + ws.Moved
		}
		note = w + note
	}
	fmt.Fprintf(stderr, "[session %s turn %d · %s · %s · %d prompt tokens, %d cached (%.1f%%), %d evaluated · ttft %.0f ms (%s) · %d answer tokens%s]\n",
		sum.Session, sum.Turn, sum.Mode, sum.Format, sum.PromptTokens, sum.CachedTokens, sum.ReusePercent,
		sum.EvaluatedTokens, sum.TTFTMillis, timingParts(sum.Timing), sum.AnswerTokens, note)
	return nil
}

// cmdGet prints what GET path answers, acting as the sigil --token or
// --sigil names (see actorClient).
func cmdGet(args []string, stdout io.Writer, path string) error {
	fs := flag.NewFlagSet(strings.TrimPrefix(path, "/v1/"), flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	token := fs.String("token", "", "act as the sigil of this token (default $CTXD_TOKEN)")
	sigil := fs.String("sigil", "", "act as this sigil, on the socket (default $CTXD_SIGIL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	b, err := actorClient(*socket, *token, *sigil).GetRaw(context.Background(), path)
	if err != nil {
		return err
	}
	_, err = stdout.Write(b)
	return err
}

func cmdPrompt(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("prompt", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	session := fs.String("session", "default", "session")
	asJSON := fs.Bool("json", false, "print JSON with each block's offset and size")
	token := fs.String("token", "", "act as the sigil of this token, e.g. an agent's (default $CTXD_TOKEN)")
	sigil := fs.String("sigil", "", "act as this sigil, on the socket (default $CTXD_SIGIL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("prompt: unexpected argument %q (use --session)", fs.Arg(0))
	}
	path := "/v1/sessions/" + url.PathEscape(*session) + "/prompt"
	if *asJSON {
		return cmdGet([]string{"--socket", *socket, "--token", *token, "--sigil", *sigil}, stdout, path)
	}
	var lp ctxd.LastPrompt
	if err := actorClient(*socket, *token, *sigil).GetJSON(context.Background(), path, &lp); err != nil {
		return err
	}
	_, err := io.WriteString(stdout, lp.Prompt)
	return err
}

func cmdGenModel(args []string, stdout io.Writer) error {
	c := modelgen.DefaultConfig()
	if slices.Contains(args, "--demo") || slices.Contains(args, "-demo") {
		c = modelgen.DemoConfig() // flags after it still override
	}
	fs := flag.NewFlagSet("genmodel", flag.ContinueOnError)
	fs.Bool("demo", false, "start from the demo model of make run (5M parameters, 16k window)")
	out := fs.String("out", "", "output GGUF path (required)")
	fs.StringVar(&c.Name, "name", c.Name, "general.name")
	fs.StringVar(&c.Vocab, "vocab", c.Vocab, "vocabulary kind: spm (SentencePiece) or bpe (byte-level BPE)")
	fs.IntVar(&c.VocabSize, "vocab-size", c.VocabSize, "vocabulary size")
	fs.IntVar(&c.Embedding, "embd", c.Embedding, "embedding length")
	fs.IntVar(&c.Layers, "layers", c.Layers, "transformer blocks")
	fs.IntVar(&c.Heads, "heads", c.Heads, "attention heads")
	fs.IntVar(&c.KVHeads, "kv-heads", c.KVHeads, "key/value heads")
	fs.IntVar(&c.FeedForward, "ff", c.FeedForward, "feed-forward length")
	fs.IntVar(&c.ContextLength, "ctx", c.ContextLength, "trained context length")
	fs.BoolVar(&c.F16, "f16", c.F16, "store weight matrices as f16")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "weight seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("genmodel: --out is required")
	}
	wrote, err := modelgen.Ensure(*out, c)
	if err != nil {
		return err
	}
	verb := "wrote"
	if !wrote {
		verb = "up to date"
	}
	fmt.Fprintf(stdout, "%s %s: %s vocabulary of %d, %d layers, embedding %d, %.1fM parameters, context %d\n",
		verb, *out, c.Vocab, c.VocabSize, c.Layers, c.Embedding, float64(c.Params())/1e6, c.ContextLength)
	return nil
}

func cmdUnits(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("systemd-units", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file the service runs with (default: the built-in defaults)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("systemd-units: give the directory to write into, e.g. ~/.config/systemd/user")
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("systemd-units: this binary's path: %w", err)
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return fmt.Errorf("systemd-units: %w", err)
	}
	opts := systemd.Options{Binary: bin}
	cfg := config.Default(processEnv())
	if *cfgPath != "" {
		if opts.Config, err = filepath.Abs(*cfgPath); err != nil {
			return fmt.Errorf("systemd-units: --config: %w", err)
		}
		// The service must start: a config that does not load is an error now.
		if cfg, err = config.Load(opts.Config, processEnv()); err != nil {
			return fmt.Errorf("systemd-units: %w", err)
		}
	}
	opts.Writable = []string{cfg.Daemon.StateDir} // the only place the service may write
	// With nothing listening on the network and a managed backend, the
	// service's network is its own: the backend's port is ctxd's alone.
	opts.PrivateNetwork = cfg.Daemon.TCPListen == "" && cfg.Daemon.MetricsListen == "" && cfg.Backend.Mode == "managed"
	paths, err := systemd.Write(fs.Arg(0), opts)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fmt.Fprintln(stdout, "wrote", p)
	}
	if err := systemd.Verify(context.Background(), nil, paths...); err != nil && !errors.Is(err, systemd.ErrNoAnalyzer) {
		fmt.Fprintln(stdout, "warning:", err)
	}
	for _, p := range systemd.Hidden(opts.Binary, opts.Config, cfg.Daemon.StateDir, cfg.Backend.GGUF, cfg.Backend.Binary, cfg.Codex.Path) {
		fmt.Fprintf(stdout, "warning: the service has a /tmp of its own (PrivateTmp=yes) and cannot see %s\n", p)
	}
	fmt.Fprintf(stdout, "the service runs %s serve", bin)
	if opts.Config != "" {
		fmt.Fprintf(stdout, " --config %s", opts.Config)
	}
	fmt.Fprintln(stdout, "\nnext: systemctl --user daemon-reload && systemctl --user enable --now ctxd.socket")
	return nil
}
