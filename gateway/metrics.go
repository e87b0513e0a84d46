package gateway

import (
	"cmp"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/buildinfo"
)

// Metrics are what operators see, per configured client and policy. Labels stay bounded: every
// client that is not configured is "anonymous" (never an address or a key), and policies are the
// configured ones.
type Metrics struct {
	decisions      *prometheus.CounterVec // client, policy, result
	earlyRetries   *prometheus.CounterVec // client
	abandoned      *prometheus.CounterVec // client
	latency        prometheus.Histogram
	failures       *prometheus.CounterVec // kind: requests the store call did not decide, by why
	upstreamErrors prometheus.Counter
	reloads        *prometheus.CounterVec   // result
	lastReload     prometheus.Gauge         // unix seconds of the last reload tried
	lastReloadOK   prometheus.Gauge         // 1 if it took, 0 if the old configuration kept running
	holds          prometheus.Histogram     // leaky-bucket holds of admitted requests
	upstream       *prometheus.HistogramVec // class: the upstream's answers by status class, and their time
	settlements    *prometheus.CounterVec   // client, outcome: costs settled after the response (settle.go)
	usage          *prometheus.CounterVec   // client, policy: usage charged past decisions (Envoy's hits_addend)
	shedding       *shedMetrics             // load shedding (shed.go)
	llm            *llmMetrics              // usage routes' tokens and money (llmstats.go)
	bodies         *bodyMemory              // usage routes' request bodies held at once (bodymem.go)

	// byPolicy caches decisions' counters per client and policy label: looking them up in the
	// CounterVec hashes the labels and takes a lock on every request.
	byPolicy cowMap[[2]string, *resultCounters]

	activity  *activity        // per client, for the operator page
	needs     *needs           // per client and policy, what it uses of its limits (needs.go)
	now       func() time.Time // when decisions are recorded (time.Now; a test's virtual clock)
	diag      *diagnosis       // the operator page's diagnosis (diagnosis.go)
	fallbacks atomic.Uint64    // decisions made by a failure mode (fail-open, local), not the store
	// unavailable counts requests answered 503 because the store could not decide
	// (StoreStats.Unavailable; sluice_undecided_total has them by kind).
	unavailable atomic.Uint64
	storeErrors func() uint64 // the store calls that failed (countStoreErrors)
	malformed   *rateLog      // requests that could not be read; nil: not logged
	// upstreamLog: the upstream's failures (no answer, an answer cut short); nil: not logged
	upstreamLog *rateLog
}

// abandon counts a held request whose client left.
func (m *Metrics) abandon(client string) {
	m.abandoned.WithLabelValues(client).Inc()
	m.activity.client(client).abandoned.Add(1)
}

// Results of a decision, as the result label says them.
const (
	resultAllowed = iota
	resultRefused
	resultDelayed
	resultDryRunRefused
	resultFallbackOpen
	resultFallbackLocal
	resultNotConsumed
	numResults
)

var resultNames = [numResults]string{"allowed", "refused", "delayed", "dry_run_refused", "fallback_open", "fallback_local", "not_consumed"}

// resultCounters are one client's decision counters for one policy, by result; created on first use.
type resultCounters struct {
	vec    *prometheus.CounterVec
	labels [2]string
	c      [numResults]atomic.Pointer[prometheus.Counter]
}

// counters returns the decision counters of client and policy.
func (m *Metrics) counters(client, policy string) *resultCounters {
	key := [2]string{client, policy}
	return m.byPolicy.get(key, func() *resultCounters { return &resultCounters{vec: m.decisions, labels: key} })
}

// NewMetrics registers the gateway's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_decisions_total",
			Help: "Decisions by client, policy and result: allowed, refused, delayed (allowed, held by a leaky bucket), dry_run_refused (would have been refused), fallback_open, fallback_local, not_consumed (would have allowed, but another policy refused the request, so nothing was consumed)."},
			[]string{"client", "policy", "result"}),
		earlyRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_early_retries_total",
			Help: "Requests that came back before the Retry-After of their client's last refusal ran out."}, []string{"client"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_abandoned_total",
			Help: "Requests whose client disconnected while a leaky bucket held them (not forwarded)."}, []string{"client"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_decision_seconds",
			Help: "The store call of each decided request (one atomic call for all its policies: the Redis round trip, or the memory store's lock), in seconds.", Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1}}),
		upstreamErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_upstream_errors_total",
			Help: "Allowed requests the upstream did not answer (502/504)."}),
		usage: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_usage_charged_total",
			Help: "Usage charged after the fact, by client and policy: the hits of Envoy descriptors with a hits_addend of their own (a rate limit cost, a token quota) that their decision did not consume, counted even past the limit."},
			[]string{"client", "policy"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_config_reloads_total",
			Help: "Configuration reloads by result: ok, or failed (the old configuration keeps running)."}, []string{"result"}),
	}
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_undecided_total",
		Help: "Requests whose store call decided nothing, by kind: unavailable (the store failed and the failure mode refused: 503), invalid_cost and cost_exceeds_limit (400), other (500)."},
		[]string{"kind"})
	m.lastReload = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_config_last_reload_timestamp_seconds",
		Help: "When the configuration was last reloaded (or a reload was tried), in Unix seconds; 0 before the first."})
	m.lastReloadOK = prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_config_last_reload_successful",
		Help: "1 if the last reload took (or none was tried), 0 if it failed and the previous configuration keeps running."})
	m.lastReloadOK.Set(1)
	m.holds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_hold_seconds",
		Help: "How long leaky-bucket policies held the requests they admitted with a delay.", Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}})
	m.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "sluice_upstream_seconds",
		Help:    "The upstream's answers to forwarded requests, by status class (1xx..5xx), and how long each took to its header.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"class"})
	m.activity = newActivity()
	m.needs = newNeeds()
	m.now = time.Now
	m.diag = newDiagnosis()
	m.settlements = newSettlements(reg)
	m.shedding = newShedMetrics(reg)
	m.llm = newLLMMetrics(reg)
	m.bodies = newBodyMemory(reg)
	reg.MustRegister(m.decisions, m.usage, m.earlyRetries, m.abandoned, m.latency, m.upstreamErrors, m.reloads,
		m.lastReload, m.lastReloadOK, m.holds, m.upstream, m.failures, buildInfo())
	return m
}

// count counts one policy's decision of a request that passed (passed) or was refused. A policy
// that would have allowed a request another policy refused consumed nothing: it is not_consumed,
// not allowed.
func (rc *resultCounters) count(d sluice.Decision, dry, passed bool) {
	result := resultAllowed
	switch {
	case d.Allowed && !passed:
		result = resultNotConsumed
	case d.Fallback == sluice.FallbackOpen:
		result = resultFallbackOpen
	case d.Fallback == sluice.FallbackLocal && d.Allowed:
		result = resultFallbackLocal
	case !d.Allowed && dry:
		result = resultDryRunRefused
	case !d.Allowed:
		result = resultRefused
	case d.Delay > 0:
		result = resultDelayed
	}
	c := rc.c[result].Load()
	if c == nil {
		counter := rc.vec.WithLabelValues(rc.labels[0], rc.labels[1], resultNames[result])
		rc.c[result].CompareAndSwap(nil, &counter)
		c = &counter
	}
	(*c).Inc()
}

// statusClasses are the upstream metric's class labels, by status / 100.
var statusClasses = [...]string{"", "1xx", "2xx", "3xx", "4xx", "5xx"}

// upstreamAnswered counts an upstream's answer of status after took.
func (m *Metrics) upstreamAnswered(status int, took time.Duration) {
	if c := status / 100; c >= 1 && c <= 5 {
		m.upstream.WithLabelValues(statusClasses[c]).Observe(took.Seconds())
	}
}

// buildInfo is sluice_build_info: 1, labelled with the build's version, VCS commit and time (as
// `sluice --version` says them: package buildinfo; "unknown" when the build recorded none), and
// Go version.
func buildInfo() prometheus.Collector {
	b := buildinfo.Read()
	version, commit, when := b.Version, cmp.Or(b.CommitLabel(), "unknown"), cmp.Or(b.Date, "unknown")
	goVersion := runtime.Version()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_build_info",
		Help:        "Always 1: the build's version, VCS commit and time, and Go version, as labels.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "commit_time": when, "goversion": goVersion}})
	g.Set(1)
	return g
}

// countStoreErrors registers sluice_store_errors_total: the calls to st that failed, as its guard
// counts them (sluice.StoreErrors: every call the breaker counts as a failure, and every slow one
// it does not — sluice.ErrStoreSlow —, whatever the failure mode then answered: a 503, a fail-open
// approval, a local decision); a store that is not guarded (memory) fails none.
func (m *Metrics) countStoreErrors(reg prometheus.Registerer, st sluice.Store) {
	m.storeErrors = func() uint64 { return 0 }
	if c, ok := st.(sluice.StoreErrors); ok {
		m.storeErrors = c.StoreErrors
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_store_errors_total",
		Help: "Calls to the store that failed (a timeout, a lost connection, Redis not connected), whatever the failure mode then answered: 503, fail-open or local. Calls the open breaker keeps off the store are not made, so not counted."},
		func() float64 { return float64(m.storeErrors()) }))
}
