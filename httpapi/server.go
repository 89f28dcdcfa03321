package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/config"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/engine"
	"github.com/ctxd/ctxd/metrics"
	"github.com/ctxd/ctxd/sigils"
)

// Core is the daemon as the HTTP surface sees it.
type Core interface {
	// Engine is the request path, or an error of kind KindUnavailable
	// saying why there is none yet.
	Engine() (*engine.Engine, error)
	// Status is the daemon's state now; it never waits for a request, a
	// codex load or the session store.
	Status(ctx context.Context) Status
	// Reload reads the configuration again and puts it in force.
	Reload(ctx context.Context) ReloadStatus
	// SetLogLevel changes the log's level; LogLevel is the level now.
	SetLogLevel(l slog.Level)
	LogLevel() slog.Level
}

// Config is what the HTTP surface needs besides its Core. Every field but
// Core's own is fixed for the server's life.
type Config struct {
	Daemon config.Daemon // listeners, caps and timeouts
	// LoadRoots are the directories under which POST /v1/codex/load may
	// load a codex (codex.path first, then codex.load_roots).
	LoadRoots []string
	Version   string
	Sigils    *sigils.Registry
	Store     ctxd.Store
	Karma     ctxd.KarmaStore // nil: karma is off
	// KarmaBounds are karma's size bounds (max_note_bytes,
	// max_judgements); zero: unbounded.
	KarmaBounds config.Karma
	Sensor      ctxd.Sensor // WebSocket sessions hear of its band changes
	Metrics     *metrics.Metrics
	// Feed is the dashboard's feed of turns; nil: the dashboard's event
	// stream is unavailable.
	Feed   *dashboard.Feed
	Logger *slog.Logger
}

// Server serves the HTTP surface on the daemon's listeners.
type Server struct {
	cfg  Config
	core Core
	log  *slog.Logger
	hub  *hub     // WebSocket sessions' notices
	mcp  *mcpHTTP // the MCP endpoint's sessions

	websockets *holds // the WebSocket sessions each sigil holds open
	dashboards *holds // the dashboard pages each sigil holds open
	dashTokens *dashboard.Tokens

	stopping     chan struct{}   // closed when the server begins to stop
	stopOnce     sync.Once       //
	requests     context.Context // every request's base context
	stopRequests context.CancelCauseFunc

	tcpAddr     atomic.Pointer[string] // the TCP listener's address, once it listens
	metricsAddr atomic.Pointer[string] // the metrics listener's address, once it listens
	dashAddr    atomic.Pointer[string] // the dashboard listener's address, once it listens

	mu          sync.Mutex     // guards srvs, draining, stopMetrics; handled.Add happens under it
	srvs        []*http.Server // the servers of the socket and the TCP listener
	draining    bool           // shutting down: new requests are refused
	stopMetrics func()         // stops the metrics listener; nil without one
	handled     sync.WaitGroup // requests being served
	serveErr    chan error     // a listener that stopped serving
}

// New returns a server of core; Serve starts it.
func New(cfg Config, core Core) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	srv := &Server{cfg: cfg, core: core, log: cfg.Logger, stopping: make(chan struct{}), serveErr: make(chan error, 3)}
	srv.requests, srv.stopRequests = context.WithCancelCause(context.Background())
	srv.hub = newHub(srv.stopping, cfg.Sensor, cfg.Logger)
	srv.websockets = newHolds("WebSocket sessions", "daemon.max_websockets_per_sigil", cfg.Daemon.MaxWebSocketsPerSigil)
	srv.dashboards = newHolds("dashboard pages", "daemon.max_dashboards_per_sigil", cfg.Daemon.MaxDashboardsPerSigil)
	srv.dashTokens = dashboard.NewTokens()
	srv.mcp = newMCPHTTP(srv)
	return srv
}

// errShuttingDown is the cause with which requests still running at the
// end of the shutdown grace period are stopped.
var errShuttingDown = &ctxd.Error{Kind: ctxd.KindInterrupted,
	Message: "ctxd is shutting down and stopped the request at the end of its grace period (daemon.shutdown_grace)"}

// Serve serves the API on sock (the Unix socket) and on the TCP and
// metrics listeners the configuration names, which it opens first: an
// address that cannot be listened on is an error at once, and nothing is
// served. Serving goes on until Shutdown; Err reports a listener that
// stopped serving before that.
func (srv *Server) Serve(sock net.Listener) error {
	newServer := func(tokens bool) *http.Server {
		return &http.Server{
			Handler:           srv.bodyDeadline(srv.routes(tokens)),
			ReadHeaderTimeout: srv.cfg.Daemon.HeaderTimeout.Duration,
			IdleTimeout:       srv.cfg.Daemon.IdleTimeout.Duration,
			BaseContext:       func(net.Listener) context.Context { return srv.requests },
			ErrorLog:          slog.NewLogLogger(srv.log.Handler(), slog.LevelWarn),
		}
	}
	var tln net.Listener
	if addr := srv.cfg.Daemon.TCPListen; addr != "" {
		var err error
		if tln, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("httpapi: daemon.tcp_listen: %w", err)
		}
	}
	var dln net.Listener
	if addr := srv.cfg.Daemon.DashboardListen; addr != "" {
		var err error
		if dln, err = net.Listen("tcp", addr); err != nil {
			if tln != nil {
				tln.Close()
			}
			return fmt.Errorf("httpapi: daemon.dashboard_listen: %w", err)
		}
	}
	if addr := srv.cfg.Daemon.MetricsListen; addr != "" {
		stop, err := srv.serveMetrics(addr)
		if err != nil {
			for _, ln := range []net.Listener{tln, dln} {
				if ln != nil {
					ln.Close()
				}
			}
			return err
		}
		srv.mu.Lock()
		srv.stopMetrics = stop
		srv.mu.Unlock()
	}
	sockSrv := newServer(false)
	sockSrv.ConnContext = withPeer // the socket peer's uid and gid, checked against the sigil's
	srv.mu.Lock()
	defer srv.mu.Unlock()
	srv.srvs = append(srv.srvs, sockSrv)
	go func() {
		srv.serveErr <- serveCapped(sockSrv, sock, srv.cfg.Daemon.MaxConnections, srv.cfg.Daemon.MaxUnauthenticated)
	}()
	srv.log.Info("listening", "socket", sock.Addr().String())
	if tln != nil {
		addr := tln.Addr().String()
		srv.tcpAddr.Store(&addr)
		tcp := newServer(true)
		srv.srvs = append(srv.srvs, tcp)
		go func() {
			srv.serveErr <- serveCapped(tcp, tln, srv.cfg.Daemon.MaxConnections, srv.cfg.Daemon.MaxUnauthenticated)
		}()
		srv.log.Info("listening", "tcp", addr, "tokens", "required")
	}
	if dln != nil {
		addr := dln.Addr().String()
		srv.dashAddr.Store(&addr)
		ds := newServer(true)
		ds.Handler = srv.bodyDeadline(srv.dashboardHandler())
		srv.srvs = append(srv.srvs, ds)
		go func() {
			srv.serveErr <- serveCapped(ds, dln, srv.cfg.Daemon.MaxConnections, srv.cfg.Daemon.MaxUnauthenticated)
		}()
		srv.log.Info("listening", "dashboard", addr, "tokens", "required")
	}
	return nil
}

// Err reports the error of a listener that stopped serving.
func (srv *Server) Err() <-chan error { return srv.serveErr }

// Stopping is closed when the server begins to stop.
func (srv *Server) Stopping() <-chan struct{} { return srv.stopping }

// TCPAddr is the TCP listener's address ("" when there is none yet).
func (srv *Server) TCPAddr() string {
	if a := srv.tcpAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// MetricsAddr is the metrics listener's address ("" when there is none).
func (srv *Server) MetricsAddr() string {
	if a := srv.metricsAddr.Load(); a != nil {
		return *a
	}
	return ""
}

// Shutdown stops accepting requests, lets running ones finish within
// grace, then stops those still running (each gets a final error event
// saying its answer was not recorded) and waits, briefly, for their
// handlers; then it ends the MCP sessions and the metrics listener.
func (srv *Server) Shutdown(grace time.Duration) {
	srv.stopOnce.Do(func() { srv.shutdown(grace) })
}

func (srv *Server) shutdown(grace time.Duration) {
	close(srv.stopping)
	srv.mu.Lock()
	srv.draining = true
	srvs, stopMetrics := srv.srvs, srv.stopMetrics
	srv.mu.Unlock()
	srv.drain(srvs, grace)
	srv.mcp.close()
	if stopMetrics != nil {
		stopMetrics() // after the drain: a scrape during it still answers
	}
	srv.stopRequests(nil)
}

// drain shuts the servers down within grace, then stops the requests
// still running and waits (briefly) for their handlers to send their
// final events.
func (srv *Server) drain(srvs []*http.Server, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	errs := make(chan error, len(srvs))
	for _, srv := range srvs {
		go func() { errs <- srv.Shutdown(ctx) }()
	}
	failed := false
	for range srvs {
		if err := <-errs; err != nil {
			failed = true
		}
	}
	// Shutdown forgets hijacked connections (WebSocket sessions): their
	// handlers have the rest of the grace period too.
	if !failed && !srv.waitHandled(ctx) {
		failed = true
	}
	if !failed {
		return
	}
	closeAll := func() {
		for _, srv := range srvs {
			srv.Close()
		}
	}
	srv.log.Warn("requests still running at the end of the shutdown grace period; stopping them")
	srv.stopRequests(errShuttingDown)
	if srv.waitHandledFor(handlerStopTimeout) {
		closeAll()
		return
	}
	srv.log.Error("request handlers did not end after being stopped; closing their connections", "after", handlerStopTimeout)
	closeAll() // their writes fail now, and they return
	if !srv.waitHandledFor(handlerStopTimeout) {
		srv.log.Error("request handlers still running; closing the backend and the store under them", "after", 2*handlerStopTimeout)
	}
}

// waitHandled waits for the running handlers until stop; false if some
// are still running then. Once the servers are shut down, it waits for
// the handlers http.Server.Shutdown does not: those of hijacked
// connections (WebSocket sessions), which it forgets.
func (srv *Server) waitHandled(ctx context.Context) bool {
	done := make(chan struct{})
	go func() { srv.handled.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitHandledFor is waitHandled for at most d.
func (srv *Server) waitHandledFor(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return srv.waitHandled(ctx)
}

// handlerStopTimeout bounds the wait for stopped handlers: a generation
// stops at once, so this is a safety net, not a policy.
const handlerStopTimeout = 3 * time.Second

// track counts the requests being served, so a shutdown can wait for
// their handlers to send their last event; once the server is shutting
// down it refuses new ones.
func (srv *Server) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.mu.Lock()
		if srv.draining {
			srv.mu.Unlock()
			writeError(w, ctxd.Errorf(ctxd.KindUnavailable, "ctxd is shutting down"))
			return
		}
		srv.handled.Add(1)
		srv.mu.Unlock()
		defer srv.handled.Done()
		next.ServeHTTP(w, r)
	})
}

// bodyDeadline bounds how long a client may take to send a request's
// body (daemon.body_timeout): a connection that sends headers and then
// trickles, or stops, is cut off then, instead of holding a descriptor and
// a goroutine forever. The deadline is lifted once the body is read, so
// the answer's stream is not bound by it; requests without a body (the
// WebSocket and MCP streams among them) get none.
func (srv *Server) bodyDeadline(next http.Handler) http.Handler {
	timeout := srv.cfg.Daemon.BodyTimeout.Duration
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
			rc := http.NewResponseController(w)
			if rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody lifts its read deadline when the body ends.
type deadlineBody struct {
	io.ReadCloser
	lift   func()
	lifted bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.lifted {
		b.lifted = true
		b.lift()
	}
	return n, err
}

// IsClosed reports whether err is the error of a server closed by
// Shutdown, which is no failure.
func IsClosed(err error) bool { return errors.Is(err, http.ErrServerClosed) }

// The routes, grouped by what they serve; each group is the server seen
// from its routes.
type (
	// daemonRoutes: health, status, schema, the request's sigil, the log
	// level and reload.
	daemonRoutes struct{ *Server }
	// sessionRoutes: asks and the sessions they build.
	sessionRoutes struct{ *Server }
	// codexRoutes: the codex's stats, loads, search and files.
	codexRoutes struct{ *Server }
	// karmaRoutes: traces and their judgements.
	karmaRoutes struct{ *Server }
	// wsRoutes: WebSocket sessions.
	wsRoutes struct{ *Server }
)
