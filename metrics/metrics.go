// Package metrics is ctxd's Prometheus instrumentation: what every answer
// measured (time to first token and its parts, tokens evaluated and
// reused, prefix breaks, governor actions), how requests ended, and, read
// at each scrape, the daemon's state (codex mode, memory, slots, queue,
// backend restarts). It owns its registry, so a test or an embedding
// program can run several daemons in one process.
package metrics

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ctxd/ctxd"
)

// Snapshot is the daemon's state at a scrape. Zero values mean unknown
// (or not ready) and are exported as such: a gauge of 0.
type Snapshot struct {
	Ready            bool
	CodexMode        string  // cag, rag or none; "" without a codex
	CodexLoadSeconds float64 // the last codex load's duration
	CodexTokens      int64   // the codex's tokens
	MemorySource     string  // nvml (VRAM) or host
	MemoryTotal      uint64  // bytes of the memory the model runs in
	MemoryFree       uint64
	HostTotal        uint64 // host memory
	HostAvailable    uint64
	BackendRestarts  int
	Slots            int
	SlotsBusy        int
	QueuedForSlot    int
	QueuedForSession int
}

// Metrics holds ctxd's metrics.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	ttft     prometheus.Histogram
	parts    *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	breaks   *prometheus.CounterVec
	actions  *prometheus.CounterVec
	answers  *prometheus.CounterVec
}

// Seconds buckets: a warm answer takes milliseconds, a cold one on a big
// codex minutes.
var buckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New returns the metrics; snap is called once per scrape for the
// state gauges (nil: none).
func New(snap func() Snapshot) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ctxd_requests_total",
		Help: "Requests served, by route (the route's pattern), HTTP status code and outcome (ok, or the error's kind)."},
		[]string{"route", "code", "outcome"})
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ctxd_ttft_seconds",
		Help: "Time to first token from the request's arrival at ctxd (the summary's ttft_ms).", Buckets: buckets})
	m.parts = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ctxd_ttft_part_seconds",
		Help: "The parts of the time to first token (the summary's timing): queue, governor, condense (part of governor), restore, backend, other.", Buckets: buckets},
		[]string{"part"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ctxd_prompt_tokens_total",
		Help: "Prompt tokens the backend read: evaluated, or reused from its cache (the answers', and a stopped request's as far as the backend reported)."}, []string{"kind"})
	m.breaks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ctxd_prefix_breaks_total",
		Help: "Prompts that did not extend their session's previous one, by the first block that changed and the cause."},
		[]string{"block", "cause"})
	m.actions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ctxd_governor_actions_total",
		Help: "What the governor did to make prompts fit, by kind."}, []string{"kind"})
	m.answers = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ctxd_answers_total",
		Help: "Answers given, by codex mode (cag, rag, none)."}, []string{"mode"})
	m.reg.MustRegister(m.requests, m.ttft, m.parts, m.tokens, m.breaks, m.actions, m.answers,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if snap != nil {
		m.reg.MustRegister(&state{snap: snap})
	}
	return m
}

// Handler serves the metrics in Prometheus's text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: nil})
}

// Gatherer is the registry, for tests and for programs that merge it.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Request counts one served request. route is the route's pattern (never
// the raw path: its cardinality is bounded), outcome "ok" or the error's
// kind.
func (m *Metrics) Request(route string, code int, outcome string) {
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(code), outcome).Inc()
}

// Spent records the prompt tokens the backend read for a request that
// ended without an answer, as far as it reported them: they count with
// the answers' (the backend did the work all the same).
func (m *Metrics) Spent(evaluated, reused int) {
	m.tokens.WithLabelValues("evaluated").Add(float64(evaluated))
	m.tokens.WithLabelValues("reused").Add(float64(reused))
}

// Answer records what one answer's summary measured.
func (m *Metrics) Answer(s *ctxd.Summary) {
	if s == nil {
		return
	}
	sec := func(ms float64) float64 { return ms / 1000 }
	m.ttft.Observe(sec(s.TTFTMillis))
	t := s.Timing
	for part, ms := range map[string]float64{"queue": t.QueueWaitMs, "governor": t.GovernorMs, "condense": t.CondenseMs,
		"restore": t.RestoreMs, "backend": t.BackendTTFTMs, "other": t.OtherMs} {
		m.parts.WithLabelValues(part).Observe(sec(ms))
	}
	// The backend's measured reuse where it reports one: the summary's
	// evaluated tokens are measured then too.
	reused := s.CachedTokens
	if s.BackendCachedTokens != nil {
		reused = *s.BackendCachedTokens
	}
	m.tokens.WithLabelValues("evaluated").Add(float64(s.EvaluatedTokens))
	m.tokens.WithLabelValues("reused").Add(float64(reused))
	if b := s.PrefixBreak; b != nil {
		m.breaks.WithLabelValues(b.Block, Cause(b.Reason)).Inc()
	}
	for _, a := range s.Governor {
		m.actions.WithLabelValues(a.Kind).Inc()
	}
	mode := s.Mode
	if mode == "" {
		mode = "none"
	}
	m.answers.WithLabelValues(mode).Inc()
}

// Cause sorts a prefix break's reason into a few causes, so the label's
// values stay bounded: karma_epoch, formatter, volatile, rewritten, or
// changed (a block's own content).
func Cause(reason string) string {
	switch {
	case strings.HasPrefix(reason, "karma epoch"):
		return "karma_epoch"
	case strings.Contains(reason, "text formatter"):
		return "formatter"
	case strings.Contains(reason, "volatile text"):
		return "volatile"
	case strings.Contains(reason, "compacted or rewritten"):
		return "rewritten"
	}
	return "changed"
}

// state exports a Snapshot at each scrape.
type state struct{ snap func() Snapshot }

var (
	descReady     = prometheus.NewDesc("ctxd_ready", "1 once the backend is up and requests are answered.", nil, nil)
	descMode      = prometheus.NewDesc("ctxd_codex_mode", "1 for the codex's current mode (cag: loaded whole; rag: retrieved).", []string{"mode"}, nil)
	descLoad      = prometheus.NewDesc("ctxd_codex_load_seconds", "How long the last codex load took.", nil, nil)
	descCodexTok  = prometheus.NewDesc("ctxd_codex_tokens", "The codex's tokens.", nil, nil)
	descMem       = prometheus.NewDesc("ctxd_model_memory_bytes", "The memory the model runs in (VRAM when NVML reads it, else host memory), total and free.", []string{"source", "state"}, nil)
	descHost      = prometheus.NewDesc("ctxd_host_memory_bytes", "Host memory, total and available.", []string{"state"}, nil)
	descRestarts  = prometheus.NewDesc("ctxd_backend_restarts_total", "How often the managed backend was restarted.", nil, nil)
	descSlots     = prometheus.NewDesc("ctxd_slots", "Backend slots.", nil, nil)
	descSlotsBusy = prometheus.NewDesc("ctxd_slots_busy", "Backend slots serving a request now.", nil, nil)
	descQueued    = prometheus.NewDesc("ctxd_queued_requests", "Requests waiting, for a slot or for their session's earlier request.", []string{"for"}, nil)
)

func (s *state) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descMode, descLoad, descCodexTok, descMem, descHost, descRestarts, descSlots, descSlotsBusy, descQueued} {
		ch <- d
	}
}

func (s *state) Collect(ch chan<- prometheus.Metric) {
	v := s.snap()
	gauge := func(d *prometheus.Desc, x float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, labels...)
	}
	ready := 0.0
	if v.Ready {
		ready = 1
	}
	gauge(descReady, ready)
	for _, mode := range []string{"cag", "rag", "none"} {
		on := 0.0
		if v.CodexMode == mode {
			on = 1
		}
		gauge(descMode, on, mode)
	}
	gauge(descLoad, v.CodexLoadSeconds)
	gauge(descCodexTok, float64(v.CodexTokens))
	if v.MemorySource != "" {
		gauge(descMem, float64(v.MemoryTotal), v.MemorySource, "total")
		gauge(descMem, float64(v.MemoryFree), v.MemorySource, "free")
	}
	gauge(descHost, float64(v.HostTotal), "total")
	gauge(descHost, float64(v.HostAvailable), "available")
	ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(v.BackendRestarts))
	gauge(descSlots, float64(v.Slots))
	gauge(descSlotsBusy, float64(v.SlotsBusy))
	gauge(descQueued, float64(v.QueuedForSlot), "slot")
	gauge(descQueued, float64(v.QueuedForSession), "session")
}
