package redis

import (
	"context"
	"fmt"
	"strconv"

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

// execConc is exec for limits that include concurrency limits: the conc script.
func (m *multiCall) execConc(ctx context.Context, which []int, check bool) (bool, error) {
	if which == nil {
		which = make([]int, len(m.limits))
		for i := range which {
			which[i] = i
		}
	}
	var rate, conc []int
	for _, i := range which {
		l := &m.limits[i]
		if l.Policy.Algorithm != sluice.Concurrency {
			rate = append(rate, i)
			continue
		}
		if l.Lease == 0 && l.Cost > 0 {
			m.out[i] = algorithm.MakeDecision(false, l.Policy.Limit, 0, -1, 0, 0)
			return false, fmt.Errorf("%w: policy %q: the limit has no Lease", sluice.ErrNoLease, l.Policy.Name)
		}
		conc = append(conc, i)
	}
	keys := make([]string, 0, 2*len(rate)+len(conc))
	for _, i := range rate {
		keys = append(keys, m.keys[2*i], m.keys[2*i+1])
	}
	for _, i := range conc {
		keys = append(keys, m.s.slotsKey(m.limits[i].EffectiveKey(m.key), m.limits[i].Policy.Name))
	}
	bit := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	args := make([]string, 0, 7+multiArgs*len(rate)+5*len(conc))
	inst, attempt := m.inst, 0
again: // (once more if Redis's time was outside the calendar windows passed, as exec)
	args = append(args[:0], strconv.Itoa(len(rate)), m.now, m.s.slack)
	for _, i := range rate {
		l := &m.limits[i]
		period, err := periodArg(&l.Policy, inst) // a calendar rate limit's windows (calendar.go)
		if err != nil {
			return false, err
		}
		args = append(args, strconv.Itoa(int(l.Policy.Algorithm)), strconv.FormatInt(l.Policy.Limit, 10),
			period, strconv.FormatInt(l.Policy.Burst, 10), strconv.FormatInt(l.Cost, 10),
			strconv.FormatInt(l.MaxDelayMicros(), 10), bit(l.DryRun))
	}
	args = append(args, strconv.Itoa(len(conc)))
	for _, i := range conc {
		l := &m.limits[i]
		args = append(args, strconv.FormatInt(l.Policy.Limit, 10), strconv.FormatInt(l.Policy.PeriodMicros(), 10),
			strconv.FormatInt(l.Cost, 10), bit(l.DryRun), leaseArg(l.Lease))
	}
	if check {
		args = append(args, "check")
	}
	deadline, _ := ctx.Deadline()
	sl := m.c.slot(keys[0])
	args = append(args, m.c.deadlineArg(sl, deadline))
	order := append(append(make([]int, 0, len(rate)+len(conc)), rate...), conc...)
	n := len(order)
	consumes := false
	for _, i := range order {
		consumes = consumes || m.limits[i].Cost > 0
	}
	m.s.calls.Add(1)
	var a ack
	reply, err := m.s.exec(ctx, m.c, concProgram, keys, args, m.s.waitFor(consumes && !check, &a, func(reply []int64) bool {
		wrote := false
		for j := range min(n, len(reply)/6) {
			l := &m.limits[order[j]]
			if reply[6*j] != 1 && !l.DryRun {
				return false
			}
			wrote = wrote || (reply[6*j] == 1 && l.Cost > 0)
		}
		return wrote
	})).AsIntSlice()
	if err != nil {
		if t, ok := calendarMiss(err); ok && m.calendar {
			if attempt++; attempt == 1 {
				inst = t
				goto again
			}
			return false, fmt.Errorf("%w: %w: redis store: %v", sluice.ErrStoreUnavailable, errCalendarRange, err)
		}
		return false, m.c.failed(sl, err)
	}
	if len(reply) != 6*n+1 {
		return false, fmt.Errorf("%w: redis store: conc script replied %d numbers, want %d", sluice.ErrStoreUnavailable, len(reply), 6*n+1)
	}
	m.c.learn(sl, reply[6*n])
	all := true
	for j, i := range order {
		r := reply[6*j : 6*j+6]
		m.out[i] = algorithm.MakeDecision(r[0] == 1, r[1], r[2], r[3], r[4], r[5])
		if m.limits[i].Policy.Algorithm != sluice.Concurrency {
			m.out[i].At = reply[6*n] // the script's now: what a settlement of a rate limit's charge takes (as exec)
		}
		all = all && (m.out[i].Allowed || m.limits[i].DryRun)
	}
	if all && !check && m.s.refused != nil {
		for _, i := range rate { // written: a cached refusal's numbers are stale (as exec)
			if l := &m.limits[i]; m.out[i].Allowed && l.Cost > 0 {
				m.s.refused.forget(l.Policy.Name + "\x00" + l.EffectiveKey(m.key))
			}
		}
	}
	if a.err != nil {
		return false, a.err
	}
	return all, nil
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
	return s.lease(ctx, "release", key, p, id)
}

// Renew implements sluice.Leaser.
func (s *Store) Renew(ctx context.Context, key string, p sluice.Policy, ids ...uint64) error {
	if len(ids) == 0 {
		return nil
	}
	return s.lease(ctx, "renew", key, p, ids...)
}

func (s *Store) lease(ctx context.Context, op, key string, p sluice.Policy, ids ...uint64) error {
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
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	args := make([]string, 0, 4+len(ids))
	args = append(args, op, s.now(), s.slack, strconv.FormatInt(p.PeriodMicros(), 10))
	for _, id := range ids {
		args = append(args, leaseArg(id))
	}
	k := s.slotsKey(key, p.Name)
	s.calls.Add(1)
	reply, err := s.exec(ctx, c, leaseProgram, []string{k}, args, nil).AsIntSlice()
	if err != nil {
		return c.failed(c.slot(k), err)
	}
	if len(reply) == 2 {
		c.learn(c.slot(k), reply[1])
	}
	return nil
}

var _ sluice.Leaser = (*Store)(nil)
