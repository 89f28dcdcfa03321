package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/ctxd/ctxd/daemon"
)

func cmdCodex(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("codex: give a subcommand: load PATH, or stats")
	}
	switch args[0] {
	case "load":
		return cmdCodexLoad(args[1:], stdout, stderr)
	case "stats":
		return cmdCodexStats(args[1:], stdout)
	case "bench":
		return cmdCodexBench(args[1:], stdout)
	}
	return fmt.Errorf("codex: unknown subcommand %q (load, stats, bench)", args[0])
}

func cmdCodexLoad(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("codex load", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("codex load: give the path of a directory or file")
	}
	path, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	body, _ := json.Marshal(map[string]string{"path": path})
	resp, err := post(ctx, socketPath(*socket), "/v1/codex/load", body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()

	var bar *progressbar.ProgressBar
	tty := false
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		tty = true
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev daemon.CodexEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("codex load: bad stream line: %w", err)
		}
		switch ev.Type {
		case "progress":
			p := ev.Progress
			if tty {
				if bar == nil {
					bar = progressbar.NewOptions64(p.TotalBytes, progressbar.OptionSetWriter(stderr),
						progressbar.OptionShowBytes(true), progressbar.OptionSetDescription("loading codex"),
						progressbar.OptionShowCount(), progressbar.OptionClearOnFinish())
				}
				_ = bar.Set64(p.Bytes)
				bar.Describe(fmt.Sprintf("loading codex: %d/%d files, %d tokens", p.Files, p.TotalFiles, p.Tokens))
			} else {
				fmt.Fprintf(stderr, "codex: %d/%d files, %d/%d bytes, %d tokens\n", p.Files, p.TotalFiles, p.Bytes, p.TotalBytes, p.Tokens)
			}
		case "error":
			return fmt.Errorf("codex load: %s", ev.Error)
		case "codex":
			if bar != nil {
				_ = bar.Finish()
			}
			printCodexStats(stdout, ev.Codex)
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("codex load: the stream ended without a result")
}

func cmdCodexStats(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("codex stats", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var st daemon.CodexStats
	if err := clientFor(*socket).GetJSON(context.Background(), "/v1/codex", &st); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printCodexStats(stdout, &st)
	return nil
}

func printCodexStats(w io.Writer, st *daemon.CodexStats) {
	fmt.Fprintf(w, "codex %s (%s)\n", st.Name, st.Root)
	fmt.Fprintf(w, "  %d files, %d bytes, %d tokens, loaded in %.0f ms\n", st.Files, st.Bytes, st.Tokens, st.LoadMillis)
	fmt.Fprintf(w, "  mode %s: %s\n", st.Plan.Mode, st.Plan.Reason)
	if len(st.Largest) > 0 {
		fmt.Fprintln(w, "  largest files by tokens:")
		for _, f := range st.Largest {
			fmt.Fprintf(w, "    %8d  %s\n", f.Tokens, f.Path)
		}
	}
	if !st.Redacting {
		fmt.Fprintln(w, "  secret redaction is OFF for this codex")
	}
	fmt.Fprintf(w, "  %d credentials redacted\n", st.Redactions)
	for _, f := range st.Redacted {
		for _, r := range f.Redactions {
			fmt.Fprintf(w, "    %s:%d  %s\n", f.Path, r.Line, r.Rule)
		}
	}
	if len(st.Skipped) > 0 {
		fmt.Fprintf(w, "  %d skipped:\n", len(st.Skipped))
		for i, s := range st.Skipped {
			if i == 20 {
				fmt.Fprintf(w, "    ... and %d more (ctxd codex stats --json)\n", len(st.Skipped)-20)
				break
			}
			fmt.Fprintf(w, "    %s: %s\n", s.Path, s.Reason)
		}
	}
}

// post sends a JSON body to the daemon and returns the streaming response,
// or the daemon's error.
func post(ctx context.Context, socket, path string, body []byte) (*http.Response, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://ctxd"+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the daemon at %s (is `ctxd serve` running?): %w", socket, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var e struct {
			Error string `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = string(b)
		}
		return nil, fmt.Errorf("%s (HTTP %d)", e.Error, resp.StatusCode)
	}
	return resp, nil
}
