package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
)

// Costs known after the response: a route with cost_from, count_only or refund_on is settled
// at the request's end (requestEnd.fire calls decision.Finish), by both proxy engines. Forward-auth
// never sees the response (the configuration refuses such routes beside forward_auth; without
// that section, a forward-auth sub-request on one charges the estimate and never settles it),
// and Envoy's rate limit service decides descriptors, not routes.

func newSettlements(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_settlements_total",
		Help: "Requests of routes with cost_from, count_only or refund_on, once their response was known, by client and outcome: settled (the real cost charged, or refunded), kept (the estimate was the cost), garbled (cost_from's header missing or not an integer: the estimate stands), failed (the store could not settle: the estimate stands)."},
		[]string{"client", "outcome"})
	reg.MustRegister(c)
	return c
}

// Settled counts a settlement (decision.SettleObserver).
func (o observer) Settled(req *decision.Request, outcome decision.SettleOutcome) {
	o.g.metrics.settlements.WithLabelValues(req.Client, outcome.String()).Inc()
}

// The store wrappers pass settlements on (sluice.SettleDecision looks through them).
func (w *watchedStore) Unwrap() sluice.Store { return w.Store }
func (t tracedStore) Unwrap() sluice.Store   { return t.Store }

// Charged counts usage charged past a decision (decision.UsageObserver).
func (o observer) Charged(req *decision.Request, i int, n int64) {
	o.g.metrics.usage.WithLabelValues(req.Client, req.Limits[i].PolicyName).Add(float64(n))
}
