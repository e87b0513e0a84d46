// Package shed is sluice's throttling by load: an adaptive limit on the requests in flight to
// the upstream, per instance, apart from the quotas. It watches the upstream's latency: the mean
// of each window's answers against a baseline (the lowest window mean of the last
// BaselineWindow), and lowers the limit when latency rises beyond the baseline, raising it again
// when latency is back (a gradient, as Netflix's concurrency-limits Gradient2 and Envoy's
// adaptive concurrency filter do). A request of a priority is admitted while the requests in
// flight are fewer than the limit times that priority's share, so the low ones go first.
//
// The Limiter is pure: every call takes the time, so tests drive it on a virtual clock.
package shed

import (
	"math"
	"sync"
	"time"
)

// Priority orders requests for shedding: Low is shed first, High last.
type Priority uint8

const (
	Low Priority = iota
	Normal
	High
	Priorities // how many there are
)

func (p Priority) String() string { return [...]string{"low", "normal", "high"}[p] }

// ParsePriority reads a priority's name.
func ParsePriority(s string) (Priority, bool) {
	for p := range Priorities {
		if p.String() == s {
			return p, true
		}
	}
	return 0, false
}

// Share is the percentage of the limit each priority may fill: a request of priority p is
// admitted only while in flight < max(1, limit × Share[p] / 100).
var Share = [Priorities]int{Low: 50, Normal: 75, High: 100}

// Params are a Limiter's settings (config: load_shedding).
type Params struct {
	MinLimit, MaxLimit int           // the limit's bounds; it starts at MaxLimit
	Window             time.Duration // the limit is recomputed once a window has elapsed and has answers
	BaselineWindow     time.Duration // the baseline is the lowest window mean this far back
	Tolerance          float64       // latency up to Tolerance × baseline + Slack is healthy
	Slack              time.Duration // keeps a baseline of microseconds from reading noise as load
}

// Limiter is one instance's adaptive limit. It is safe for concurrent use.
type Limiter struct {
	p Params

	mu       sync.Mutex
	limit    float64
	inFlight int
	// The current window: its start, the answers' latencies summed, and the most in flight.
	start     time.Time
	sum       time.Duration
	n         int64
	busiest   int
	last      time.Duration // the last closed window's mean (0: none yet)
	baselines []windowMean  // the last BaselineWindow of window means, oldest first
	shed      [Priorities]uint64
	admitted  [Priorities]uint64
}

type windowMean struct {
	end  time.Time
	mean time.Duration
}

// New returns a Limiter for p (its bounds already checked: 1 ≤ MinLimit ≤ MaxLimit), started at
// MaxLimit: a healthy upstream is never limited.
func New(p Params) *Limiter {
	return &Limiter{p: p, limit: float64(p.MaxLimit)}
}

// Params returns the Limiter's settings.
func (l *Limiter) Params() Params { return l.p }

// allowance is how many in flight a request of priority p may find and still be admitted.
func allowance(limit int, p Priority) int { return max(1, limit*Share[p]/100) }

// Acquire admits a request of priority p (it then takes a slot: call Release when its response
// ends), or reports that it is shed.
func (l *Limiter) Acquire(p Priority, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.start.IsZero() {
		l.start = now
	}
	if l.inFlight >= allowance(int(l.limit), p) {
		l.shed[p]++
		return false
	}
	l.inFlight++
	l.busiest = max(l.busiest, l.inFlight)
	l.admitted[p]++
	return true
}

// Release gives back an admitted request's slot. latency is how long the upstream took to answer
// it; answered false (the upstream failed, or the request was not forwarded) leaves it out of the
// measure.
func (l *Limiter) Release(latency time.Duration, answered bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	if !answered {
		return
	}
	l.sum += latency
	l.n++
	if now.Sub(l.start) >= l.p.Window {
		l.update(now)
	}
}

// update closes the window: its mean against the baseline gives the gradient, in [0.5, 1]; below 1
// the limit is multiplied by it, at 1 it grows by its square root if the window used at least half
// of it (an idle upstream says nothing about how much more it could take).
func (l *Limiter) update(now time.Time) {
	mean := l.sum / time.Duration(l.n)
	l.last = mean
	cut := now.Add(-l.p.BaselineWindow)
	i := 0
	for i < len(l.baselines) && !l.baselines[i].end.After(cut) {
		i++
	}
	l.baselines = append(l.baselines[i:], windowMean{now, mean})
	base := mean
	for _, b := range l.baselines {
		base = min(base, b.mean)
	}
	healthy := l.p.Tolerance*float64(base) + float64(l.p.Slack)
	gradient := max(0.5, min(1, healthy/float64(mean)))
	limit := l.limit
	if gradient < 1 {
		limit *= gradient
	} else if 2*l.busiest >= int(l.limit) {
		limit += math.Sqrt(limit)
	}
	l.limit = max(float64(l.p.MinLimit), min(float64(l.p.MaxLimit), limit))
	l.start, l.sum, l.n, l.busiest = now, 0, 0, l.inFlight
}

// State is what a Limiter shows: in the metrics, /v1/stats and the operator page.
type State struct {
	Limit    int                `json:"limit"`
	InFlight int                `json:"in_flight"`
	MinLimit int                `json:"min_limit"`
	MaxLimit int                `json:"max_limit"`
	Baseline time.Duration      `json:"-"`
	Latency  time.Duration      `json:"-"` // the last window's mean
	Shed     [Priorities]uint64 `json:"-"`
	Admitted [Priorities]uint64 `json:"-"`
}

// State returns the Limiter's state now.
func (l *Limiter) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := State{Limit: int(l.limit), InFlight: l.inFlight, MinLimit: l.p.MinLimit, MaxLimit: l.p.MaxLimit,
		Latency: l.last, Shed: l.shed, Admitted: l.admitted}
	for i, b := range l.baselines {
		if i == 0 || b.mean < s.Baseline {
			s.Baseline = b.mean
		}
	}
	return s
}
