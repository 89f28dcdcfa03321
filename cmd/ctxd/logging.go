package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/ctxd/ctxd/daemon"
)

// logHandler is the daemon's log handler: JSON for systemd's journal (and
// whoever asks for it), text for a person at a terminal; its level is
// level, which changes at runtime.
func logHandler(w io.Writer, format string, level slog.Leveler) slog.Handler {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" || format == "auto" && underJournal(w) {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// underJournal reports whether w is the stream systemd connected to its
// journal: $JOURNAL_STREAM names its device and inode (systemd.exec(5)).
func underJournal(w io.Writer) bool {
	f, ok := w.(*os.File)
	js := os.Getenv("JOURNAL_STREAM")
	if !ok || js == "" {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return js == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// operatorSignals catches SIGHUP and SIGUSR1 from now until the returned
// stop: until the daemon has stopped, neither may end the process (their
// default action), not even during the shutdown's drain.
func operatorSignals() (<-chan os.Signal, func()) {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGUSR1)
	return sigs, func() { signal.Stop(sigs) }
}

// handleSignals serves the operator's signals until ctx ends: SIGHUP
// reloads the configuration (Daemon.Reload); SIGUSR1 switches the log to
// debug and, sent again, back to the level before.
func handleSignals(ctx context.Context, sigs <-chan os.Signal, d *daemon.Daemon, log *slog.Logger) {
	before := slog.LevelInfo
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				log.Info("SIGHUP: reloading the configuration")
				d.Reload(ctx) // logs and reports its outcome itself
			case syscall.SIGUSR1:
				if cur := d.LogLevel(); cur != slog.LevelDebug {
					before = cur
					d.SetLogLevel(slog.LevelDebug)
				} else {
					d.SetLogLevel(before)
				}
			}
		}
	}
}
