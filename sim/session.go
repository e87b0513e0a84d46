package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
	n        int              // requests decided so far
	last     int64            // µs: the latest instant decided or peeked at; times may not go below it
	origin   int64            // µs since the Unix epoch of virtual time 0 (Options.Start)
	held     []held           // approved requests whose responses are still running, by end (then request)
	running  map[string]*load // per key: what its held requests hold
	ended    []Ended          // held requests settled since the last call to Ended
}

// held is an approved request whose response is still running (DecideStream): its estimate stays
// charged until the response ends at end, when it is settled with its real cost.
type held struct {
	end    int64 // µs
	seq    int   // its place among the session's requests, from 0
	actual int64 // NoActual: the estimate stands
	lim    *sluice.Limiter
	r      *sluice.Reservation
	row    Row
}

// load is what one key's running responses hold: how many, and Σ their estimates.
type load struct{ streams, reserved int64 }

// Ended is the row of a request whose response ran for a while (DecideStream), completed by its
// settlement when the response ended: Seq is the request's place among the session's, from 0.
type Ended struct {
	Seq int
	Row Row
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
	return s.decide(rq, actual, 0, false)
}

// DecideStream is DecideSettled for a request whose response lasts durMicros (≥ 0; 0: it is
// served at once). First it settles the running responses that end at or before rq's time (see
// Ended), then decides rq. Approved with a duration, rq holds its estimate while its response
// runs: the returned row is Held, and its settlement, with actual (NoActual: the estimate
// stands), comes when the clock reaches rq.TMicros + durMicros — at a later request, a Peek, or
// Finish — and its completed row then from Ended. Every row DecideStream returns says what the
// key's running responses hold once it is decided (Row.Streams).
func (s *Session) DecideStream(rq Request, actual, durMicros int64) (Row, error) {
	return s.decide(rq, actual, durMicros, true)
}

func (s *Session) decide(rq Request, actual, durMicros int64, streams bool) (Row, error) {
	i := s.n + 1
	switch {
	case rq.TMicros < 0 || rq.TMicros > MaxTimeMicros:
		return Row{}, fmt.Errorf("sim: request %d: time %d µs is outside 0..2^53", i, rq.TMicros)
	case rq.TMicros < s.last:
		return Row{}, fmt.Errorf("sim: request %d: time %s ms is before the previous request's %s ms (requests must be in time order)",
			i, FormatMillis(rq.TMicros), FormatMillis(s.last))
	case rq.Cost < 0:
		return Row{}, fmt.Errorf("sim: request %d: cost %d must be ≥ 0", i, rq.Cost)
	case actual != NoActual && (actual < 0 || actual > algorithm.MaxLimit):
		return Row{}, fmt.Errorf("sim: request %d: actual cost %d must be in 0..2^53", i, actual)
	case durMicros < 0 || durMicros > MaxTimeMicros-rq.TMicros:
		return Row{}, fmt.Errorf("sim: request %d: duration %d µs must be ≥ 0 and end by 2^53 µs", i, durMicros)
	}
	if err := s.settleUntil(rq.TMicros); err != nil {
		return Row{}, err
	}
	s.last = rq.TMicros
	s.clock.Set(time.UnixMicro(s.origin + rq.TMicros))
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
	var err error
	var r *sluice.Reservation
	if actual != NoActual {
		r, err = lim.Reserve(s.ctx, rq.Key, rq.Cost) // settled now, or when its response ends
		d = r.Decision()
	} else {
		d, err = lim.AllowN(s.ctx, rq.Key, rq.Cost)
	}
	row := Row{Request: rq, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfterMicros: micros(d.RetryAfter), DelayMicros: micros(d.Delay), Instance: instance, Fallback: fallbackName(d.Fallback)}
	switch {
	case s.outage != nil && errors.Is(err, sluice.ErrStoreUnavailable):
		// The shared store is down and the instance fails closed: refused, not for its quota
		// (no Retry-After: the client did nothing wrong), as the gateway answers 503.
		row.Allowed, row.Remaining, row.RetryAfterMicros, row.DelayMicros, row.Fallback = false, 0, 0, 0, FallbackClosed
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		row.Allowed, row.RetryAfterMicros, row.DelayMicros = false, NeverMicros, 0
	case err != nil:
		return Row{}, fmt.Errorf("sim: request %d (t_ms %s, key %q): %w", i, FormatMillis(rq.TMicros), rq.Key, err)
	case d.Allowed:
		row.RetryAfterMicros = 0
	}
	if s.latency > 0 {
		// The decision's calls only: a settlement comes after the request was served.
		row.HasLatency, row.LatencyMicros = true, (s.shared.calls-calls)*s.latency
	}
	if streams {
		row.Streams, row.EndMicros = true, rq.TMicros+durMicros
	}
	lasts := durMicros > 0 && row.Allowed
	if lasts {
		row.held = true
		row.Settles, row.Actual = actual != NoActual, max(actual, 0)
	} else if actual != NoActual {
		row.Settles, row.Actual = true, actual
		if err := s.settle(lim, r, &row); err != nil {
			return Row{}, fmt.Errorf("sim: request %d (t_ms %s, key %q): settling: %w", i, FormatMillis(rq.TMicros), rq.Key, err)
		}
	}
	if streams {
		l := s.load(rq.Key, lasts, rq.Cost)
		row.InFlight, row.Reserved = l.streams, l.reserved
	}
	if lasts {
		s.hold(held{end: row.EndMicros, seq: s.n, actual: actual, lim: lim, r: r, row: row})
	}

	s.n++
	return row, nil
}

// Peek settles the responses that end at or before tMicros (see Ended), sets the clock to
// tMicros and asks the limiter about a request of cost 0 on key, which
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
	if err := s.settleUntil(tMicros); err != nil {
		return sluice.Decision{}, err
	}
	s.last = tMicros
	s.clock.Set(time.UnixMicro(s.origin + tMicros))
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
// one settles nothing and its balance is its own Remaining. A settlement that leaves nothing also
// records how long the key must wait for a request of cost 1 (a refused probe changes nothing; a
// Fleet's instances are not probed: one could take a budget from the store for it).
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
	if !row.Streams || d.Remaining > 0 || s.limiters != nil {
		return nil
	}
	if d, err = lim.AllowN(s.ctx, row.Key, 1); err != nil {
		return err
	}
	if d.Allowed { // a leaky bucket with room to queue: take the probe back
		return fmt.Errorf("a probe of cost 1 was approved with 0 remaining")
	}
	row.WaitMicros = micros(d.RetryAfter)
	return nil
}

// load counts a request of cost on key into what the key's running responses hold if it runs
// (adds), and returns what they hold.
func (s *Session) load(key string, adds bool, cost int64) load {
	l := s.running[key]
	if l == nil && !adds {
		return load{}
	}
	if l == nil {
		if s.running == nil {
			s.running = map[string]*load{}
		}
		l = &load{}
		s.running[key] = l
	}
	if adds {
		l.streams++
		l.reserved += cost
	}
	return *l
}

// hold keeps h until its response ends, in order of ends (then of requests).
func (s *Session) hold(h held) {
	i, _ := slices.BinarySearchFunc(s.held, h, func(a, b held) int {
		return cmp.Or(cmp.Compare(a.end, b.end), cmp.Compare(a.seq, b.seq))
	})
	s.held = slices.Insert(s.held, i, h)
}

// settleUntil settles, in order, the held requests whose responses end at or before tMicros,
// each at its end on the virtual clock, and keeps their rows for Ended.
func (s *Session) settleUntil(tMicros int64) error {
	for len(s.held) > 0 && s.held[0].end <= tMicros {
		h := s.held[0]
		s.held = s.held[1:]
		s.last = h.end
		s.clock.Set(time.UnixMicro(s.origin + h.end))
		l := s.running[h.row.Key]
		l.streams--
		l.reserved -= h.row.Cost
		if l.streams == 0 {
			delete(s.running, h.row.Key)
		}
		row := h.row
		row.held = false
		if h.actual != NoActual {
			if err := s.settle(h.lim, h.r, &row); err != nil {
				return fmt.Errorf("sim: request %d (t_ms %s, key %q): settling at its end, %s ms: %w",
					h.seq+1, FormatMillis(row.TMicros), row.Key, FormatMillis(h.end), err)
			}
		}
		s.ended = append(s.ended, Ended{Seq: h.seq, Row: row})
	}
	return nil
}

// Finish settles every response still running, each at its end, in order of ends; their rows
// are then in Ended. The session may go on after it, from the last end.
func (s *Session) Finish() error { return s.settleUntil(MaxTimeMicros) }

// Ended returns the rows of the requests whose responses have ended (and been settled) since the
// last call, in the order of their ends.
func (s *Session) Ended() []Ended {
	e := s.ended
	s.ended = nil
	return e
}
