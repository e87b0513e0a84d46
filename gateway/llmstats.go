package gateway

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/llm"
)

// LLM usage, as operators see it: per client and model, the tokens the responses of usage routes
// reported, their price, what was reserved up front, and how each request was settled; in the
// metrics and in GET /v1/stats (the operator page). A model label is a models entry's name (or
// "other" for the "*" entry's, "unlisted" for a model no entry lists, "none" for a request that
// names none): never a name a client chose, so that labels stay as few as the configuration's.

// llmMetrics are the Prometheus counters of LLM usage.
type llmMetrics struct {
	tokens   *prometheus.CounterVec // client, model, kind (input, cached_input, output)
	reserved *prometheus.CounterVec // client, model
	cost     *prometheus.CounterVec // client, model
	requests *prometheus.CounterVec // client, model, outcome
}

func newLLMMetrics(reg prometheus.Registerer) *llmMetrics {
	m := &llmMetrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_llm_tokens_total",
			Help: "Tokens the responses of usage routes reported, by client, model and kind: input (every prompt token, cached ones included), cached_input (the part read from the provider's cache), output."},
			[]string{"client", "model", "kind"}),
		reserved: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_llm_reserved_tokens_total",
			Help: "Tokens reserved up front by the requests of usage routes that passed (their estimates, input and output), by client and model."},
			[]string{"client", "model"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_llm_cost_microdollars_total",
			Help: "The price of the usage reported, in micro-dollars, by client and model (models with a price only)."},
			[]string{"client", "model"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_llm_requests_total",
			Help: "Requests of usage routes that passed, once their response ended, by client, model and outcome: settled (to the usage the response reported), no_usage (none reported: the estimate stood, or no_usage: refund refunded it), failed (the settlement could be neither made nor queued to be retried: the estimate stands)."},
			[]string{"client", "model", "outcome"}),
	}
	reg.MustRegister(m.tokens, m.reserved, m.cost, m.requests)
	return m
}

// modelLabel is the label of a usage request's model.
func modelLabel(u *decision.Usage) string {
	if u.Label == "" {
		return "none"
	}
	return u.Label
}

// UsageSettled counts a usage route's request once it is settled (decision.LLMObserver).
func (o observer) UsageSettled(req *decision.Request, u llm.Usage, outcome decision.SettleOutcome) {
	m, model := o.g.metrics, modelLabel(req.Usage)
	var cost int64
	if u.Found && req.Usage.Model != nil && req.Usage.Model.Price != nil {
		cost = llm.Cost(u, llm.CountWeighted, req.Usage.Model.Price.Weights())
	}
	m.llm.requests.WithLabelValues(req.Client, model, outcome.String()).Inc()
	m.llm.reserved.WithLabelValues(req.Client, model).Add(float64(req.Usage.Estimate.Total))
	if u.Found {
		m.llm.tokens.WithLabelValues(req.Client, model, "input").Add(float64(u.Input))
		m.llm.tokens.WithLabelValues(req.Client, model, "cached_input").Add(float64(u.CachedInput))
		m.llm.tokens.WithLabelValues(req.Client, model, "output").Add(float64(u.Output))
		if cost > 0 {
			m.llm.cost.WithLabelValues(req.Client, model).Add(float64(cost))
		}
	}
	mu := m.activity.client(req.Client).models.get(model, func() *modelUsage { return &modelUsage{} })
	mu.requests.Add(1)
	mu.reserved.Add(req.Usage.Estimate.Total)
	switch {
	case outcome == decision.SettleFailed:
		mu.failed.Add(1)
	case u.Found:
		mu.settled.Add(1)
		mu.input.Add(u.Input)
		mu.cached.Add(u.CachedInput)
		mu.output.Add(u.Output)
		mu.microUSD.Add(cost)
	default:
		mu.noUsage.Add(1)
	}
}

// modelUsage is one client's usage of one model, for the operator page.
type modelUsage struct {
	requests, settled, noUsage, failed        atomic.Int64
	reserved, input, cached, output, microUSD atomic.Int64
}

// ModelStats is a client's usage of one model on usage routes (GET /v1/stats "llm").
type ModelStats struct {
	Model       string `json:"model"`        // a models entry's name, "other", "unlisted" or "none"
	Requests    int64  `json:"requests"`     // that passed and ended
	Settled     int64  `json:"settled"`      // settled to their reported usage
	NoUsage     int64  `json:"no_usage"`     // ended without a usage: the estimate stood (or was refunded)
	Failed      int64  `json:"failed"`       // the settlement could be neither made nor queued
	Reserved    int64  `json:"reserved"`     // tokens reserved up front
	Input       int64  `json:"input"`        // tokens reported: input, cached ones included
	CachedInput int64  `json:"cached_input"` // the part of Input read from the provider's cache
	Output      int64  `json:"output"`
	MicroUSD    int64  `json:"micro_usd"` // their price, for models with one
}

// llmSnapshot returns the client's usage per model, by model.
func (c *clientActivity) llmSnapshot() []ModelStats {
	m := c.models.all()
	if len(m) == 0 {
		return nil
	}
	out := make([]ModelStats, 0, len(m))
	for name, u := range m {
		out = append(out, ModelStats{Model: name, Requests: u.requests.Load(), Settled: u.settled.Load(), NoUsage: u.noUsage.Load(),
			Failed: u.failed.Load(), Reserved: u.reserved.Load(), Input: u.input.Load(), CachedInput: u.cached.Load(),
			Output: u.output.Load(), MicroUSD: u.microUSD.Load()})
	}
	slices.SortFunc(out, func(a, b ModelStats) int { return strings.Compare(a.Model, b.Model) })
	return out
}
