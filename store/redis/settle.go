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

// SettleOnce implements sluice.OnceSettler: Settle, applied once for every call with the same id.
// The script keeps the id, in the same atomic step as the settlement, as a key of the key's hash
// slot (settledKey), for keep + the call's own bound + idMargin: an attempt that finds it there
// changes nothing and succeeds. A script runs before its call's deadline or writes nothing
// (lua/common.lua, DEADLINES): so every attempt that starts within keep of this one runs, if it
// ever does, while the id is still kept (docs/design.md, "Settlements that land").
func (s *Store) SettleOnce(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	if id == "" || len(id) > maxSettleID {
		return fmt.Errorf("redis store: a settlement's id must be 1 to %d bytes, not %d", maxSettleID, len(id))
	}
	timeout := s.callTimeout(true)
	return s.settleOnce(ctx, timeout, key, p, at, reserved, actual, id, keep+timeout+idMargin)
}

// maxSettleID bounds a settlement's id (sluice.Settlements makes 32 bytes).
const maxSettleID = 64

// idMargin is added to how long a settlement's id is kept: Redis's clock and this process's may
// run at different rates (deadline.go allows 200 ppm, 120 ms in 10 minutes), and a clock stepped
// back shifts the deadlines by the step.
const idMargin = 5 * time.Second

// settledKey is the key that records that settlement id of key was made: in the key's hash slot
// (its hash tag is the state key's, whatever the prefix and key hold: the same bytes up to "}").
func (s *Store) settledKey(key, id string) string {
	return s.prefix + "{" + key + "}:settled:" + id
}

// settleWithin is Settle bounded by timeout.
func (s *Store) settleWithin(ctx context.Context, timeout time.Duration, key string, p sluice.Policy, at, reserved, actual int64) error {
	return s.settleOnce(ctx, timeout, key, p, at, reserved, actual, "", 0)
}

// settleOnce is Settle bounded by timeout, once by id if it is not "", its record kept for idTTL.
func (s *Store) settleOnce(ctx context.Context, timeout time.Duration, key string, p sluice.Policy, at, reserved, actual int64, id string, idTTL time.Duration) error {
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
	keys := []string{hash, log}
	if id != "" {
		keys = append(keys, s.settledKey(key, id))
		j.idTTL = strconv.FormatInt(max(idTTL.Milliseconds(), 1), 10)
	}
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
	r := request{p: s.settle, keys: keys, want: 2, calendar: cal, inst: inst, consumes: true, by: deadline}
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
	idTTL            string // ms the id's record (KEYS[3]) is kept; "": no id
}

// arguments implements job: settle.lua's ARGV.
func (j *settleJob) arguments(f *frame) ([]string, error) {
	period, err := periodArg(j.p, f.inst)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sluice.ErrStoreUnavailable, err)
	}
	return []string{strconv.Itoa(int(j.p.Algorithm)), strconv.FormatInt(j.p.Limit, 10), period,
		strconv.FormatInt(j.p.Burst, 10), j.at, strconv.FormatInt(j.reserved, 10), strconv.FormatInt(j.actual, 10),
		f.s.now(), f.s.slack, f.deadline(f.by), j.atWindow, j.channel, j.idTTL}, nil
}

// consumed: a settlement that changed the state is what WAIT confirms.
func (j *settleJob) consumed(reply []int64) bool { return len(reply) > 0 && reply[0] == 1 }

func (j *settleJob) giveBack([]int64) []refund { return nil } // (a settlement is not undone: ErrUnconfirmed)

var _ sluice.OnceSettler = (*Store)(nil)
