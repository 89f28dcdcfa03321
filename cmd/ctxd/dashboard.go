package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/ctxd/ctxd"
)

// cmdDashboard prints the address that opens the daemon's dashboard in a
// browser, with a short-lived token in it, and opens it where a desktop
// is present. The address is the dashboard listener's
// (daemon.dashboard_listen), else the TCP listener's.
func cmdDashboard(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	socket := fs.String("socket", "", "daemon socket")
	sigil := fs.String("sigil", "", "the sigil the page shows the daemon to (default: the daemon's default sigil)")
	noOpen := fs.Bool("no-open", false, "print the address only; do not open a browser")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("dashboard: unexpected argument %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dt, err := clientFor(*socket).DashboardToken(ctx, *sigil)
	if err != nil {
		return fmt.Errorf("dashboard: %w", err)
	}
	addr := dashboardURL(dt)
	if addr == "" {
		return errors.New("dashboard: the daemon has no listener a browser can reach: the page is served on its socket only " +
			"(GET /dashboard/). Set daemon.dashboard_listen = \"127.0.0.1:7480\" (or daemon.tcp_listen) in its configuration and restart it")
	}
	fmt.Fprintf(stdout, "%s\n", addr)
	fmt.Fprintf(stderr, "the dashboard as sigil %q; the address's token expires %v after its page closes (%v at most): run `ctxd dashboard` again for a new one\n",
		dt.Sigil, roundMinutes(time.Until(dt.Expires)), roundMinutes(time.Until(dt.MaxUntil)))
	if *noOpen || !hasDesktop() {
		return nil
	}
	if err := openBrowser(addr); err != nil {
		fmt.Fprintf(stderr, "could not open a browser (%v): open the address above\n", err)
	}
	return nil
}

// dashboardURL is the address that opens dt's page: on the dashboard
// listener, else the TCP listener; "" for neither. A listener on every
// interface is reached on loopback.
func dashboardURL(dt *ctxd.DashboardToken) string {
	for _, a := range []string{dt.Dashboard, dt.TCP} {
		if a == "" {
			continue
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1"
			if ip.To4() == nil {
				host = "::1"
			}
		}
		return "http://" + net.JoinHostPort(host, port) + dt.Path
	}
	return ""
}

func roundMinutes(d time.Duration) time.Duration { return d.Round(time.Minute) }

// hasDesktop says whether a browser can be opened here: a graphical
// session on Linux and the BSDs, always on macOS and Windows.
func hasDesktop() bool {
	switch runtime.GOOS {
	case "darwin", "windows":
		return true
	}
	return os.Getenv("DISPLAY") != "" || os.Getenv("WAYLAND_DISPLAY") != ""
}

// openBrowser opens addr in the desktop's browser without waiting for it.
func openBrowser(addr string) error {
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.Command("open", addr)
	case "windows":
		cmd = exec.Command("rundll32", "url.dll,FileProtocolHandler", addr)
	default:
		cmd = exec.Command("xdg-open", addr)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release() // the browser outlives this command

}
