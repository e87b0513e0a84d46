package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Settle implements sluice.Settler: one settle script (lua/settle.lua, algorithm.Settle line for
// line) on the key's state, atomic and on Redis's clock, like a decision: at is the Decision.At
// of the charge, which the decision's script reported (its TIME, or the test clock's now). A
// settlement is of one key, so on a Redis Cluster it is one slot's. Nothing that could give back
// more than was charged happens on the gateway's side: the script reads the state, settles and
// writes it with its new TTL in one step.
//
// A calendar policy settles as its decisions decide: the store passes the windows around its
// own clock and at's window, which it computes exactly (Calendar.Window is pure), and the script
// settles in the window that holds Redis's now; if they do not hold it, the script writes
// nothing and names Redis's time, and the store asks once more around it (ErrStoreUnavailable
// if that fails too: a clock run back past a recorded window by more than a window).
//
// A settlement makes a refusal this instance's negative cache holds for the key stale (a refund
// frees quota, an extra charge delays it): the cache forgets the key. Other instances' caches
// still answer their cached refusals until the RetryAfter those carried — never longer: then they
// ask Redis, which says the truth (a refund's quota waits that long there; an extra charge's
// refusals come back with their exact RetryAfter).
func (s *Store) Settle(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64) error {
	var d sluice.Decision
	if err := s.check(&p, 0, &d); err != nil {
		return err
	}
	if err := algorithm.CheckSettle(&p, reserved, actual); err != nil {
		return err // (the core's checks: a concurrency policy has nothing to settle, costs in range)
	}
	if reserved == actual {
		return nil
	}
	c, err := s.connected()
	if err != nil {
		return err
	}
	hash, log := s.keys(key, p.Name)
	ctx, cancel := context.WithTimeout(ctx, s.callTimeout(true))
	defer cancel()
	deadline, _ := ctx.Deadline()
	atArg, atWindow := "", ""
	if at != sluice.SettleNow {
		atArg = strconv.FormatInt(at, 10)
	}
	// A calendar policy's period is its windows around the instance's clock, as its decisions
	// pass them: the script settles in the one that holds Redis's now. at's window the instance
	// computes exactly (SettleNow's is now's, which the script finds among them).
	cal := p.Calendar != algorithm.NoCalendar
	period := strconv.FormatInt(p.PeriodMicros(), 10)
	if cal {
		if period, err = calendarArg(&p, s.instanceNow()); err != nil {
			return err
		}
		if at != sluice.SettleNow {
			_, start, end := p.WindowOf(at)
			atWindow = strconv.FormatInt(start, 10) + " " + strconv.FormatInt(end, 10)
		}
	}
	sl := c.slot(hash)
	args := []string{strconv.Itoa(int(p.Algorithm)), strconv.FormatInt(p.Limit, 10), period,
		strconv.FormatInt(p.Burst, 10), atArg, strconv.FormatInt(reserved, 10), strconv.FormatInt(actual, 10),
		s.now(), s.slack, c.deadlineArg(sl, deadline), atWindow}
	var a ack
	var reply []int64
	for attempt := 0; ; attempt++ {
		s.calls.Add(1)
		a = ack{}
		reply, err = s.exec(ctx, c, s.settle, []string{hash, log}, args,
			s.waitFor(true, &a, func(reply []int64) bool { return len(reply) > 0 && reply[0] == 1 })).AsIntSlice()
		t, miss := calendarMiss(err)
		if !miss || !cal {
			break
		}
		if attempt > 0 {
			return fmt.Errorf("%w: %w: redis store: policy %q: %v", sluice.ErrStoreUnavailable, errCalendarRange, p.Name, err)
		}
		// Redis's time is outside the windows passed (the script wrote nothing): once more,
		// around the time its reply names, as a decision does.
		if args[2], err = calendarArg(&p, t); err != nil {
			return fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
		}
	}
	if err != nil {
		if re, ok := rueidis.IsRedisErr(err); ok && strings.Contains(re.Error(), "sluice: actual ") {
			return fmt.Errorf("%w: %v", sluice.ErrCostExceedsLimit, re.Error())
		}
		return c.failed(sl, err)
	}
	if len(reply) != 2 {
		return fmt.Errorf("%w: redis store: settle script replied %d numbers, want 2", sluice.ErrStoreUnavailable, len(reply))
	}
	c.learn(sl, reply[1])
	if s.refused != nil {
		s.refused.forget(p.Name + "\x00" + key) // the state moved: a cached refusal's numbers are stale
	}
	return a.err
}

var _ sluice.Settler = (*Store)(nil)
