package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/reqid"
	"github.com/ctxd/ctxd/sigils"
)

// reqInfo is what the outermost handler learns of a request from the
// handlers inside it: the route's pattern and, for a stream that ended
// with an error event, that error's kind.
type reqInfo struct {
	pattern string
	outcome ctxd.Kind
}

type reqInfoKey struct{}

// noteOutcome records that the request's answer ended with err, for the
// metrics (a stream's status code was sent before it failed).
func noteOutcome(ctx context.Context, err error) {
	if info, ok := ctx.Value(reqInfoKey{}).(*reqInfo); ok {
		info.outcome = ctxd.KindOf(err)
	}
}

// instrument is the outermost handler: it names the request (the
// client's X-Request-Id when valid, else a new one; echoed in the
// response), logs it at debug level, and counts it in the metrics by
// route and outcome.
func (srv *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(reqid.Header)
		if !reqid.Valid(id) {
			id = reqid.New()
		}
		w.Header().Set(reqid.Header, id)
		info := &reqInfo{}
		ctx := reqid.With(context.WithValue(r.Context(), reqInfoKey{}, info), id)
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		next.ServeHTTP(sw, r.WithContext(ctx))
		code := sw.code
		if code == 0 { // no WriteHeader: net/http sent 200, or the handler took the connection
			code = http.StatusOK
			if info.pattern == "GET /v1/ws" && !sw.wrote {
				code = http.StatusSwitchingProtocols // a WebSocket
			}
		}
		outcome := "ok"
		switch {
		case info.outcome != "":
			outcome = string(info.outcome)
		case code >= 400:
			outcome = string(kindOfStatus(code))
		}
		srv.cfg.Metrics.Request(info.pattern, code, outcome)
		srv.log.DebugContext(ctx, "request", "method", r.Method, "route", info.pattern, "code", code, "outcome", outcome,
			"ms", float64(time.Since(start).Microseconds())/1000)
	})
}

// kindOfStatus is the error kind an HTTP status code stands for.
func kindOfStatus(code int) ctxd.Kind {
	for _, k := range []ctxd.Kind{ctxd.KindInvalid, ctxd.KindUnauthorized, ctxd.KindForbidden, ctxd.KindNotFound,
		ctxd.KindMethod, ctxd.KindConflict, ctxd.KindTooLarge, ctxd.KindUnsupported, ctxd.KindDoesNotFit,
		ctxd.KindCanceled, ctxd.KindBackend, ctxd.KindUnavailable} {
		if k.Status() == code {
			return k
		}
	}
	if code >= 500 {
		return ctxd.KindInternal
	}
	return ctxd.KindInvalid
}

// patterns notes the pattern of the route that served each request (the
// metrics' bounded route label; never the raw path).
func patterns(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r) // sets r.Pattern on r itself
		if info, ok := r.Context().Value(reqInfoKey{}).(*reqInfo); ok && info.pattern == "" {
			info.pattern = r.Pattern
		}
	})
}

// statusWriter notes the status code a handler sent.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 && code >= 200 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// serveMetrics serves GET /metrics alone, without tokens, on
// daemon.metrics_listen (a loopback address) until the returned function
// stops it.
func (srv *Server) serveMetrics(addr string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("httpapi: daemon.metrics_listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", srv.cfg.Metrics.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, ctxd.Errorf(ctxd.KindUnknownRoute, "%s %s: this listener (daemon.metrics_listen) serves GET /metrics only", r.Method, r.URL.Path))
	})
	ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: srv.cfg.Daemon.IdleTimeout.Duration,
		ErrorLog: slog.NewLogLogger(srv.log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := ms.Serve(capConnections(ln, 64)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srv.log.Warn("metrics listener", "err", err)
		}
	}()
	a := ln.Addr().String()
	srv.metricsAddr.Store(&a)
	srv.log.Info("listening", "metrics", a)
	return func() { ms.Close(); <-done }, nil
}

// logLevelBody is GET and PUT /v1/log/level's body.
type logLevelBody struct {
	Level string `json:"level"`
}

// requireAdmin is nil when the request acts as a sigil with the admin
// scope.
func (srv daemonRoutes) requireAdmin(r *http.Request) error {
	s, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		return err
	}
	return requireScope(s, sigils.ScopeAdmin)
}

func (srv daemonRoutes) handleLogLevel(w http.ResponseWriter, r *http.Request) {
	if err := srv.requireAdmin(r); err != nil {
		writeError(w, err)
		return
	}
	if r.Method == http.MethodPut {
		var b logLevelBody
		if err := srv.decodeJSON(w, r, &b, `{"level": "debug"}`); err != nil {
			writeError(w, err)
			return
		}
		var l slog.Level
		if err := l.UnmarshalText([]byte(b.Level)); err != nil {
			writeError(w, ctxd.Errorf(ctxd.KindInvalid, "level %q: use debug, info, warn or error", b.Level))
			return
		}
		srv.core.SetLogLevel(l)
	}
	writeJSON(w, http.StatusOK, logLevelBody{Level: strings.ToLower(srv.core.LogLevel().String())})
}

func (srv daemonRoutes) handleReload(w http.ResponseWriter, r *http.Request) {
	if err := srv.requireAdmin(r); err != nil {
		writeError(w, err)
		return
	}
	st := srv.core.Reload(r.Context())
	code := http.StatusOK
	if !st.OK {
		code = http.StatusUnprocessableEntity
	}
	writeJSON(w, code, st)
}
