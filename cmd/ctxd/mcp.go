package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ctxd/ctxd/mcpserver"
)

// cmdMCP serves MCP over stdin and stdout in front of the running daemon.
// stdout is the MCP stream: everything else goes to stderr.
func cmdMCP(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "daemon socket")
	token := fs.String("token", "", "a sigil's token: act as that sigil (default $CTXD_TOKEN; none: the daemon's default sigil)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("mcp: unexpected argument %q (an MCP client runs `ctxd mcp` and talks to it over stdin and stdout)", fs.Arg(0))
	}
	c := tokenClient(*socket, *token)
	logger := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "mcp")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := mcpserver.New(ctx, c, mcpserver.Options{Version: version, Logger: logger})
	if err != nil {
		return err
	}
	return srv.Run(ctx, &mcp.StdioTransport{})
}
