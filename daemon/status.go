package daemon

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/bringup"
	"github.com/ctxd/ctxd/httpapi"
	"github.com/ctxd/ctxd/metrics"
)

// Status is the daemon's state now (GET /v1/status). It reads snapshots
// only: it never waits for a generation, a codex load or the session
// store (the session count is the last one taken in the background).
func (d *Daemon) Status(context.Context) httpapi.Status {
	st := httpapi.Status{Version: d.version, Backend: bringup.BackendInfo{Mode: d.cfg.Backend.Mode, Model: d.cfg.Backend.Model}}
	if e := d.ready.Load(); e != nil {
		st.FillEngine(e)
	} else if msg := d.initErr.Load(); msg != nil {
		st.Error = *msg
	}
	st.Listeners = httpapi.Listeners{Socket: d.cfg.Daemon.Socket, TCP: d.TCPAddr(), Dashboard: d.DashboardAddr(),
		Trust: "no sigil has a token: requests are trusted by uid only (the socket is its owner's, mode 0600) and act as the sigil they name; sigils with uids or gids are checked against the socket peer's"}
	if d.sigils.HasTokens() {
		st.Listeners.Trust = "a request with a token acts as its sigil; one without, on the socket only, is trusted by uid (the socket's owner) and acts as the sigil it names; sigils with uids or gids are checked against the socket peer's"
	}
	if d.probe != nil { // Run opened it
		st.Environment = d.sensor.Environment()
		_, rd := d.probe.Latest()
		counters := d.probe.Counters()
		st.Hardware, st.Bands = &rd, &counters
		if d.sensor == ctxd.Sensor(d.probe) {
			st.MemorySource = rd.Source
		}
	}
	st.Karma = d.karma != nil
	st.Sigils = []httpapi.SigilStatus{}
	defs := d.sigils.Defs()
	for _, name := range slices.Sorted(maps.Keys(defs)) {
		s := defs[name]
		st.Sigils = append(st.Sigils, httpapi.SigilStatus{Name: name, Description: s.Description, Scopes: s.Scopes,
			Token: s.TokenSHA256 != "", Revoked: s.Revoked, UIDs: s.UIDs, GIDs: s.GIDs})
	}
	st.Sessions = d.sessions.get()
	st.LogLevel = strings.ToLower(d.LogLevel().String())
	st.Config, st.Reload = d.opts.ConfigPath, d.lastReload.Load()
	st.Personas = d.personas.Load().status(d)
	return st
}

// metricsSnapshot is the daemon's state for a scrape. It reads snapshots
// only, as status does.
func (d *Daemon) metricsSnapshot() metrics.Snapshot {
	var v metrics.Snapshot
	if e := d.ready.Load(); e != nil {
		e.FillMetrics(&v)
	}
	if p := d.probe; p != nil {
		_, rd := p.Latest()
		v.MemorySource, v.MemoryTotal, v.MemoryFree = rd.Source, rd.TotalBytes, rd.FreeBytes
		v.HostTotal, v.HostAvailable = rd.Host.MemTotalBytes, rd.Host.MemAvailableBytes
	}
	return v
}

// sessionCount is how many sessions the store holds, counted in the
// background so that status never waits for the store: each read asks
// for a fresh count and answers with the last one taken. A store that
// counts (SessionCount) is asked to; another lists its sessions.
type sessionCount struct {
	n    atomic.Int64  // the last count
	kick chan struct{} // a recount is wanted; nil until start
	wg   sync.WaitGroup
}

// countTimeout bounds one count: a stuck store leaves the last count.
const countTimeout = 5 * time.Second

// start counts now and then whenever get asks, until ctx ends; wait
// waits for the counter to return.
func (c *sessionCount) start(ctx context.Context, store ctxd.Store, log *slog.Logger) {
	c.kick = make(chan struct{}, 1)
	c.kick <- struct{}{}
	c.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-c.kick:
			}
			cctx, cancel := context.WithTimeout(ctx, countTimeout)
			n, err := countSessions(cctx, store)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Warn("counting the sessions for status", "err", err)
				}
				continue
			}
			c.n.Store(int64(n))
		}
	})
}

func (c *sessionCount) wait() { c.wg.Wait() }

// get is the last count, and asks for a fresh one.
func (c *sessionCount) get() int {
	if c.kick != nil {
		select {
		case c.kick <- struct{}{}:
		default: // one is asked for already
		}
	}
	return int(c.n.Load())
}

// countSessions counts the store's sessions, the cheapest way it offers.
func countSessions(ctx context.Context, store ctxd.Store) (int, error) {
	if sc, ok := store.(ctxd.SessionCounter); ok {
		return sc.SessionCount(ctx)
	}
	list, err := store.Sessions(ctx)
	return len(list), err
}
