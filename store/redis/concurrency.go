package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// CONCURRENCY LIMITS. A concurrency limit's slots are one sorted set per client and policy,
// prefix + "{customer-42}:policy:slots", in the client's hash slot (lua/conc.lua says what it
// holds): its members are the slots in flight, scored by their lease's expiry on Redis's clock,
// pruned atomically at every call, so an instance that dies leaves its slots to expire after the
// lease time. A request's limits that include one go to the conc script instead of the multi
// script (or Decide's path): the rate limits and the slots decided together, all or nothing, in
// one call. Releases and renewals are the lease script, one call per client and policy.
//
// On a Redis Cluster, a request's limits under keys in several hash slots are decided across
// them as DecideAll says (acrossSlots): a check in every slot, then the commits one by one. The
// sorted set of a concurrency limit lies in its key's slot, so a concurrency limit under the
// client's key is decided atomically with the client's rate limits; under another key (a
// key_by) it is one more slot of the two phases, with what they keep: never more slots than its
// limit, but a request refused in a later slot's commit may leave its slot taken in an earlier
// one until its lease expires (the gateway releases only the slots of a request it admitted).
//
// No refusal of a concurrency limit is put in the negative cache (its RetryAfter is a hint: a
// slot frees when a request ends): such limits never take Decide's path, which caches.

var (
	concProgram  = newProgram(allAlgorithms("lua/conc.lua"), "conc")
	leaseProgram = newProgram(luaFile("lua/common.lua")+"\n"+luaFile("lua/lease.lua"), "lease")
)

// slotsKey is the sorted set of key's slots under policy.
func (s *Store) slotsKey(key, policy string) string {
	return s.prefix + "{" + key + "}:" + policy + ":slots"
}

// leaseArg is a lease ID as the scripts take it: 16 hex digits.
func leaseArg(id uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[id&15]
		id >>= 4
	}
	return string(b[:])
}

// concurrent reports whether the limits at the indices in which (nil: all) include a
// concurrency limit.
func (m *multiCall) concurrent(which []int) bool {
	if which == nil {
		for i := range m.limits {
			if m.limits[i].Policy.Algorithm == sluice.Concurrency {
				return true
			}
		}
		return false
	}
	for _, i := range which {
		if m.limits[i].Policy.Algorithm == sluice.Concurrency {
			return true
		}
	}
	return false
}

// decideConc is Decide of a concurrency policy: a peek (cost 0) at its slots; a cost > 0 needs a
// lease (DecideAll with Limit.Lease) and fails with ErrNoLease.
func (s *Store) decideConc(ctx context.Context, key string, p sluice.Policy, cost int64) (sluice.Decision, error) {
	if cost > 0 {
		return algorithm.MakeDecision(false, p.Limit, 0, -1, 0, 0),
			fmt.Errorf("%w: policy %q: Decide takes no lease; take slots with DecideAll and a Limit.Lease", sluice.ErrNoLease, p.Name)
	}
	var out [1]sluice.Decision
	_, err := s.DecideAll(ctx, key, []sluice.Limit{{Policy: p}}, out[:])
	return out[0], err
}

// Release implements sluice.Leaser.
func (s *Store) Release(ctx context.Context, key string, p sluice.Policy, id uint64) error {
	return s.lease(ctx, s.timeout, "release", key, p, id)
}

// Renew implements sluice.Leaser.
func (s *Store) Renew(ctx context.Context, key string, p sluice.Policy, ids ...uint64) error {
	if len(ids) == 0 {
		return nil
	}
	return s.lease(ctx, s.timeout, "renew", key, p, ids...)
}

// lease runs op on the leases ids of key under p, bounded by timeout.
func (s *Store) lease(ctx context.Context, timeout time.Duration, op, key string, p sluice.Policy, ids ...uint64) error {
	if p.Algorithm != sluice.Concurrency {
		return fmt.Errorf("%w: redis store: %s of a %v policy: only concurrency policies hold leases", sluice.ErrInvalidPolicy, op, p.Algorithm)
	}
	if err := p.Validate(); err != nil {
		return err
	}
	c, err := s.connected()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	j := &leaseJob{op: op, period: strconv.FormatInt(p.PeriodMicros(), 10), ids: ids}
	r := request{p: leaseProgram, keys: []string{s.slotsKey(key, p.Name)}, want: 2, by: deadline}
	_, err = s.run(ctx, c, &r, j)
	return err
}

// leaseJob is the executor's job for one call of the lease script: op of the leases ids.
type leaseJob struct {
	op, period string
	ids        []uint64
}

// arguments implements job: lease.lua's ARGV. (A lease script carries no deadline: a release or
// renewal that runs late is harmless.)
func (j *leaseJob) arguments(f *frame) ([]string, error) {
	args := make([]string, 0, 4+len(j.ids))
	args = append(args, j.op, f.s.now(), f.s.slack, j.period)
	for _, id := range j.ids {
		args = append(args, leaseArg(id))
	}
	return args, nil
}

func (j *leaseJob) consumed([]int64) bool { return false } // (releases and renewals take no quota)

func (j *leaseJob) giveBack([]int64) []refund { return nil }

var _ sluice.Leaser = (*Store)(nil)
