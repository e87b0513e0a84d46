package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

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
// frees quota, an extra charge delays it): the cache forgets the key. A refund also reaches every
// other instance's cache: the script publishes the key on the prefix's channel (negcache.go).
//
// Under replicas_ack, a settlement Redis applied that too few replicas acknowledged fails with an
// error wrapping sluice.ErrUnconfirmed, not ErrStoreUnavailable: it was made; retrying it would
// settle twice.
func (s *Store) Settle(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64) error {
	return s.settleWithin(ctx, s.callTimeout(true), key, p, at, reserved, actual)
}

// settleWithin is Settle bounded by timeout.
func (s *Store) settleWithin(ctx context.Context, timeout time.Duration, key string, p sluice.Policy, at, reserved, actual int64) error {
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
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	j := &settleJob{p: &p, reserved: reserved, actual: actual}
	if at != sluice.SettleNow {
		j.at = strconv.FormatInt(at, 10)
	}
	// A calendar policy's period is its windows around the instance's clock, as its decisions
	// pass them: the script settles in the one that holds Redis's now. at's window the instance
	// computes exactly (SettleNow's is now's, which the script finds among them).
	cal := p.Calendar != algorithm.NoCalendar
	var inst int64
	if cal {
		inst = s.instanceNow()
		if at != sluice.SettleNow {
			_, start, end := p.WindowOf(at)
			j.atWindow = strconv.FormatInt(start, 10) + " " + strconv.FormatInt(end, 10)
		}
	}
	if actual < reserved && s.refused != nil {
		j.channel = s.channel() // a refund: every instance's cache forgets the key (negcache.go)
	}
	r := request{p: s.settle, keys: []string{hash, log}, want: 2, calendar: cal, inst: inst, consumes: true, by: deadline}
	_, err = s.run(ctx, c, &r, j)
	if err == nil || errors.Is(err, sluice.ErrUnconfirmed) {
		if s.refused != nil {
			s.refused.forget(hash) // the state moved: a cached refusal's numbers are stale
		}
	}
	return err
}

// settleJob is the executor's job for one call of the settle script.
type settleJob struct {
	p                *sluice.Policy
	at, atWindow     string
	reserved, actual int64
	channel          string // where a refund is published; "": not published
}

// arguments implements job: settle.lua's ARGV.
func (j *settleJob) arguments(f *frame) ([]string, error) {
	period, err := periodArg(j.p, f.inst)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
	}
	return []string{strconv.Itoa(int(j.p.Algorithm)), strconv.FormatInt(j.p.Limit, 10), period,
		strconv.FormatInt(j.p.Burst, 10), j.at, strconv.FormatInt(j.reserved, 10), strconv.FormatInt(j.actual, 10),
		f.s.now(), f.s.slack, f.deadline(f.by), j.atWindow, j.channel}, nil
}

// consumed: a settlement that changed the state is what WAIT confirms.
func (j *settleJob) consumed(reply []int64) bool { return len(reply) > 0 && reply[0] == 1 }

func (j *settleJob) giveBack([]int64) []refund { return nil } // (a settlement is not undone: ErrUnconfirmed)

var _ sluice.Settler = (*Store)(nil)
