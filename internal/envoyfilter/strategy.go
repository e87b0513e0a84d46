package envoyfilter

import (
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// limiter decides one request at a time under its Filter's lock.
type limiter interface {
	allow(now time.Time) bool
}

// blanket is ALLOW_ALL or DENY_ALL.
type blanket bool

func (b blanket) allow(time.Time) bool { return bool(b) }

// fixedWindow applies requests_per_time_unit: at most n requests in each
// window of one unit, windows aligned to the unit (a second starts on the
// second). Envoy's filter logs "RequestsPerTimeUnit rate limit strategies is
// not yet supported in RLQS" and leaves the bucket as it was; the harness
// applies the assignment as its proto comment describes instead, so that a
// server handing it out can be tested.
type fixedWindow struct {
	n     uint64
	unit  time.Duration
	start time.Time
	used  uint64
}

func (w *fixedWindow) allow(now time.Time) bool {
	start := now.Truncate(w.unit)
	if !start.Equal(w.start) {
		w.start, w.used = start, 0
	}
	if w.used >= w.n {
		return false
	}
	w.used++
	return true
}

// tokenBucket imitates Envoy's TokenBucketImpl as the filter builds it from an
// assignment: it starts full with max_tokens, refills continuously at
// tokens_per_fill per fill_interval up to max_tokens, and a request takes one
// whole token. (Envoy converts fill_interval to whole seconds before dividing;
// the model keeps the exact interval, so sub-second intervals work.)
type tokenBucket struct {
	max    float64
	perSec float64
	tokens float64
	last   time.Time
}

func newTokenBucket(tb *typev3.TokenBucket, now time.Time) *tokenBucket {
	perFill := uint32(1) // the proto's default
	if tb.GetTokensPerFill() != nil {
		perFill = tb.GetTokensPerFill().GetValue()
	}
	b := &tokenBucket{max: float64(tb.GetMaxTokens()), tokens: float64(tb.GetMaxTokens()), last: now}
	if iv := tb.GetFillInterval().AsDuration(); iv > 0 {
		b.perSec = float64(perFill) / iv.Seconds()
	}
	return b
}

func (b *tokenBucket) allow(now time.Time) bool {
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = min(b.max, b.tokens+dt.Seconds()*b.perSec)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

var units = map[typev3.RateLimitUnit]time.Duration{
	typev3.RateLimitUnit_SECOND: time.Second,
	typev3.RateLimitUnit_MINUTE: time.Minute,
	typev3.RateLimitUnit_HOUR:   time.Hour,
	typev3.RateLimitUnit_DAY:    24 * time.Hour,
	typev3.RateLimitUnit_MONTH:  30 * 24 * time.Hour,
	typev3.RateLimitUnit_YEAR:   365 * 24 * time.Hour,
}

// newLimiter builds the local limiter for a strategy. A nil strategy allows
// all: the proto says an assignment without rate_limit_strategy allows all, and
// no_assignment_behavior unset defaults to allow all.
func newLimiter(s *typev3.RateLimitStrategy, now time.Time) limiter {
	switch st := s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return blanket(st.BlanketRule == typev3.RateLimitStrategy_ALLOW_ALL)
	case *typev3.RateLimitStrategy_RequestsPerTimeUnit_:
		unit, ok := units[st.RequestsPerTimeUnit.GetTimeUnit()]
		if !ok {
			return blanket(true)
		}
		return &fixedWindow{n: st.RequestsPerTimeUnit.GetRequestsPerTimeUnit(), unit: unit}
	case *typev3.RateLimitStrategy_TokenBucket:
		return newTokenBucket(st.TokenBucket, now)
	}
	return blanket(true)
}
