package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"

	"github.com/ctxd/ctxd/daemon"
)

// statusSource is what the notifier asks the daemon: how it is, in a line;
// an error when its request path does not answer.
type statusSource interface {
	StatusLine(ctx context.Context) (string, error)
}

var _ statusSource = (*daemon.Daemon)(nil)

// statusEvery is how often the notifier reads the daemon's status when
// systemd's watchdog does not ask for more often.
const statusEvery = 10 * time.Second

// notifier speaks systemd's notify protocol (sd_notify, through
// go-systemd) for `ctxd serve` in a Type=notify unit: READY=1 once the
// daemon serves, STATUS= lines saying how it is (backend, codex,
// sessions) whenever they change, WATCHDOG=1 at most half of WatchdogSec
// apart and only after the daemon answered its own status (Alive), and
// STOPPING=1 when it begins to stop. Outside systemd (no NOTIFY_SOCKET)
// it does nothing.
type notifier struct {
	src      statusSource
	log      *slog.Logger
	watchdog time.Duration // WatchdogSec (WATCHDOG_USEC); 0: no watchdog
	every    time.Duration // how often it reads the status
	poke     chan struct{} // read the status now
	cancel   context.CancelFunc
	done     chan struct{} // closed when run has returned
}

// notifySystemd starts the notifier; it runs until ctx ends or stop.
func notifySystemd(ctx context.Context, src statusSource, log *slog.Logger) *notifier {
	n := &notifier{src: src, log: log.With("component", "systemd"), every: statusEvery,
		poke: make(chan struct{}, 1), cancel: func() {}, done: make(chan struct{})}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		close(n.done)
		return n
	}
	wd, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.Warn("systemd's watchdog settings are unreadable; not feeding it", "err", err)
	}
	if wd > 0 {
		n.watchdog, n.every = wd, min(wd/2, statusEvery)
	}
	ctx, n.cancel = context.WithCancel(ctx)
	go n.run(ctx)
	return n
}

// ready tells systemd the daemon serves, and its status at once.
func (n *notifier) ready() {
	n.send(sddaemon.SdNotifyReady)
	select {
	case n.poke <- struct{}{}:
	default:
	}
}

// stop ends the notifier (saying STOPPING=1 if it had not yet) and waits
// for it.
func (n *notifier) stop() {
	n.cancel()
	<-n.done
}

// checked is one reading of the daemon's status.
type checked struct {
	line string
	err  error
}

func (n *notifier) run(ctx context.Context) {
	defer close(n.done)
	var checks sync.WaitGroup
	defer checks.Wait() // a check in flight ends with ctx
	tick := time.NewTicker(n.every)
	defer tick.Stop()
	results := make(chan checked, 1)
	var (
		began time.Time // of the check in flight; zero: none
		last  string    // the STATUS= line systemd has
	)
	status := func(line string) {
		if line != last {
			last = line
			n.send("STATUS=" + line)
		}
	}
	// check reads the status, one reading at a time: a daemon that does
	// not answer holds the one in flight, and gets no watchdog ping
	// until it does.
	check := func() {
		if !began.IsZero() {
			waited := time.Since(began).Round(time.Second)
			n.log.Warn("the daemon has not answered its own status; not feeding systemd's watchdog", "waited", waited)
			status(fmt.Sprintf("not answering: its status has not answered for %v", waited))
			return
		}
		began = time.Now()
		checks.Go(func() {
			line, err := n.src.StatusLine(ctx)
			results <- checked{line, err}
		})
	}
	check()
	for {
		select {
		case <-ctx.Done():
			n.send(sddaemon.SdNotifyStopping + "\nSTATUS=stopping")
			return
		case <-tick.C:
			check()
		case <-n.poke:
			check()
		case r := <-results:
			began = time.Time{}
			if r.err != nil {
				if ctx.Err() == nil {
					n.log.Warn("the daemon's status failed; not feeding systemd's watchdog", "err", r.err)
					status("not answering: " + r.err.Error())
				}
				continue
			}
			if n.watchdog > 0 {
				n.send(sddaemon.SdNotifyWatchdog)
			}
			status(r.line)
		}
	}
}

// send sends one notification; a failure is logged (at debug: systemd
// going away is not the daemon's problem).
func (n *notifier) send(state string) {
	if _, err := sddaemon.SdNotify(false, state); err != nil {
		n.log.Debug("sd_notify", "state", state, "err", err)
	}
}
