package algorithm

import (
	"fmt"
	"math/bits"
	"strconv"
	"time"
)

// State is the stored state of one key under one policy. Its zero value means "never seen", and
// so does a state written under another algorithm or period: a policy whose algorithm or period a
// reload changed starts its keys afresh rather than misreading them (a window index under a new
// period). A changed limit or burst keeps what was used: a window's counts and a sliding log's
// entries are kept as they are, and a bucket's theoretical arrival time is converted so that the
// units in use are the same under the new limit (adopt).
// Which fields mean what depends on Alg:
//
//	fixed-window    Window = index of the window (floor(now/period)), Count = cost approved in it
//	sliding-window  Window = index of the current window, Count = its cost, Prev = the previous window's
//	  calendar      Window = the calendar window's start (µs), TAT = its end, Frac = the next window's
//	                end (sliding-window only); Period = a negative tag naming the calendar and the
//	                zone (see calendarwindow.go), so a state of another calendar or zone is never seen
//	sliding-log     Log = approved (time, cost), oldest first, times non-decreasing; Count = Σ Log costs
//	token-bucket    TAT + Frac/Limit = the theoretical arrival time (GCRA), in µs: the bucket is full
//	leaky-bucket    at and after it; for the leaky bucket, the time the queue has drained.
//	                0 ≤ Frac < Limit always.
//	concurrency     Log = the slots held, one entry each: At its lease's expiry, Cost its lease's ID
//	                (concurrency.go); a state of another limit or lease still counts them
//
// The fields a decision writes come first, then those it only reads, the sliding log's list last,
// so that a store can keep what a counter or bucket decision writes, with its own per-key
// bookkeeping (the memory store: a lock and an expiry), in one cache line and what it only reads
// in others: from parallel goroutines, a line written moves between the cores' caches, while
// lines only read stay in both.
type State struct {
	Window int64
	Count  int64
	Prev   int64
	TAT    int64
	Frac   int64
	Alg    Algorithm
	Limit  int64 // the policy's limit when written
	Period int64 // the policy's period in µs when written

	cache derived // from Limit and Period, computed when the state was (re)started

	Log []LogEntry
}

// derived holds what a decision would otherwise divide for, computed once per key when its state
// starts: on this hot path a 64-bit division costs as much as all the rest of a decision.
type derived struct {
	emitQ, emitR int64  // period/limit = emitQ + emitR/limit µs
	invPeriod    uint64 // floor((2^64-1)/period): see divP
}

// renew makes s a state of p's algorithm, limit and period (µs): a fresh one unless s is current;
// a current state of another limit keeps its fields and takes p's limit (for a bucket, adopt has
// converted it first).
func (s *State) renew(p *Policy, period int64) {
	if s.current(p, period) {
		if s.Limit != p.Limit {
			s.Limit, s.cache = p.Limit, derive(p.Limit, period)
		}
		return
	}
	*s = State{Alg: p.Algorithm, Limit: p.Limit, Period: period, cache: derive(p.Limit, period)}
}

// derive computes a state's cache for limit and period (µs).
func derive(limit, period int64) derived {
	q, r := mul(period, 1).divmod(limit)
	return derived{emitQ: q, emitR: r, invPeriod: ^uint64(0) / uint64(period)}
}

// divP returns floor(x/period) and x mod period. For x below 2^64 and a state whose cache is set,
// it multiplies by the cached reciprocal instead of dividing: the estimate
// floor(x·inv/2^64) is at most 2 below the quotient, so at most two corrections follow.
//
// The cache is used only if it was derived from this very period: a state written under another
// period (read by a policy whose period a reload changed) has another reciprocal, whose estimate
// could overshoot.
func (s *State) divP(x u128, period int64) (q, r int64) {
	if x.hi != 0 || s.cache.invPeriod == 0 || s.Period != period {
		return x.divmod(period)
	}
	uq, _ := bits.Mul64(x.lo, s.cache.invPeriod)
	ur := x.lo - uq*uint64(period)
	for ur >= uint64(period) {
		uq++
		ur -= uint64(period)
	}
	if uq > maxInt64 {
		return maxInt64, 0
	}
	return int64(uq), int64(ur)
}

// divCeilP is ceil(x/period), as divP.
func (s *State) divCeilP(x u128, period int64) int64 {
	q, r := s.divP(x, period)
	if r != 0 && q < maxInt64 {
		q++
	}
	return q
}

// LogEntry is one approved request of a sliding log: it counts while now - period < At.
type LogEntry struct {
	At   int64 // µs
	Cost int64
}

// Decide decides a request of cost at now (µs) on the key whose state is *s, under the validated
// policy p. It changes *s only when it approves a positive cost, or when it converts a bucket's
// state written under another limit to p's (adopt: the same use, so the same decisions at this
// instant); a refusal, a peek (cost 0) or an error otherwise leaves *s exactly as it was.
//
// Time never runs backward for a key: a now earlier than the key's last recorded instant is
// treated as that instant (a conservative choice: a clock step back never frees quota).
// RetryAfter and ResetAfter stay relative to the now given.
//
// A cost that can never be approved returns Allowed false, RetryAfter Never and an error wrapping
// ErrCostExceedsLimit; a negative cost returns an error wrapping ErrInvalidCost.
//
// Decisions are exact for |now| < 2^62 µs (146,000 years either side of the epoch).
func Decide(p *Policy, s *State, now, cost int64) (Decision, error) {
	var d Decision
	err := DecideInto(p, s, now, cost, &d)
	return d, err
}

// DecideInto is Decide writing the decision into *d, every field. Stores call it: filling a
// caller's Decision field by field is several times faster than returning one, which Go builds
// on the stack and copies out with stalls that cost more than the whole algorithm.
func DecideInto(p *Policy, s *State, now, cost int64, d *Decision) error {
	return DecideWithin(p, s, now, cost, -1, d)
}

// DecideWithin is DecideInto for a caller that holds an approved leaky-bucket request for at most
// maxDelay µs (negative: no bound). A leaky-bucket request that would be held longer is refused,
// and like every refusal it changes nothing: its RetryAfter is the wait until its Delay would be
// maxDelay (or until the queue has room, if that is later). The other algorithms never hold, and
// ignore maxDelay.
//
// Holding at most maxDelay is the queue of a leaky bucket with less room: an approval needs
// tat - now ≤ maxDelay as well as ≤ Burst·T, so the decision is the leaky bucket's with its room
// cut to the smaller of the two (see leakyBucket), exact as the rest.
func DecideWithin(p *Policy, s *State, now, cost, maxDelay int64, d *Decision) error {
	if err := CheckCost(p, cost, d); err != nil {
		d.At = 0 // no decision was made: nothing to settle
		return err
	}
	d.At = now
	switch p.Algorithm {
	case FixedWindow:
		if p.Calendar != NoCalendar {
			return calendarFixed(p, s, now, cost, d)
		}
		return fixedWindow(p, s, now, cost, d)
	case SlidingLog:
		return slidingLog(p, s, now, cost, d)
	case SlidingWindow:
		if p.Calendar != NoCalendar {
			return calendarSliding(p, s, now, cost, d)
		}
		return slidingWindow(p, s, now, cost, d)
	case TokenBucket:
		return tokenBucket(p, s, now, cost, d)
	case LeakyBucket:
		return leakyBucket(p, s, now, cost, maxDelay, d)
	case Concurrency:
		return concurrency(p, s, now, 0, cost, d)
	}
	d.set(false, 0, 0, -1, 0, 0)
	return p.Validate()
}

// current reports whether s was written under p's algorithm and period (µs; for a calendar policy,
// its calendarTag), whatever its limit: any other state counts as never seen.
func (s *State) current(p *Policy, period int64) bool {
	return s.Alg == p.Algorithm && s.Period == period
}

// CheckCost returns the error of a request that no state could approve — a negative cost, a cost
// that can never fit p, or an invalid p — after filling *d with its decision (RetryAfter Never);
// nil otherwise, leaving *d alone. Decide starts with it; a store whose decisions run elsewhere
// (a Redis script) calls it first, so that such requests never leave the process.
func CheckCost(p *Policy, cost int64, d *Decision) error {
	if p.Calendar != NoCalendar {
		// A calendar policy has no period to divide by; its rules are few: Validate them.
		if err := p.Validate(); err != nil {
			d.set(false, 0, 0, -1, 0, 0)
			return err
		}
	} else if p.Limit <= 0 || p.Limit > MaxLimit || p.Period < MinPeriod || p.Period%time.Microsecond != 0 ||
		p.Burst < 0 || p.Burst > MaxLimit || (p.Burst != 0 && p.Algorithm != TokenBucket && p.Algorithm != LeakyBucket) ||
		p.Algorithm == 0 || int(p.Algorithm) >= len(algorithmNames) || (p.Algorithm == Concurrency && p.Limit > MaxConcurrency) {
		d.set(false, 0, 0, -1, 0, 0)
		return p.Validate() // never divide by a bad policy's zero
	}
	if cost < 0 {
		d.set(false, p.Capacity(), 0, -1, 0, 0)
		return fmt.Errorf("%w: cost %d must be ≥ 0", ErrInvalidCost, cost)
	}
	switch p.Algorithm {
	case TokenBucket:
		if cost > p.Capacity() {
			return never(p, cost, "exceeds the bucket's capacity "+itoa(p.Capacity()), d)
		}
	case LeakyBucket:
		if !fits(p, cost) {
			return never(p, cost, "takes longer to drain than any clock runs", d)
		}
	default:
		if cost > p.Limit {
			return never(p, cost, "exceeds the limit "+itoa(p.Limit), d)
		}
	}
	return nil
}

// IsIdle reports whether s is as if never seen at now under p: a store may then drop the key. It
// changes nothing (a bucket of another limit is converted on a copy).
func IsIdle(p *Policy, s *State, now int64) bool {
	c := *s
	d, err := Decide(p, &c, now, 0)
	return err == nil && d.ResetAfter == 0
}

func never(p *Policy, cost int64, why string, d *Decision) error {
	name := ""
	if p.Name != "" {
		name = fmt.Sprintf(" of policy %q", p.Name)
	}
	d.set(false, p.Capacity(), 0, -1, 0, 0)
	return fmt.Errorf("%w: cost %d %s%s, so it can never be approved", ErrCostExceedsLimit, cost, why, name)
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

// MakeDecision builds a Decision from µs as the transitions do (retry -1: Never; durations
// saturate): for stores whose decisions arrive as numbers (a Redis script's reply).
func MakeDecision(allowed bool, limit, remaining, retry, reset, delay int64) Decision {
	var d Decision
	d.set(allowed, limit, remaining, retry, reset, delay)
	return d
}

// set fills every field of d from µs (retry -1: Never), one by one: see DecideInto.
func (d *Decision) set(allowed bool, limit, remaining, retry, reset, delay int64) {
	d.Allowed = allowed
	d.Limit = limit
	d.Remaining = remaining
	if retry < 0 {
		d.RetryAfter = Never
	} else {
		d.RetryAfter = micros(retry)
	}
	d.ResetAfter = micros(reset)
	d.Delay = micros(delay)
	d.Fallback = NoFallback
	d.Source = FromStore
}
