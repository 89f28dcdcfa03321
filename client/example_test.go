package client_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/client"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/daemon"
	"github.com/ctxd/ctxd/governor"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/internal/fake"
	"github.com/ctxd/ctxd/sigils"
)

// exampleDaemon runs a daemon on a scripted backend (every answer is "an
// answer"), with a codex of two files, for the examples: it returns the
// socket, the TCP listener's address, a token for sigil "agent", and what
// stops it. A real program dials the socket of `ctxd serve`.
func exampleDaemon(rag bool) (socket, tcp, token string, stop func()) {
	dir, err := os.MkdirTemp("", "ctxd-ex-")
	if err != nil {
		log.Fatal(err)
	}
	codexDir := filepath.Join(dir, "codex")
	os.MkdirAll(codexDir, 0o755)
	os.WriteFile(filepath.Join(codexDir, "listen.go"), []byte("package daemon\n\n// Listen creates the socket.\nfunc Listen(path string) error { return nil }\n"), 0o644)
	os.WriteFile(filepath.Join(codexDir, "README.md"), []byte("# Daemon\nListen creates the socket; Close removes it.\n"), 0o644)
	token, hash, _ := sigils.NewToken()
	cfg := config.Default(config.Env{UID: os.Getuid(), Home: dir})
	cfg.Daemon.Socket = filepath.Join(dir, "ctxd.sock")
	cfg.Daemon.StateDir = filepath.Join(dir, "state")
	cfg.Daemon.TCPListen = "127.0.0.1:0"
	cfg.Codex.Path, cfg.Codex.Watch = codexDir, false
	cfg.Codex.LoadRoots = []string{os.TempDir()} // ExampleClient_LoadCodex loads a tree made there
	if rag {
		cfg.Codex.CAGRatio = 0.001 // too small for the codex: it is retrieved from
	}
	cfg.Limits.AnswerReserve = 64
	cfg.Sigils = map[string]config.Sigil{
		"default": {Scopes: []string{"ask", "search_codex", "sessions:read", "sessions:write", "codex:load"}},
		"agent":   {Scopes: []string{"ask"}, TokenSHA256: hash},
	}
	open := func(context.Context, func()) (*bringup.Model, error) {
		return &bringup.Model{
			Backend: fake.NewBackend(), Tokenizer: fake.Tokenizer{}, TokenizerID: "fake",
			Info:   bringup.BackendInfo{Kind: "fake", Mode: "fake", Model: "demo", NumCtx: 100000, Slots: 1},
			Window: governor.WindowPlan{NumCtx: 100000, Slots: 1, CacheType: governor.CacheF16},
			Close:  func() error { return nil },
		}, nil
	}
	d, err := daemon.New(cfg, daemon.Options{Open: open, Store: fake.NewStore(), Sensor: fake.NewSensor()})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := daemon.Listen(cfg.Daemon.Socket)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- d.Run(ctx, ln, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		log.Fatal(err)
	case <-time.After(30 * time.Second):
		log.Fatal("the example daemon did not start")
	}
	return cfg.Daemon.Socket, "http://" + d.TCPAddr(), token, func() {
		cancel()
		<-done
		os.RemoveAll(dir)
	}
}

// An agent asks twice in one session: the second prompt extends the first
// and its answer, so the backend reuses all of it.
func Example() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	c := client.New(socket)
	for _, q := range []string{"Where is the socket created?", "Who removes it?"} {
		var answer strings.Builder
		sum, err := c.Ask(context.Background(), ctxd.AskRequest{Session: "agent-1", Query: q}, func(piece string) {
			answer.WriteString(piece)
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("turn %d: %q, prompt reused: %v\n", sum.Turn, answer.String(), sum.CachedTokens > 0)
	}
	// Output:
	// turn 1: "an answer", prompt reused: false
	// turn 2: "an answer", prompt reused: true
}

func ExampleClient_Ask() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	sum, err := client.New(socket).Ask(context.Background(), ctxd.AskRequest{Session: "s", Query: "What does Listen do?"}, func(piece string) {
		fmt.Print(piece) // the answer as it streams
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\n%s mode, turn %d, %s\n", sum.Mode, sum.Turn, sum.DoneReason)
	// Output:
	// an answer
	// cag mode, turn 1, stop
}

func ExampleClient_Health() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	fmt.Println(client.New(socket).Health(context.Background()))
	// Output: <nil>
}

func ExampleClient_Status() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	var st httpapi.Status
	if err := client.New(socket).Status(context.Background(), &st); err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Ready, st.Backend.Model, st.Window.NumCtx, st.Codex.Files, st.Codex.Plan.Mode)
	// Output: true demo 100000 2 cag
}

func ExampleClient_Schema() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	schema, err := client.New(socket).Schema(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.Contains(string(schema), `"title": "ctxd RunContext"`))
	// Output: true
}

func ExampleClient_Sessions() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	c := client.New(socket)
	ctx := context.Background()
	for _, s := range []string{"b", "a", "a"} {
		if _, err := c.Ask(ctx, ctxd.AskRequest{Session: s, Query: "hello"}, nil); err != nil {
			log.Fatal(err)
		}
	}
	sessions, err := c.Sessions(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range sessions {
		fmt.Println(s.ID, s.Turns)
	}
	// Output:
	// a 2
	// b 1
}

func ExampleClient_Session() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	c := client.New(socket)
	ctx := context.Background()
	c.Ask(ctx, ctxd.AskRequest{Session: "s", Query: "What does Listen do?"}, nil)
	s, err := c.Session(ctx, "s")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("epoch %d: %q → %q\n", s.Epoch, s.Turns[0].Query, s.Turns[0].Answer)
	// Output: epoch 0: "What does Listen do?" → "an answer"
}

func ExampleClient_DeleteSession() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	c := client.New(socket)
	ctx := context.Background()
	c.Ask(ctx, ctxd.AskRequest{Session: "s", Query: "hello"}, nil)
	fmt.Println(c.DeleteSession(ctx, "s"))
	sessions, _ := c.Sessions(ctx)
	fmt.Println(len(sessions))
	// Output:
	// <nil>
	// 0
}

func ExampleClient_LastPrompt() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	c := client.New(socket)
	ctx := context.Background()
	c.Ask(ctx, ctxd.AskRequest{Session: "s", Query: "What does Listen do?"}, nil)
	p, err := c.LastPrompt(ctx, "s")
	if err != nil {
		log.Fatal(err)
	}
	var names []string
	for _, b := range p.Blocks {
		names = append(names, b.Name)
	}
	fmt.Println(strings.Join(names, " "))
	fmt.Println(strings.HasSuffix(p.Prompt, "What does Listen do?\n### ASSISTANT\n"))
	// Output:
	// identity codex environment sigil karma state query
	// true
}

func ExampleClient_CodexStats() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	st, err := client.New(socket).CodexStats(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Name == "codex", st.Files, st.Plan.Mode)
	// Output: true 2 cag
}

func ExampleClient_LoadCodex() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	dir, _ := os.MkdirTemp("", "ctxd-ex-tree-")
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "notes.md"), []byte("# Notes\nThe socket lives in the runtime directory.\n"), 0o644)
	st, err := client.New(socket).LoadCodex(context.Background(), dir, func(p ctxd.CodexProgress) {
		// progress, as the files are read (and indexed in RAG mode)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Files, st.Plan.Mode)
	// Output: 1 cag
}

func ExampleClient_SearchCodex() {
	socket, _, _, stop := exampleDaemon(true) // retrieval: the codex is indexed
	defer stop()

	excerpts, err := client.New(socket).SearchCodex(context.Background(), "Listen socket", 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(excerpts), excerpts[0].Path != "")
	// Output: 1 true
}

func ExampleClient_CodexFiles() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	files, err := client.New(socket).CodexFiles(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range files {
		fmt.Println(f.Path, f.Lines)
	}
	// Output:
	// README.md 2
	// listen.go 4
}

func ExampleClient_CodexFile() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	f, err := client.New(socket).CodexFile(context.Background(), "README.md")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(f.Content)
	// Output:
	// # Daemon
	// Listen creates the socket; Close removes it.
}

func ExampleClient_Sigil() {
	socket, _, token, stop := exampleDaemon(false)
	defer stop()

	ctx := context.Background()
	s, _ := client.New(socket).Sigil(ctx) // trusted as the socket's owner
	fmt.Println(s.Name, s.Scopes, s.Authenticated)
	s, _ = client.New(socket, client.WithToken(token)).Sigil(ctx) // the token's sigil
	fmt.Println(s.Name, s.Scopes, s.Authenticated)
	// Output:
	// default [ask codex:load search_codex sessions:read sessions:write] false
	// agent [ask] true
}

// A client of the TCP listener sends a sigil's token with every request.
func ExampleNewTCP() {
	_, tcp, token, stop := exampleDaemon(false)
	defer stop()

	ctx := context.Background()
	_, err := client.NewTCP(tcp).Sessions(ctx)
	fmt.Println(err.(*client.APIError).Status == http.StatusUnauthorized)
	sum, err := client.NewTCP(tcp, client.WithToken(token)).Ask(ctx, ctxd.AskRequest{Session: "tcp", Query: "hello"}, nil)
	fmt.Println(sum.Turn, err)
	// Output:
	// true
	// 1 <nil>
}

// One WebSocket session runs several asks at once, each under its own id.
// An ask whose context ends is cancelled at the daemon (see Conn.Ask), and
// the daemon's notices arrive on Notices.
func ExampleClient_Connect() {
	socket, _, _, stop := exampleDaemon(false)
	defer stop()

	conn, err := client.New(socket).Connect(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	var wg sync.WaitGroup
	turns := make([]string, 2)
	for i, session := range []string{"ws-a", "ws-b"} {
		wg.Go(func() {
			sum, err := conn.Ask(context.Background(), ctxd.AskRequest{Session: session, Query: "Where is the socket created?"}, nil)
			if err != nil {
				log.Fatal(err)
			}
			turns[i] = fmt.Sprintf("%s turn %d", sum.Session, sum.Turn)
		})
	}
	wg.Wait()
	fmt.Println(turns)
	// Output:
	// [ws-a turn 1 ws-b turn 1]
}
