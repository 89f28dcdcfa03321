package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ctxd/ctxd"
	"github.com/ctxd/ctxd/dashboard"
	"github.com/ctxd/ctxd/karma"
	"github.com/ctxd/ctxd/runcontext"
	"github.com/ctxd/ctxd/sigils"
)

// How a dashboard page is kept current: the status at most once a tick and
// only when it changed, karma's counts at most once per karmaEvery after
// a turn, and a keep-alive comment after a quiet pingEvery.
const (
	dashTick      = time.Second
	karmaEvery    = 5 * time.Second
	pingEvery     = 15 * time.Second
	hardwareEvery = 10 * time.Second // the status with a fresh hardware reading, at least this often
	// dashTurns is how many of the latest turns a page opens with.
	dashTurns = 400
)

// dashboardCSP keeps the page to its own files: no script but its module,
// nothing fetched from elsewhere. uPlot sets inline styles.
const dashboardCSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"

// dashRoutes serve the dashboard.
type dashRoutes struct{ *Server }

// register adds the dashboard's routes to mux: the page, its
// event stream, and (where tokens are issued) the token route.
func (srv dashRoutes) register(mux *http.ServeMux, issue bool) {
	mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		// Relative, and set by hand: http.Redirect would make it absolute
		// from a path the token was already taken off.
		loc := "dashboard/"
		if r.URL.RawQuery != "" {
			loc += "?" + r.URL.RawQuery // ?sigil= stays
		}
		w.Header().Set("Location", loc)
		w.WriteHeader(http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /dashboard/{file...}", srv.handlePage)
	mux.HandleFunc("GET /v1/dashboard/events", srv.handleEvents)
	if issue {
		mux.HandleFunc("POST /v1/dashboard/token", srv.handleToken)
	}
}

// isDashboardPath says whether a dashboard token may open path.
func isDashboardPath(path string) bool {
	return path == "/dashboard" || strings.HasPrefix(path, "/dashboard/") || path == "/v1/dashboard/events"
}

// handlePage serves the page's files. The sigil is checked here as on
// every route, so a refused token learns nothing of the page.
func (srv dashRoutes) handlePage(w http.ResponseWriter, r *http.Request) {
	if _, err := srv.actor(r, r.URL.Query().Get("sigil")); err != nil {
		writeError(w, err)
		return
	}
	name := r.PathValue("file")
	if name == "" {
		name = "index.html"
	}
	b, err := fs.ReadFile(dashboard.Page(), name)
	if err != nil {
		writeError(w, ctxd.Errorf(ctxd.KindNotFound, "the dashboard has no file %q", name))
		return
	}
	h := w.Header()
	switch {
	case strings.HasSuffix(name, ".html"):
		h.Set("Content-Type", "text/html; charset=utf-8")
	case strings.HasSuffix(name, ".js"):
		h.Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(name, ".css"):
		h.Set("Content-Type", "text/css; charset=utf-8")
	default:
		h.Set("Content-Type", http.DetectContentType(b))
	}
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer") // the address may carry a token
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// handleToken is POST /v1/dashboard/token: a short-lived token that opens
// the dashboard, and only the dashboard, as the request's sigil.
func (srv dashRoutes) handleToken(w http.ResponseWriter, r *http.Request) {
	who, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	g := dashboard.Grant{Sigil: who.Name}
	if len(requestScopes(r)) > 0 {
		g.Scopes = who.Scopes // narrowed: the token opens no more than the request could see
	}
	if a, _ := r.Context().Value(authKey{}).(authInfo); a.token != "" {
		g.Issuer = a.token // revoked, it takes the dashboard token with it
	}
	now := time.Now()
	tok, exp, err := srv.dashTokens.Issue(g, now)
	if err != nil {
		writeError(w, ctxd.Errorf(ctxd.KindInternal, "dashboard token: %v", err))
		return
	}
	srv.log.InfoContext(r.Context(), "dashboard token issued", "sigil", who.Name, "expires", exp) // never the token
	writeJSON(w, http.StatusOK, ctxd.DashboardToken{Sigil: who.Name, Token: tok, Path: tokenPathPrefix + tok + "/dashboard/",
		Expires: exp, MaxUntil: now.Add(dashboard.TokenMax), Dashboard: srv.DashboardAddr(), TCP: srv.TCPAddr()})
}

// DashboardSnapshot is the first event of a page's stream, and the one it
// gets again after it fell behind: everything it shows.
type DashboardSnapshot struct {
	Viewer  DashboardViewer        `json:"viewer"`
	Version string                 `json:"version"`
	BucketS int                    `json:"bucket_s"`
	Status  Status                 `json:"status"`
	Turns   []dashboard.Turn       `json:"turns"`
	Bands   []dashboard.BandChange `json:"bands"`
	Series  []dashboard.Bucket     `json:"series"`
	Karma   *DashboardKarma        `json:"karma,omitempty"`
}

// DashboardViewer is who the page shows the daemon to.
type DashboardViewer struct {
	Sigil string `json:"sigil"`
	Admin bool   `json:"admin"` // sees every sigil's sessions
}

// DashboardKarma counts the viewer's traces (an admin's: every sigil's),
// of the latest 1000.
type DashboardKarma struct {
	Traces   int `json:"traces"`
	Recorded int `json:"recorded"`
	Verified int `json:"verified"`
	Rejected int `json:"rejected"`
	Pinned   int `json:"pinned"`
	Stale    int `json:"stale"` // verified or pinned, but the code they were answered from changed
}

// dashPage is one open page's stream.
type dashPage struct {
	srv      dashRoutes
	w        http.ResponseWriter
	rc       *http.ResponseController
	r        *http.Request
	who      runcontext.Sigil
	admin    bool
	last     []byte    // the status last sent, as statusKey has it
	statusAt time.Time // when a status was last sent
	karma    *DashboardKarma
	karmaAt  time.Time
	sent     time.Time // when anything was last written
}

// handleEvents is GET /v1/dashboard/events: the page's server-sent
// events. A snapshot first; then each turn and band change the viewer may
// see as it happens, the status when it changed (at most once a second),
// karma's counts when they changed, and a keep-alive comment when quiet.
// A page that falls behind gets a new snapshot. The stream ends when the
// client goes, the daemon stops, or the token it opened with no longer
// holds.
func (srv dashRoutes) handleEvents(w http.ResponseWriter, r *http.Request) {
	who, err := srv.actor(r, r.URL.Query().Get("sigil"))
	if err != nil {
		writeError(w, err)
		return
	}
	if srv.cfg.Feed == nil {
		writeError(w, ctxd.Errorf(ctxd.KindUnavailable, "this daemon keeps no dashboard feed"))
		return
	}
	release, err := srv.dashboards.take(who.Name)
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	p := &dashPage{srv: srv, w: w, rc: http.NewResponseController(w), r: r, who: who, admin: sigils.Allows(who, sigils.ScopeAdmin)}
	sub := srv.cfg.Feed.Subscribe()
	defer sub.Close()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if err := p.snapshot(); err != nil {
		return
	}
	tick := time.NewTicker(dashTick)
	defer tick.Stop()
	karmaDue := false
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case <-srv.stopping:
			return
		case <-sub.Behind():
			sub.Drain()
			err = p.snapshot()
		case e := <-sub.Events():
			switch {
			case e.Turn != nil && p.visible(e.Turn.Sigil):
				err = p.send("turn", e.Turn)
				karmaDue = true
			case e.Band != nil:
				err = p.send("band", e.Band)
			}
		case now := <-tick.C:
			var changed bool
			if changed, err = p.reresolve(); err != nil {
				_ = p.send("refused", errorEvent(err)) // not "error": EventSource names its own failures so
				return
			}
			if changed {
				err = p.snapshot()
				break
			}
			err = p.status(now)
			if err == nil && karmaDue && now.Sub(p.karmaAt) >= karmaEvery {
				karmaDue = false
				err = p.karmaCounts(true)
			}
			if err == nil && now.Sub(p.sent) >= pingEvery {
				err = p.write([]byte(": ping\n\n"))
			}
		}
		if err != nil {
			return // the client went, or stopped reading
		}
	}
}

// visible says whether the viewer may see sigil's sessions: its own, or
// every one for an admin (as status shows them).
func (p *dashPage) visible(sigil string) bool { return p.admin || sigil == p.who.Name }

// reresolve resolves the page's sigil again, as every request does: a
// reload may have revoked its token or its sigil, or changed its scopes,
// and a dashboard token expires. changed: what the page may see changed,
// so it starts again from a snapshot.
func (p *dashPage) reresolve() (changed bool, err error) {
	who, err := p.srv.actor(p.r, p.r.URL.Query().Get("sigil"))
	if err != nil {
		return false, err
	}
	changed = !slices.Equal(who.Scopes, p.who.Scopes)
	p.who, p.admin = who, sigils.Allows(who, sigils.ScopeAdmin)
	return changed, nil
}

// snapshot sends everything the page shows.
func (p *dashPage) snapshot() error {
	now := time.Now()
	st := p.srv.statusFor(p.r.Context(), p.who)
	if err := p.karmaCounts(false); err != nil {
		return err
	}
	snap := DashboardSnapshot{
		Viewer: DashboardViewer{Sigil: p.who.Name, Admin: p.admin}, Version: p.srv.cfg.Version, BucketS: dashboard.BucketSeconds,
		Status: st, Turns: p.srv.cfg.Feed.Turns(p.visible, dashTurns), Bands: p.srv.cfg.Feed.Bands(),
		Series: p.srv.cfg.Feed.Series(p.visible, now), Karma: p.karma,
	}
	p.last, p.statusAt = statusKey(st), now
	return p.send("snapshot", snap)
}

// status sends the status when it changed since the last one sent, or
// hardwareEvery after it (the hardware reading, which changes at every
// probe, does not count as a change).
func (p *dashPage) status(now time.Time) error {
	st := p.srv.statusFor(p.r.Context(), p.who)
	key := statusKey(st)
	if bytes.Equal(key, p.last) && now.Sub(p.statusAt) < hardwareEvery {
		return nil
	}
	b, err := json.Marshal(st)
	if err != nil {
		return nil
	}
	p.last, p.statusAt = key, now
	return p.event("status", b)
}

// statusKey is what tells one status from another: all of it but the
// hardware reading.
func statusKey(st Status) []byte {
	st.Hardware = nil
	b, _ := json.Marshal(st)
	return b
}

// karmaCounts counts the viewer's latest traces; send: tell the page when
// they changed.
func (p *dashPage) karmaCounts(send bool) error {
	p.karmaAt = time.Now()
	store := p.srv.cfg.Karma
	if store == nil || !sigils.Allows(p.who, sigils.ScopeKarmaRead) && !p.admin {
		return nil
	}
	f := ctxd.TraceFilter{Sigil: p.who.Name, Limit: 1000}
	if p.admin {
		f.Sigil = ""
	}
	list, err := store.Traces(p.r.Context(), f)
	if err != nil {
		p.srv.log.WarnContext(p.r.Context(), "dashboard: karma counts", "err", err)
		return nil // the page keeps the counts it has
	}
	version, files := karmaRoutes(p.srv).currentCode()
	k := &DashboardKarma{Traces: len(list)}
	for _, t := range list {
		switch t.Status {
		case ctxd.TraceRecorded:
			k.Recorded++
		case ctxd.TraceVerified:
			k.Verified++
		case ctxd.TraceRejected:
			k.Rejected++
		}
		if t.Pinned {
			k.Pinned++
		}
		if version != "" && (t.Status == ctxd.TraceVerified || t.Pinned) && karma.Stale(t, version, files) != "" {
			k.Stale++
		}
	}
	changed := p.karma == nil || *p.karma != *k
	p.karma = k
	if send && changed {
		return p.send("karma", k)
	}
	return nil
}

// send writes one event of v's JSON.
func (p *dashPage) send(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("dashboard %s event: %w", name, err)
	}
	return p.event(name, b)
}

// event writes one event whose data is b (JSON: one line).
func (p *dashPage) event(name string, b []byte) error {
	buf := make([]byte, 0, len(b)+len(name)+16)
	buf = append(buf, "event: "...)
	buf = append(buf, name...)
	buf = append(buf, "\ndata: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	return p.write(buf)
}

// write sends b and flushes it, within daemon.write_timeout: a page that
// stops reading is treated as gone.
func (p *dashPage) write(b []byte) error {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.srv.cfg.Daemon.WriteTimeout.Duration))
	defer func() { _ = p.rc.SetWriteDeadline(time.Time{}) }() // none between events, nor for the connection's next request
	if _, err := p.w.Write(b); err != nil {
		return err
	}
	p.sent = time.Now()
	return p.rc.Flush()
}

// dashboardHandler serves daemon.dashboard_listen: the dashboard alone,
// every request with a token (a sigil's, or one from POST
// /v1/dashboard/token), and the health check.
func (srv *Server) dashboardHandler() http.Handler {
	mux := http.NewServeMux()
	dashRoutes{srv}.register(mux, false)
	mux.HandleFunc("GET /v1/health", daemonRoutes{srv}.handleHealth)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, ctxd.Errorf(ctxd.KindUnknownRoute, "%s %s: this listener (daemon.dashboard_listen) serves the dashboard only: GET /t/TOKEN/dashboard/ (`ctxd dashboard` prints the address)", r.Method, r.URL.Path))
	})
	return srv.instrument(srv.track(srv.authenticate(srv.recoverer(patterns(mux)), true)))
}

// DashboardAddr is the dashboard listener's address ("" when there is
// none).
func (srv *Server) DashboardAddr() string {
	if a := srv.dashAddr.Load(); a != nil {
		return *a
	}
	return ""
}
