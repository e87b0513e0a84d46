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
		Help: "Requests of routes with cost_from, count_only or refund_on, once their response was known, by client and outcome: settled (the real cost charged, or refunded, or pending until the store takes it: sluice_settlements_pending), kept (the estimate was the cost), garbled (cost_from's header missing or not an integer: the estimate stands), failed (the settlement could not be made nor retried: the estimate stands)."},
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

// registerSettlements registers the Server's settlements' figures: those pending (the store could
// not confirm them when asked; retried until they land) and those lost, by reason.
func (s *Server) registerSettlements() {
	st := s.settlements
	s.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_settlements_pending",
		Help: "Settlements and usage charges the store could not confirm when asked, retried in the background until they land (each applied once)."},
		func() float64 { return float64(st.Stats().Pending) }))
	for _, r := range []struct {
		reason string
		n      func(sluice.SettlementStats) uint64
	}{
		{"deadline", func(x sluice.SettlementStats) uint64 { return x.LostDeadline }},
		{"full", func(x sluice.SettlementStats) uint64 { return x.LostFull }},
		{"shutdown", func(x sluice.SettlementStats) uint64 { return x.LostShutdown }},
		{"refused", func(x sluice.SettlementStats) uint64 { return x.LostRefused }},
	} {
		s.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_settlements_lost_total",
			Help:        "Settlements and usage charges given up, their estimate standing, by reason: deadline (not landed within store.settle_retry_for of the first attempt), full (65,536 pending already), shutdown (still pending when the drain ended), refused (a retry failed for good).",
			ConstLabels: prometheus.Labels{"reason": r.reason}},
			func() float64 { return float64(r.n(st.Stats())) }))
	}
}
