package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// Metrics are what operators see, per configured client and policy. Labels stay bounded: every
// client that is not configured is "anonymous" (never an address or a key), and policies are the
// configured ones.
type Metrics struct {
	decisions      *prometheus.CounterVec // client, policy, result
	earlyRetries   *prometheus.CounterVec // client
	abandoned      *prometheus.CounterVec // client
	latency        prometheus.Histogram
	storeErrors    prometheus.Counter
	upstreamErrors prometheus.Counter
	reloads        *prometheus.CounterVec // result
}

// NewMetrics registers the gateway's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_decisions_total",
			Help: "Decisions by client, policy and result: allowed, refused, delayed (allowed, held by a leaky bucket), dry_run_refused (would have been refused), fallback_open, fallback_local."},
			[]string{"client", "policy", "result"}),
		earlyRetries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_early_retries_total",
			Help: "Requests that came back before the Retry-After of their client's last refusal ran out."}, []string{"client"}),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_abandoned_total",
			Help: "Requests whose client disconnected while a leaky bucket held them (not forwarded)."}, []string{"client"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sluice_decision_seconds",
			Help: "Time to decide a request's policies (store round trip included).", Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1}}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_store_errors_total",
			Help: "Requests the store could not decide and the failure mode refused (503)."}),
		upstreamErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_upstream_errors_total",
			Help: "Allowed requests the upstream did not answer (502/504)."}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_config_reloads_total",
			Help: "Configuration reloads by result: ok, or failed (the old configuration keeps running)."}, []string{"result"}),
	}
	reg.MustRegister(m.decisions, m.earlyRetries, m.abandoned, m.latency, m.storeErrors, m.upstreamErrors, m.reloads)
	return m
}

func (m *Metrics) count(client, policy string, d sluice.Decision, dry bool) {
	result := "allowed"
	switch {
	case d.Fallback == sluice.FallbackOpen:
		result = "fallback_open"
	case d.Fallback == sluice.FallbackLocal && d.Allowed:
		result = "fallback_local"
	case !d.Allowed && dry:
		result = "dry_run_refused"
	case !d.Allowed:
		result = "refused"
	case d.Delay > 0:
		result = "delayed"
	}
	m.decisions.WithLabelValues(client, policy, result).Inc()
}
