package algorithm

import (
	"errors"
	"slices"
	"time"
)

// CONCURRENCY. A concurrency policy admits at most Limit requests of a key in flight at once
// (Stripe's concurrent-requests limiter, nginx's limit_conn). A request admitted takes Cost slots
// under a lease: an ID its caller draws (at random, 64 bits), held until the caller releases it
// when the response ends, or until it expires, Period (the lease time) after it was taken or last
// renewed. A caller renews the leases of the requests it still serves, well within the lease
// (the gateway: every third of it), so that a slow request keeps its slots and those of a caller
// that died come back after the lease time at most.
//
// Decisions: Limit is Policy.Limit; Remaining the slots free after the decision; ResetAfter the
// time until the last lease held expires (when the key is as if never seen, absent releases and
// renewals). A refusal's RetryAfter is a hint, not exact: a slot frees whenever a request in
// flight ends, which no store can know in advance. It is the time until enough leases would
// expire for the request to fit, at most RetryHint: so no refusal of a concurrency policy may be
// cached as the rate algorithms' are (IsExact).
//
// A cost of 0 peeks: allowed, taking nothing. Lease IDs are the caller's to keep unique among a
// key's leases in flight (64 random bits are); this transition decides a request under an ID
// already held as if that lease were not, and on approval replaces it (the Redis store's script
// may differ there, never beyond the limit).
//
// The state is the slots held, one entry of State.Log each — At its lease's expiry, Cost its
// lease's ID (the uint64's bits) — so a key holds at most Limit entries (MaxConcurrency), as the
// Redis store holds one sorted-set member per slot, and the state of a counter or bucket stays as
// small as it was. The transitions are pure and copy on write: they never change the array of a
// state's Log in place, so that a store may decide on a copy of a state (DecideAll's trial) and
// drop it.

// Lease is one lease's hold on slots of a concurrency policy, as Leases reports it.
type Lease struct {
	ID      uint64
	Slots   int64
	Expires int64 // µs: from then on the slots are free
}

// MaxConcurrency bounds a concurrency policy's Limit: each slot held is an entry of the key's
// state (a sorted-set member in Redis), so the slots of one key in flight must stay few.
const MaxConcurrency = 1 << 16

// RetryHint is the longest RetryAfter of a concurrency refusal: a slot may free at any moment.
const RetryHint = time.Second

// ErrNoLease is wrapped by the error of a request of cost > 0 under a concurrency policy decided
// without a lease ID (Decide): a slot that no one can give back would only ever expire.
var ErrNoLease = errors.New("a concurrency policy takes slots only under a lease")

// IsExact reports whether a refusal under p may be cached until its RetryAfter: false for
// Concurrency, whose slots free when requests end.
func IsExact(p *Policy) bool { return p.Algorithm != Concurrency }

// Acquire decides a request of cost slots under the lease id at now (µs) on the key whose state is
// *s, under the concurrency policy p. As Decide, it changes *s only when it approves a cost > 0.
func Acquire(p *Policy, s *State, now int64, id uint64, cost int64, d *Decision) error {
	if err := CheckCost(p, cost, d); err != nil {
		return err
	}
	if p.Algorithm != Concurrency {
		d.set(false, 0, 0, -1, 0, 0)
		return errors.New("algorithm: Acquire of a policy that is not concurrency")
	}
	return concurrency(p, s, now, id, cost, d)
}

// slots returns the slots *s holds (nil for a state of another algorithm).
func slots(s *State) []LogEntry {
	if s.Alg != Concurrency {
		return nil
	}
	return s.Log
}

// leaseOf is the lease ID of a slot.
func leaseOf(e LogEntry) uint64 { return uint64(e.Cost) }

// concurrency is Acquire past its checks; id 0 with a cost > 0 (Decide's path) is ErrNoLease.
func concurrency(p *Policy, s *State, now int64, id uint64, cost int64, d *Decision) error {
	if id == 0 && cost > 0 {
		d.set(false, p.Limit, 0, -1, 0, 0)
		return ErrNoLease
	}
	held := slots(s)
	inFlight, last := int64(0), int64(0)
	for _, e := range held {
		if e.At > now && leaseOf(e) != id {
			inFlight++
			last = max(last, e.At)
		}
	}
	allowed := inFlight+cost <= p.Limit
	var retry int64
	switch {
	case allowed && cost > 0:
		next := make([]LogEntry, 0, inFlight+cost)
		for _, e := range held {
			if e.At > now && leaseOf(e) != id {
				next = append(next, e)
			}
		}
		exp := now + p.PeriodMicros()
		for range cost {
			next = append(next, LogEntry{At: exp, Cost: int64(id)})
		}
		*s = State{Alg: Concurrency, Limit: p.Limit, Period: p.PeriodMicros(), Log: next}
		inFlight += cost
		last = max(last, exp)
	case !allowed:
		retry = retryHint(held, now, id, inFlight+cost-p.Limit)
	}
	var reset int64
	if last > now {
		reset = last - now
	}
	d.set(allowed, p.Limit, max(0, p.Limit-inFlight), retry, reset, 0)
	return nil
}

// retryHint is the time from now until need slots (but id's) expire, at most RetryHint.
func retryHint(held []LogEntry, now int64, id uint64, need int64) int64 {
	live := make([]int64, 0, len(held))
	for _, e := range held {
		if e.At > now && leaseOf(e) != id {
			live = append(live, e.At)
		}
	}
	hint := int64(RetryHint / time.Microsecond)
	if need > int64(len(live)) {
		return hint // a limit lowered below what is held: no expiry alone makes room soon
	}
	slices.Sort(live)
	return min(hint, live[need-1]-now)
}

// Release gives back the slots of lease id of *s (nothing if it holds none) and reports whether it
// held some unexpired at now.
func Release(s *State, now int64, id uint64) bool {
	held := slots(s)
	if !slices.ContainsFunc(held, func(e LogEntry) bool { return leaseOf(e) == id }) {
		return false
	}
	live := false
	next := make([]LogEntry, 0, len(held))
	for _, e := range held {
		if leaseOf(e) != id {
			next = append(next, e)
		} else if e.At > now {
			live = true
		}
	}
	s.Log = next
	return live
}

// Renew extends the leases ids of *s held at now to expire p.Period after now, and returns how
// many it renewed. An expired lease is not renewed: its slots may have been taken meanwhile.
func Renew(p *Policy, s *State, now int64, ids ...uint64) int {
	held := slots(s)
	var next []LogEntry
	var renewed []uint64
	for i, e := range held {
		if e.At > now && slices.Contains(ids, leaseOf(e)) {
			if next == nil {
				next = slices.Clone(held)
			}
			next[i].At = now + p.PeriodMicros()
			if !slices.Contains(renewed, leaseOf(e)) {
				renewed = append(renewed, leaseOf(e))
			}
		}
	}
	if next != nil {
		s.Log = next
	}
	return len(renewed)
}

// LastExpiry is when the last slot of *s expires (µs), or 0 if it holds none.
func LastExpiry(s *State) int64 {
	last := int64(0)
	for _, e := range slots(s) {
		last = max(last, e.At)
	}
	return last
}

// Leases returns the leases *s holds (expired ones included, until a decision drops them), in
// the order they were taken.
func Leases(s *State) []Lease {
	var out []Lease
	for _, e := range slots(s) {
		i := slices.IndexFunc(out, func(l Lease) bool { return l.ID == leaseOf(e) })
		if i < 0 {
			out = append(out, Lease{ID: leaseOf(e), Expires: e.At})
			i = len(out) - 1
		}
		out[i].Slots++
		out[i].Expires = max(out[i].Expires, e.At)
	}
	return out
}
