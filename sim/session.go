package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/store/memory"
)

// Session is one simulation taken a step at a time: the limiter of a policy on a fresh memory
// store and a virtual clock that only moves forward. Simulate is a Session fed every request in
// turn; the browser simulation also uses Peek between requests to plot the limiter's state (the
// tokens, the count in the window, the queue) without changing it.
//
// A Session is not safe for concurrent use.
type Session struct {
	clock    *sluice.ManualClock
	limiter  *sluice.Limiter   // the first instance's
	limiters []*sluice.Limiter // a Fleet's instances, each with its own budgets; nil: one instance
	next     int               // the instance the next request goes to (round robin)
	rng      *rand.Rand        // Random balance: the balancer's choices; nil: round robin
	outage   *Outage           // the shared store's outage, if any
	shared   *sharedStore      // a Fleet's shared store; nil: none
	latency  int64             // µs: a Fleet's StoreLatency
	ctx      context.Context
	n        int      // requests decided so far
	last     int64    // µs: the latest instant decided or peeked at; times may not go below it
	origin   int64    // µs since the Unix epoch of virtual time 0 (Options.Start)
	changes  []Change // Options.Changes still to come, in time order
	// keys are the keys decided or peeked at so far (in that order; known: the same, as a
	// set), while changes are to come: a change converts each one's state at its own instant
	// (changeTo).
	keys  []string
	known map[string]bool
}

// Fleet is several gateway instances sharing one store, each spending local budgets of the
// policy (sluice.Budgeted over the shared store, on the session's clock), with the requests
// dealt to them in turn (round robin, as a load balancer would). It shows what local budgets
// admit beyond an exact decision: see sluice.LocalBudget for the bound.
//
// Its other fields make it the fleet of `sluice simulate --store`: instances with their own
// stores or one shared store, without budgets, balanced in turn or at random, and the shared
// store's outage (see fleetstore.go).
type Fleet struct {
	Instances int                // ≥ 1
	Budget    sluice.LocalBudget // each instance's budget of the policy; Size 0: none
	Stores    StoreMode          // SharedStore (the default) or SeparateStores
	Balance   Balance            // RoundRobin (the default) or Random
	Draw      uint64             // with Random: the number the balancer's choices are drawn from
	Outage    *Outage            // the shared store's outage; nil: none
	// StoreLatency is each call's round trip to the shared store (0..1h, whole µs): a request
	// reaches the backend that much later for each call its instance made to the store to
	// decide it (Row.LatencyMicros; none for a budget's unit spent locally). Decisions are the
	// same: the store decides each call atomically, as Redis does.
	StoreLatency time.Duration
}

// MaxInstances bounds Fleet.Instances.
const MaxInstances = 64

// NewFleetSession is NewSession with the requests decided by f's instances in turn. It returns
// an error, naming the field, if the policy or the budget is invalid or the instances are not
// 1..MaxInstances.
func NewFleetSession(policy sluice.Policy, keys int, f Fleet) (*Session, error) {
	return newFleetSession(policy, keys, f, 0)
}

func newFleetSession(policy sluice.Policy, keys int, f Fleet, origin int64) (*Session, error) {
	if f.Instances < 1 || f.Instances > MaxInstances {
		return nil, fmt.Errorf("sim: instances %d must be from 1 to %d", f.Instances, MaxInstances)
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if f.Budget != (sluice.LocalBudget{}) { // the zero budget is none
		if err := f.Budget.Validate(policy); err != nil {
			return nil, err
		}
	}
	clock := sluice.NewManualClock(time.UnixMicro(origin))
	s := &Session{clock: clock, ctx: context.Background(), origin: origin}
	if err := s.buildFleet(policy, keys, f); err != nil {
		return nil, err
	}
	s.limiter = s.limiters[0]
	return s, nil
}

// NewSession returns a session of policy for traffic from at most keys distinct keys (taken as
// at least 1): the store holds that many keys, so that none is ever evicted and every decision is
// exact. It returns an error, naming the field, if the policy is invalid.
func NewSession(policy sluice.Policy, keys int) (*Session, error) {
	return newSession(policy, keys, 0)
}

func newSession(policy sluice.Policy, keys int, origin int64) (*Session, error) {
	clock := sluice.NewManualClock(time.UnixMicro(origin))
	// One shard's share of the key bound is then at least keys.
	store := memory.New(memory.WithClock(clock), memory.WithMaxKeys(max(1, keys)*memory.DefaultShards))
	lim, err := sluice.NewLimiter(store, policy)
	if err != nil {
		return nil, err
	}
	return &Session{clock: clock, limiter: lim, ctx: context.Background(), origin: origin}, nil
}

// Decide sets the clock to rq's time and decides rq. A request whose cost can never fit is a
// refused row with RetryAfterMicros NeverMicros, not an error. It returns an error if rq's time
// is outside 0..MaxTimeMicros or before the last instant decided or peeked at, if its cost is
// negative, or if the store fails; the session is then unchanged.
func (s *Session) Decide(rq Request) (Row, error) { return s.DecideSettled(rq, NoActual) }

// DecideSettled is Decide for a request whose real cost is actual (NoActual: not known; else
// 0..2^53, rq.Cost being the estimate): approved, it is settled with it at once, at rq's time,
// and the row says the balance that leaves (see Options.Actual).
func (s *Session) DecideSettled(rq Request, actual int64) (Row, error) {
	row, lim, r, err := s.reserve(rq, actual)
	if err != nil {
		return Row{}, err
	}
	if actual != NoActual {
		if err := s.settle(lim, r, &row); err != nil {
			return Row{}, fmt.Errorf("sim: request %d (t_ms %s, key %q): settling: %w", s.n+1, FormatMillis(rq.TMicros), rq.Key, err)
		}
	}
	s.n++
	return row, nil
}

// reserve sets the clock to rq's time and decides rq (with its real cost actual: through the
// reservation r of the limiter lim, that settles it). It returns an error if rq cannot be
// decided next; the session is then unchanged.
func (s *Session) reserve(rq Request, actual int64) (row Row, lim *sluice.Limiter, r *sluice.Reservation, err error) {
	i := s.n + 1
	switch {
	case rq.TMicros < 0 || rq.TMicros > MaxTimeMicros:
		return Row{}, nil, nil, fmt.Errorf("sim: request %d: time %d µs is outside 0..2^53", i, rq.TMicros)
	case rq.TMicros < s.last:
		return Row{}, nil, nil, fmt.Errorf("sim: request %d: time %s ms is before the previous request's %s ms (requests must be in time order)",
			i, FormatMillis(rq.TMicros), FormatMillis(s.last))
	case rq.Cost < 0:
		return Row{}, nil, nil, fmt.Errorf("sim: request %d: cost %d must be ≥ 0", i, rq.Cost)
	case actual != NoActual && (actual < 0 || actual > algorithm.MaxLimit):
		return Row{}, nil, nil, fmt.Errorf("sim: request %d: actual cost %d must be in 0..2^53", i, actual)
	}
	if err := s.changeTo(rq.TMicros); err != nil {
		return Row{}, nil, nil, err
	}
	s.last = rq.TMicros
	s.clock.Set(time.UnixMicro(s.origin + rq.TMicros))
	s.seen(rq.Key)
	lim, instance := s.limiter, 0
	if s.limiters != nil {
		i := s.balance()
		lim, instance = s.limiters[i], i+1
	}
	var calls int64 // the shared store's calls before this decision
	if s.shared != nil {
		calls = s.shared.calls
	}
	var d sluice.Decision
	if actual != NoActual {
		r, err = lim.Reserve(s.ctx, rq.Key, rq.Cost) // settled now, or when its response ends
		d = r.Decision()
	} else {
		d, err = lim.AllowN(s.ctx, rq.Key, rq.Cost)
	}
	row = Row{Request: rq, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfterMicros: micros(d.RetryAfter), DelayMicros: micros(d.Delay), Instance: instance, Fallback: fallbackName(d.Fallback)}
	switch {
	case s.outage != nil && errors.Is(err, sluice.ErrStoreUnavailable):
		// The shared store is down and the instance fails closed: refused, not for its quota
		// (no Retry-After: the client did nothing wrong), as the gateway answers 503.
		row.Allowed, row.Remaining, row.RetryAfterMicros, row.DelayMicros, row.Fallback = false, 0, 0, 0, FallbackClosed
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		row.Allowed, row.RetryAfterMicros, row.DelayMicros = false, NeverMicros, 0
	case err != nil:
		return Row{}, nil, nil, fmt.Errorf("sim: request %d (t_ms %s, key %q): %w", i, FormatMillis(rq.TMicros), rq.Key, err)
	case d.Allowed:
		row.RetryAfterMicros = 0
	}
	if s.latency > 0 {
		// The decision's calls only: a settlement comes after the request was served.
		row.HasLatency, row.LatencyMicros = true, (s.shared.calls-calls)*s.latency
	}
	if actual != NoActual {
		row.Settles, row.Actual = true, actual
	}
	return row, lim, r, nil
}

// Peek sets the clock to tMicros and asks the limiter about a request of cost 0 on key, which
// reports the key's state and changes nothing: Remaining is the cost that could still pass at
// tMicros, ResetAfter the time until the key is back to full quota (for the buckets: until the
// queue ahead has drained). Like Decide, it returns an error for a time outside 0..MaxTimeMicros
// or before the last instant decided or peeked at.
func (s *Session) Peek(tMicros int64, key string) (sluice.Decision, error) {
	switch {
	case tMicros < 0 || tMicros > MaxTimeMicros:
		return sluice.Decision{}, fmt.Errorf("sim: peek: time %d µs is outside 0..2^53", tMicros)
	case tMicros < s.last:
		return sluice.Decision{}, fmt.Errorf("sim: peek: time %s ms is before the last one decided, %s ms", FormatMillis(tMicros), FormatMillis(s.last))
	}
	if err := s.changeTo(tMicros); err != nil {
		return sluice.Decision{}, err
	}
	s.last = tMicros
	s.clock.Set(time.UnixMicro(s.origin + tMicros))
	s.seen(key)
	d, err := s.limiter.AllowN(s.ctx, key, 0)
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("sim: peek at t_ms %s, key %q: %w", FormatMillis(tMicros), key, err)
	}
	return d, nil
}

// Policy returns the session's policy.
func (s *Session) Policy() sluice.Policy { return s.limiter.Policy() }

// settle settles an approved request's reservation r with its real cost, at the clock's instant
// (its decision's, or its response's end), and records the balance it leaves (a peek); a refused
// one settles nothing and its balance is its own Remaining.
func (s *Session) settle(lim *sluice.Limiter, r *sluice.Reservation, row *Row) error {
	row.Balance = row.Remaining
	if !row.Allowed {
		return nil
	}
	if err := r.Settle(s.ctx, row.Actual); err != nil {
		return err
	}
	d, err := lim.AllowN(s.ctx, row.Key, 0)
	if err != nil {
		return err
	}
	row.Balance = d.Remaining
	return nil
}

// Replay starts a replay of one key's requests under p alone, on a virtual clock that starts at
// start: decide decides each (its time in µs since start, non-decreasing; its cost) as a session
// does, and says whether it passed. It is the gateway's what-if (gateway.Replayer).
func Replay(p sluice.Policy, start time.Time) (decide func(tMicros, cost int64) (bool, error), err error) {
	sess, err := Options{Start: start}.NewSession(p, 1)
	if err != nil {
		return nil, err
	}
	return func(tMicros, cost int64) (bool, error) {
		row, err := sess.Decide(Request{TMicros: tMicros, Key: DefaultKey, Cost: cost})
		return row.Allowed, err
	}, nil
}
