package gateway

import (
	"sort"
	"sync/atomic"
	"time"
)

// activity is what the operator page shows of each client: requests by outcome, as totals and as
// rates over the last seconds, early retries, abandoned holds, and when it was last refused. It is
// kept per client label (configured names and "anonymous"), so it is as bounded as the metrics.
type activity struct {
	clients cowMap[string, *clientActivity]
	started time.Time
}

// Request outcomes, as the operator page counts them: one per request, whatever its policies.
const (
	outcomeAllowed = iota
	outcomeRefused
	outcomeDelayed
	numOutcomes
)

// rateWindow is the number of seconds the rates are kept for (the ring), rateSpan how many whole
// seconds before the current one a rate averages.
const (
	rateWindow = 64
	rateSpan   = 10
)

type clientActivity struct {
	totals     [numOutcomes]atomic.Uint64
	early      atomic.Uint64
	abandoned  atomic.Uint64
	lastRefuse atomic.Int64 // unix µs of the last refusal; 0 if none
	retryUntil atomic.Int64 // unix µs until which its last refusal said to wait
	ring       [rateWindow]second
	models     cowMap[string, *modelUsage] // LLM usage per model label (llmstats.go)
}

// second counts one second's outcomes; sec says which second the counts belong to.
type second struct {
	sec    atomic.Int64
	counts [numOutcomes]atomic.Uint64
}

func newActivity() *activity { return &activity{started: time.Now()} }

func (a *activity) client(name string) *clientActivity {
	return a.clients.get(name, func() *clientActivity { return &clientActivity{} })
}

// record counts one request of client with outcome at now; retryAt is when a refusal said to retry.
func (a *activity) record(client string, outcome int, now, retryAt time.Time) {
	c := a.client(client)
	c.totals[outcome].Add(1)
	sec := now.Unix()
	s := &c.ring[sec%rateWindow]
	if old := s.sec.Load(); old != sec && s.sec.CompareAndSwap(old, sec) {
		// A second come round again: the slot's counts are a lap old. (A request of the old
		// second counted between the swap and the reset is lost; rates are a view, not a tally.)
		for i := range s.counts {
			s.counts[i].Store(0)
		}
	}
	s.counts[outcome].Add(1)
	if outcome == outcomeRefused {
		c.lastRefuse.Store(now.UnixMicro())
		c.retryUntil.Store(retryAt.UnixMicro())
	}
}

// ClientStats is one client on the operator page (GET /v1/stats).
type ClientStats struct {
	Client string `json:"client"` // a configured client's name, or "anonymous" (every other client)
	// Totals since the start.
	Allowed      uint64 `json:"allowed"`
	Refused      uint64 `json:"refused"`
	Delayed      uint64 `json:"delayed"` // allowed after a leaky-bucket hold (not in Allowed)
	EarlyRetries uint64 `json:"early_retries"`
	Abandoned    uint64 `json:"abandoned"`
	// Per second, over the last RateSeconds whole seconds.
	AllowedRate float64 `json:"allowed_per_s"`
	RefusedRate float64 `json:"refused_per_s"`
	DelayedRate float64 `json:"delayed_per_s"`
	// Limited says the client is being limited now: refused within the last RateSeconds, or
	// still inside the Retry-After of its last refusal.
	Limited        bool       `json:"limited"`
	LastRefused    *time.Time `json:"last_refused,omitempty"`
	RetryAfterEnds *time.Time `json:"retry_after_ends,omitempty"`
	// LLM is its usage of each model on usage routes (none: left out).
	LLM []ModelStats `json:"llm,omitempty"`
}

// snapshot returns every client's stats at now, the limited first, then by name, and the seconds
// the rates average over (fewer than rateSpan while the server is young).
func (a *activity) snapshot(now time.Time) ([]ClientStats, int) {
	span := min(rateSpan, max(1, int64(now.Sub(a.started)/time.Second)))
	m := a.clients.all()
	out := make([]ClientStats, 0, len(m))
	cur := now.Unix()
	for name, c := range m {
		st := ClientStats{Client: name, Allowed: c.totals[outcomeAllowed].Load(), Refused: c.totals[outcomeRefused].Load(),
			Delayed: c.totals[outcomeDelayed].Load(), EarlyRetries: c.early.Load(), Abandoned: c.abandoned.Load(), LLM: c.llmSnapshot()}
		var sums [numOutcomes]uint64
		for sec := cur - span; sec < cur; sec++ {
			s := &c.ring[sec%rateWindow]
			if s.sec.Load() != sec {
				continue
			}
			for i := range sums {
				sums[i] += s.counts[i].Load()
			}
		}
		st.AllowedRate = float64(sums[outcomeAllowed]) / float64(span)
		st.RefusedRate = float64(sums[outcomeRefused]) / float64(span)
		st.DelayedRate = float64(sums[outcomeDelayed]) / float64(span)
		if us := c.lastRefuse.Load(); us != 0 {
			t := time.UnixMicro(us).UTC()
			st.LastRefused = &t
			until := time.UnixMicro(c.retryUntil.Load()).UTC()
			st.RetryAfterEnds = &until
			st.Limited = now.Sub(t) < rateSpan*time.Second || now.Before(until)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Limited != out[j].Limited {
			return out[i].Limited
		}
		return out[i].Client < out[j].Client
	})
	return out, int(span)
}
