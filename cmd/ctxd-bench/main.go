// Command ctxd-bench runs ctxd's benchmark harness (package bench) on the
// real backends: a multi-turn session three ways, the sidecar's overhead,
// compose latency, scaling with the codex, many agents, llama-server
// against Ollama, and RAG. It rewrites its section of docs/benchmarks.md,
// the figures in README.md and docs/bench/ (results.json and the plots).
// `make bench` runs it. It is a binary of its own so that the daemon's
// (ctxd) links neither the harness nor its plotting library.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `ctxd-bench: ctxd's benchmark harness on the real backends

  ctxd-bench [--ollama BIN] [--llama-server BIN] [--phases P,...] [--out DIR] [--doc FILE] [--readme FILE]
  ctxd-bench --replot [--out DIR] [--from results.json]   redraw the plots without running
  ctxd-bench edits --repo NAME=DIR[:SUBDIR] ... [--commits N] [--doc FILE]
                                          replay histories: what each commit costs a cached codex

Flags: ctxd-bench --help.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return 0
	}
	var err error
	if len(args) > 0 && args[0] == "edits" {
		err = cmdEdits(args[1:], stdout, stderr)
	} else {
		err = cmdBench(args, stdout, stderr)
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, "ctxd-bench:", err)
	return 1
}
