package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// Session is one simulation taken a step at a time: the limiter of a policy on a fresh memory
// store and a virtual clock that only moves forward. Simulate is a Session fed every request in
// turn; the browser simulation also uses Peek between requests to plot the limiter's state (the
// tokens, the count in the window, the queue) without changing it.
//
// A Session is not safe for concurrent use.
type Session struct {
	clock   *sluice.ManualClock
	limiter *sluice.Limiter
	ctx     context.Context
	n       int   // requests decided so far
	last    int64 // µs: the latest instant decided or peeked at; times may not go below it
}

// NewSession returns a session of policy for traffic from at most keys distinct keys (taken as
// at least 1): the store holds that many keys, so that none is ever evicted and every decision is
// exact. It returns an error, naming the field, if the policy is invalid.
func NewSession(policy sluice.Policy, keys int) (*Session, error) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	// One shard's share of the key bound is then at least keys.
	store := memory.New(memory.WithClock(clock), memory.WithMaxKeys(max(1, keys)*memory.DefaultShards))
	lim, err := sluice.NewLimiter(store, policy)
	if err != nil {
		return nil, err
	}
	return &Session{clock: clock, limiter: lim, ctx: context.Background()}, nil
}

// Decide sets the clock to rq's time and decides rq. A request whose cost can never fit is a
// refused row with RetryAfterMicros NeverMicros, not an error. It returns an error if rq's time
// is outside 0..MaxTimeMicros or before the last instant decided or peeked at, if its cost is
// negative, or if the store fails; the session is then unchanged.
func (s *Session) Decide(rq Request) (Row, error) {
	i := s.n + 1
	switch {
	case rq.TMicros < 0 || rq.TMicros > MaxTimeMicros:
		return Row{}, fmt.Errorf("sim: request %d: time %d µs is outside 0..2^53", i, rq.TMicros)
	case rq.TMicros < s.last:
		return Row{}, fmt.Errorf("sim: request %d: time %s ms is before the previous request's %s ms (requests must be in time order)",
			i, FormatMillis(rq.TMicros), FormatMillis(s.last))
	case rq.Cost < 0:
		return Row{}, fmt.Errorf("sim: request %d: cost %d must be ≥ 0", i, rq.Cost)
	}
	s.last = rq.TMicros
	s.clock.Set(time.UnixMicro(rq.TMicros))
	d, err := s.limiter.AllowN(s.ctx, rq.Key, rq.Cost)
	row := Row{Request: rq, Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfterMicros: micros(d.RetryAfter), DelayMicros: micros(d.Delay)}
	switch {
	case errors.Is(err, sluice.ErrCostExceedsLimit):
		row.Allowed, row.RetryAfterMicros, row.DelayMicros = false, NeverMicros, 0
	case err != nil:
		return Row{}, fmt.Errorf("sim: request %d (t_ms %s, key %q): %w", i, FormatMillis(rq.TMicros), rq.Key, err)
	case d.Allowed:
		row.RetryAfterMicros = 0
	}
	s.n++
	return row, nil
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
	s.last = tMicros
	s.clock.Set(time.UnixMicro(tMicros))
	d, err := s.limiter.AllowN(s.ctx, key, 0)
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("sim: peek at t_ms %s, key %q: %w", FormatMillis(tMicros), key, err)
	}
	return d, nil
}

// Policy returns the session's policy.
func (s *Session) Policy() sluice.Policy { return s.limiter.Policy() }
