package algorithm

import (
	"fmt"
	"strconv"
	"time"
)

// State is the stored state of one key under one policy. Its zero value means "never seen", and
// so does a state written by another algorithm (a policy whose algorithm changed starts afresh).
// Which fields mean what depends on Alg:
//
//	fixed-window    Window = index of the window (floor(now/period)), Count = cost approved in it
//	sliding-window  Window = index of the current window, Count = its cost, Prev = the previous window's
//	sliding-log     Log = approved (time, cost), oldest first, times non-decreasing; Count = Σ Log costs
//	token-bucket    TAT + Frac/Limit = the theoretical arrival time (GCRA), in µs: the bucket is full
//	leaky-bucket    at and after it; for the leaky bucket, the time the queue has drained.
//	                0 ≤ Frac < Limit always.
type State struct {
	Alg    Algorithm
	Window int64
	Count  int64
	Prev   int64
	TAT    int64
	Frac   int64
	Log    []LogEntry
}

// LogEntry is one approved request of a sliding log: it counts while now - period < At.
type LogEntry struct {
	At   int64 // µs
	Cost int64
}

// Decide decides a request of cost at now (µs) on the key whose state is *s, under the validated
// policy p. It changes *s only when it approves a positive cost; a refusal, a peek (cost 0) or an
// error leaves *s exactly as it was.
//
// Time never runs backward for a key: a now earlier than the key's last recorded instant is
// treated as that instant (a conservative choice: a clock step back never frees quota).
// RetryAfter and ResetAfter stay relative to the now given.
//
// A cost that can never be approved returns Allowed false, RetryAfter Never and an error wrapping
// ErrCostExceedsLimit; a negative cost returns an error wrapping ErrInvalidCost.
func Decide(p *Policy, s *State, now, cost int64) (Decision, error) {
	if cost < 0 {
		return Decision{Limit: p.Capacity(), RetryAfter: Never}, fmt.Errorf("%w: cost %d must be ≥ 0", ErrInvalidCost, cost)
	}
	if p.Limit <= 0 || p.Limit > MaxLimit || p.Period < MinPeriod || p.Burst < 0 || p.Burst > MaxLimit {
		return Decision{RetryAfter: Never}, p.Validate() // never divide by a bad policy's zero
	}
	switch p.Algorithm {
	case FixedWindow:
		return fixedWindow(p, s, now, cost)
	case SlidingLog:
		return slidingLog(p, s, now, cost)
	case SlidingWindow:
		return slidingWindow(p, s, now, cost)
	case TokenBucket:
		return tokenBucket(p, s, now, cost)
	case LeakyBucket:
		return leakyBucket(p, s, now, cost)
	}
	return Decision{RetryAfter: Never}, p.Validate()
}

// IsIdle reports whether s is as if never seen at now under p: a store may then drop the key.
func IsIdle(p *Policy, s *State, now int64) bool {
	d, err := Decide(p, s, now, 0)
	return err == nil && d.ResetAfter == 0
}

func never(p *Policy, cost int64, why string) (Decision, error) {
	name := ""
	if p.Name != "" {
		name = fmt.Sprintf(" of policy %q", p.Name)
	}
	return Decision{Limit: p.Capacity(), RetryAfter: Never},
		fmt.Errorf("%w: cost %d %s%s, so it can never be approved", ErrCostExceedsLimit, cost, why, name)
}

// micros converts µs to a Duration, saturating instead of overflowing.
func micros(us int64) time.Duration {
	const max = maxInt64 / int64(time.Microsecond)
	if us > max {
		return time.Duration(maxInt64)
	}
	return time.Duration(us) * time.Microsecond
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
