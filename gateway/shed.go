package gateway

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/answer"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/shed"
)

// Throttling by load (config load_shedding; package shed): after the quotas let a request
// through (a refused request never takes a slot), it takes a slot of the instance's adaptive
// limit on the requests in flight to the upstream, or is answered 503 temporary-reduced-capacity,
// the lower priorities first. The slot is given back at the request's end (requestEnd: its
// response written whole, a streamed one included, or the client or the upstream gone), and the
// upstream's time to its header is the limit's measure.

// shedder is a Gateway's load shedding: the instance's limiter and the configuration's
// priorities.
type shedder struct {
	lim *shed.Limiter
	cfg *config.LoadShedding
	m   *shedMetrics
}

// shedMetrics count what load shedding did, across reloads; they keep the last limiter, so that
// a reload that keeps load_shedding's settings keeps its limit and the requests in flight.
type shedMetrics struct {
	shed *prometheus.CounterVec // priority

	mu   sync.Mutex
	last *shed.Limiter
}

func newShedMetrics(reg prometheus.Registerer) *shedMetrics {
	m := &shedMetrics{shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_load_shed_total",
		Help: "Requests the quotas let through that load shedding answered 503 (temporary-reduced-capacity) because the requests in flight to the upstream were at what their priority may fill, by priority: low, normal, high."},
		[]string{"priority"})}
	for p := range shed.Priorities {
		m.shed.WithLabelValues(p.String())
	}
	reg.MustRegister(m.shed)
	return m
}

// limiter returns the limiter for p: the last one if it has the same settings, else a new one.
func (m *shedMetrics) limiter(p shed.Params) *shed.Limiter {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil || m.last.Params() != p {
		m.last = shed.New(p)
	}
	return m.last
}

// newShedder returns the Gateway's load shedding for cfg; nil without load_shedding.
func newShedder(cfg *config.Config, metrics *Metrics) *shedder {
	ls := cfg.LoadShedding
	if ls == nil || cfg.Upstream == nil {
		return nil
	}
	return &shedder{lim: metrics.shedding.limiter(ls.Params), cfg: ls, m: metrics.shedding}
}

// admit takes a slot for req, or counts it shed and returns the answer to send.
func (s *shedder) admit(req *decision.Request) (answer.Problem, bool) {
	p := s.cfg.Priority(req.Client, req.Route)
	if s.lim.Acquire(p, time.Now()) {
		return answer.Problem{}, true
	}
	s.m.shed.WithLabelValues(p.String()).Inc()
	return answer.ReducedCapacity(req.Who.Client, s.cfg.RetryAfter), false
}

// release gives the slot back; took is how long the upstream took to answer (0: it did not).
func (s *shedder) release(took time.Duration) { s.lim.Release(took, took > 0, time.Now()) }

// admitShed is load shedding for a request the quotas let through, both engines': it takes a
// slot (given back by the request's end, requestEnd.fire), or refunds what the quotas charged
// (shed, not served: its client did nothing wrong; the refund marks the request settled, so its
// end settles nothing again) and returns the answer to send, in the request's shape.
func (e *requestEnd) admitShed() (answer.Problem, bool) {
	g := e.g
	if g.shed == nil {
		return answer.Problem{}, true
	}
	p, ok := g.shed.admit(&e.req)
	if !ok {
		g.decider.Refund(e.ctx, &e.req, e.verdict())
		return e.shaped(p), false
	}
	e.shed = true
	return answer.Problem{}, true
}

// shedHandler is next (the proxy) behind load shedding, for the net/http engine.
func (g *Gateway) shedHandler(e *requestEnd, next http.Handler) http.Handler {
	if g.shed == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := e.admitShed(); !ok {
			answer.WriteProblem(w, p)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ShedStats is load shedding's state in GET /v1/stats (this instance's).
type ShedStats struct {
	Limit      int               `json:"limit"` // requests in flight the upstream is given now
	InFlight   int               `json:"in_flight"`
	MinLimit   int               `json:"min_limit"`
	MaxLimit   int               `json:"max_limit"`
	BaselineMS float64           `json:"baseline_ms"` // the lowest window mean of the baseline window
	LatencyMS  float64           `json:"latency_ms"`  // the last window's mean
	Shares     map[string]int    `json:"shares"`      // the percentage of the limit each priority may fill
	Admitted   map[string]uint64 `json:"admitted"`    // by priority, since the limiter started
	Shed       map[string]uint64 `json:"shed"`        // by priority, since the limiter started
}

// shedStats returns the Gateway's load shedding state; nil without load_shedding.
func (g *Gateway) shedStats() *ShedStats {
	if g == nil || g.shed == nil {
		return nil
	}
	s := g.shed.lim.State()
	st := &ShedStats{Limit: s.Limit, InFlight: s.InFlight, MinLimit: s.MinLimit, MaxLimit: s.MaxLimit,
		BaselineMS: ms(s.Baseline), LatencyMS: ms(s.Latency),
		Shares: map[string]int{}, Admitted: map[string]uint64{}, Shed: map[string]uint64{}}
	for p := range shed.Priorities {
		st.Shares[p.String()] = shed.Share[p]
		st.Admitted[p.String()] = s.Admitted[p]
		st.Shed[p.String()] = s.Shed[p]
	}
	return st
}

// registerShed registers the gauges of the running configuration's load shedding.
func (s *Server) registerShed() {
	state := func(f func(shed.State) float64) func() float64 {
		return func() float64 {
			g := s.current.Load()
			if g == nil || g.shed == nil {
				return 0
			}
			return f(g.shed.lim.State())
		}
	}
	s.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_load_shedding_limit",
			Help: "Load shedding's limit on the requests in flight to the upstream, this instance's (0 without load_shedding)."},
			state(func(st shed.State) float64 { return float64(st.Limit) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_load_shedding_in_flight",
			Help: "Requests in flight to the upstream under load shedding, this instance's."},
			state(func(st shed.State) float64 { return float64(st.InFlight) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_load_shedding_baseline_seconds",
			Help: "Load shedding's latency baseline: the lowest window mean of the upstream's time to answer over baseline_window."},
			state(func(st shed.State) float64 { return st.Baseline.Seconds() })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_load_shedding_latency_seconds",
			Help: "The upstream's mean time to answer over load shedding's last window."},
			state(func(st shed.State) float64 { return st.Latency.Seconds() })))
}
