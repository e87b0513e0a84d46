// Package algorithm is sluice's pure core: one transition per rate-limiting algorithm,
// (state, now, cost) -> (state', Decision), in integer microseconds, with no clock, no I/O,
// no locks and no allocation (the sliding log aside, whose state is a list).
//
// A store makes a transition atomic (a mutex in memory, a Lua script in Redis) and supplies now;
// the simulator supplies a virtual now. Every driver therefore decides exactly alike.
package algorithm

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names one of the five algorithms. The zero value is no algorithm.
type Algorithm uint8

const (
	FixedWindow   Algorithm = iota + 1 // "fixed-window": a counter per epoch-aligned window
	SlidingLog                         // "sliding-log": every approved request's time, exact
	SlidingWindow                      // "sliding-window": two window counters, the previous one weighted
	TokenBucket                        // "token-bucket": capacity Burst, refilled Limit per Period, continuously
	LeakyBucket                        // "leaky-bucket": a queue drained Limit per Period, room for Burst
	Concurrency                        // "concurrency": at most Limit requests in flight; Period is a slot's lease (concurrency.go)
)

// Algorithms lists the five rate algorithms in a fixed order (the order of `sluice simulate
// --compare`). Concurrency is not among them: it limits requests in flight, not a rate, and is
// decided with a lease (concurrency.go).
var Algorithms = []Algorithm{FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyBucket}

var algorithmNames = [...]string{"", "fixed-window", "sliding-log", "sliding-window", "token-bucket", "leaky-bucket", "concurrency"}

// String returns the algorithm's name as the CLI and the configuration spell it.
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) && a != 0 {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s ("token-bucket", ...).
func ParseAlgorithm(s string) (Algorithm, error) {
	for _, a := range Algorithms {
		if s == a.String() {
			return a, nil
		}
	}
	if s == Concurrency.String() {
		return Concurrency, nil
	}
	return 0, fmt.Errorf("unknown algorithm %q (want one of %s)", s, algorithmList)
}

// algorithmList names every algorithm, for errors.
const algorithmList = "fixed-window, sliding-log, sliding-window, token-bucket, leaky-bucket, concurrency"

// MarshalText and UnmarshalText let configuration formats spell an Algorithm by name.
func (a Algorithm) MarshalText() ([]byte, error) {
	if a == 0 || int(a) >= len(algorithmNames) {
		return nil, fmt.Errorf("invalid algorithm %d", uint8(a))
	}
	return []byte(a.String()), nil
}

func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := ParseAlgorithm(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Bounds of a policy. MaxLimit keeps every count, and every limit·period product's factors,
// within 2^53, so the numbers are also exact as doubles (Lua).
const (
	MaxLimit  = 1 << 53
	MinPeriod = time.Millisecond
)

// Policy is one rate limit: Limit requests (or cost units) per Period under Algorithm.
//
// Burst is the token bucket's capacity (0 means Limit) or the leaky bucket's queue room in
// requests beyond the one being served (0 means no queue: a request is admitted only when the
// previous one has drained). Burst has no meaning for the three window algorithms and must be 0.
type Policy struct {
	Name      string        // names the policy in keys, headers and metrics; may be empty in a library
	Algorithm Algorithm     // which transition decides
	Limit     int64         // 1..MaxLimit
	Period    time.Duration // ≥ 1ms, a whole number of microseconds
	Burst     int64         // 0..MaxLimit; see above

	// Calendar, if set, counts a fixed-window or sliding-window policy by calendar windows
	// (a day, an ISO week, a month, a year) in Location instead of by Period, which must then
	// be 0. Location nil means UTC; it has no meaning without a Calendar.
	Calendar Calendar
	Location *time.Location
}

// ErrInvalidPolicy is wrapped by every error that Validate returns.
var ErrInvalidPolicy = errors.New("invalid policy")

// ErrCostExceedsLimit is wrapped by the error of a request whose cost can never be approved
// (cost above the limit of a window algorithm, above a token bucket's capacity, or a leaky-bucket
// cost whose drain time is beyond any clock). Its Decision has RetryAfter == Never.
var ErrCostExceedsLimit = errors.New("cost exceeds limit")

// ErrInvalidCost is wrapped by the error of a request with a negative cost.
var ErrInvalidCost = errors.New("invalid cost")

// Never is the RetryAfter of a request that can never be approved.
const Never time.Duration = -1

// Validate reports what is wrong with p, naming the field; nil if p can be used.
func (p Policy) Validate() error {
	bad := func(format string, args ...any) error {
		who := "policy"
		if p.Name != "" {
			who = fmt.Sprintf("policy %q", p.Name)
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalidPolicy, who, fmt.Sprintf(format, args...))
	}
	switch {
	case p.Algorithm == 0:
		return bad("algorithm is missing (want one of %s)", algorithmList)
	case int(p.Algorithm) >= len(algorithmNames):
		return bad("unknown algorithm %d", uint8(p.Algorithm))
	case p.Limit <= 0:
		return bad("limit %d must be > 0", p.Limit)
	case p.Limit > MaxLimit:
		return bad("limit %d must be ≤ 2^53 (%d)", p.Limit, int64(MaxLimit))
	case p.Algorithm == Concurrency && p.Limit > MaxConcurrency:
		return bad("limit %d of concurrency must be ≤ %d: each request in flight is kept in the key's state", p.Limit, MaxConcurrency)
	case p.Calendar != NoCalendar:
		if int(p.Calendar) >= len(calendarNames) {
			return bad("unknown calendar %d", uint8(p.Calendar))
		}
		if p.Algorithm != FixedWindow && p.Algorithm != SlidingWindow {
			return bad("calendar %v has no meaning for %v (only fixed-window and sliding-window count by the calendar)", p.Calendar, p.Algorithm)
		}
		if p.Period != 0 {
			return bad("period %v and calendar %v exclude each other: a calendar window's length is the calendar's", p.Period, p.Calendar)
		}
		if p.Burst != 0 {
			return bad("burst %d has no meaning for %v (only token-bucket and leaky-bucket take a burst)", p.Burst, p.Algorithm)
		}
		return nil
	case p.Location != nil:
		return bad("time zone %v has no meaning without a calendar", p.Location)
	case p.Period < MinPeriod:
		return bad("period %v must be ≥ 1ms", p.Period)
	case p.Period%time.Microsecond != 0:
		return bad("period %v must be a whole number of microseconds", p.Period)
	case p.Burst < 0:
		return bad("burst %d must be ≥ 0", p.Burst)
	case p.Burst > MaxLimit:
		return bad("burst %d must be ≤ 2^53 (%d)", p.Burst, int64(MaxLimit))
	case p.Burst != 0 && p.Algorithm != TokenBucket && p.Algorithm != LeakyBucket:
		return bad("burst %d has no meaning for %v (only token-bucket and leaky-bucket take a burst)", p.Burst, p.Algorithm)
	}
	if p.Algorithm == TokenBucket || p.Algorithm == LeakyBucket {
		// The time to refill the bucket (drain the queue) must stay far inside any clock.
		if q, _ := mul(p.Capacity(), p.PeriodMicros()).divmod(p.Limit); q >= 1<<53 {
			return bad("burst %d × period %v / limit %d is over 285 years; lower the burst or the period", p.Capacity(), p.Period, p.Limit)
		}
	}
	return nil
}

// PeriodMicros is the period in microseconds.
func (p *Policy) PeriodMicros() int64 { return int64(p.Period / time.Microsecond) }

// Capacity is the most cost that can ever be approved at one instant with no delay: the limit of
// a window algorithm, the token bucket's capacity, or for the leaky bucket Burst+1 (one request
// served now, Burst queued). It is Decision.Limit.
func (p *Policy) Capacity() int64 {
	switch p.Algorithm {
	case TokenBucket:
		if p.Burst > 0 {
			return p.Burst
		}
		return p.Limit
	case LeakyBucket:
		return p.Burst + 1
	}
	return p.Limit
}

// Decision is the answer to one request.
//
// RetryAfter is exact for the five rate algorithms: absent other traffic on the key, the same request made RetryAfter later is
// approved, and one made a microsecond earlier is not. Every request made before then with the same
// or a larger cost is refused whatever else happens, so a refusal may be cached until then.
// Not so for Concurrency: a slot frees whenever a request in flight ends, so its RetryAfter is a
// hint (see concurrency.go), and no refusal of it may be cached (IsExact).
type Decision struct {
	Allowed    bool
	Limit      int64         // Policy.Capacity
	Remaining  int64         // cost units (requests of cost 1) that could still be approved now, after this decision
	RetryAfter time.Duration // 0 when allowed; when refused, the wait until this request would be approved (a hint for Concurrency); Never if it never can
	ResetAfter time.Duration // until the key's state is as if never seen (full quota); 0 if it already is
	Delay      time.Duration // leaky bucket: how long to hold an approved request before serving it
	Fallback   Fallback      // how a Limiter decided when its store could not; NoFallback from every store
	Source     Source        // where the answer came from: the store's backend, its negative cache, a local budget
	// At is the instant decided at, µs since the epoch on the store's clock (Redis's, for the
	// Redis store): what a settlement of the cost this decision charged takes (Settle). 0 if no
	// store decided (a fail-open fallback).
	At int64
}

// Cached reports whether d is a refusal answered from the store's negative cache, not by its
// backend.
func (d *Decision) Cached() bool { return d.Source == FromCache }

// Source says where a store's answer came from. Only FromStore is an answer of the store's backend
// (for the Redis store, a round trip to Redis): a breaker counts only those as the store's health.
type Source uint8

const (
	FromStore  Source = iota // the store's backend decided (the memory store's map; a Redis round trip)
	FromCache                // a refusal answered from the store's negative cache, without asking Redis
	FromBudget               // spent from this instance's local budget of the store's quota (sluice.BudgetStore)
)

func (s Source) String() string {
	switch s {
	case FromStore:
		return "store"
	case FromCache:
		return "cache"
	case FromBudget:
		return "budget"
	}
	return fmt.Sprintf("Source(%d)", uint8(s))
}

// Fallback says how a decision was made when the store that should have made it could not.
type Fallback uint8

const (
	NoFallback    Fallback = iota // decided by the store
	FallbackOpen                  // the store failed and the limiter fails open: allowed unchecked
	FallbackLocal                 // the store failed and the limiter decided on its local share
)

func (f Fallback) String() string {
	switch f {
	case NoFallback:
		return "none"
	case FallbackOpen:
		return "fail-open"
	case FallbackLocal:
		return "local"
	}
	return fmt.Sprintf("Fallback(%d)", uint8(f))
}
