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
// A cost of 0 peeks: allowed, taking nothing. A lease whose ID is already held is taken again:
// decided as if the held one were not, and on approval it replaces it.
//
// The transitions are pure and copy on write: they never change the array of a state's Leases
// in place, so that a store may decide on a copy of a state (DecideAll's trial) and drop it.

// Lease is a request's hold on slots of a concurrency policy.
type Lease struct {
	ID      uint64
	Slots   int64
	Expires int64 // µs: from then on the slots are free
}

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

// concurrency is Acquire past its checks; id 0 with a cost > 0 (Decide's path) is ErrNoLease.
func concurrency(p *Policy, s *State, now int64, id uint64, cost int64, d *Decision) error {
	var held []Lease
	if s.Alg == Concurrency {
		held = s.Leases
	}
	if id == 0 && cost > 0 {
		d.set(false, p.Limit, 0, -1, 0, 0)
		return ErrNoLease
	}
	inFlight, last := int64(0), int64(0)
	for _, l := range held {
		if l.Expires > now && l.ID != id {
			inFlight += l.Slots
			last = max(last, l.Expires)
		}
	}
	allowed := inFlight+cost <= p.Limit
	var retry int64
	switch {
	case allowed && cost > 0:
		next := make([]Lease, 0, len(held)+1)
		for _, l := range held {
			if l.Expires > now && l.ID != id {
				next = append(next, l)
			}
		}
		exp := now + p.PeriodMicros()
		next = append(next, Lease{ID: id, Slots: cost, Expires: exp})
		*s = State{Alg: Concurrency, Limit: p.Limit, Period: p.PeriodMicros(), Leases: next}
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

// retryHint is the time from now until leases (but id's) of at least need slots expire, at
// most RetryHint.
func retryHint(held []Lease, now int64, id uint64, need int64) int64 {
	live := make([]Lease, 0, len(held))
	for _, l := range held {
		if l.Expires > now && l.ID != id {
			live = append(live, l)
		}
	}
	slices.SortFunc(live, func(a, b Lease) int {
		switch {
		case a.Expires < b.Expires:
			return -1
		case a.Expires > b.Expires:
			return 1
		}
		return 0
	})
	hint := int64(RetryHint / time.Microsecond)
	freed := int64(0)
	for _, l := range live {
		if freed += l.Slots; freed >= need {
			return min(hint, l.Expires-now)
		}
	}
	return hint // a limit lowered below what is held: no expiry alone makes room soon
}

// Release gives back the lease id of *s (nothing if it is not held) and reports whether it was
// held and unexpired at now.
func Release(s *State, now int64, id uint64) bool {
	if s.Alg != Concurrency {
		return false
	}
	i := slices.IndexFunc(s.Leases, func(l Lease) bool { return l.ID == id })
	if i < 0 {
		return false
	}
	live := s.Leases[i].Expires > now
	next := make([]Lease, 0, len(s.Leases)-1)
	next = append(next, s.Leases[:i]...)
	s.Leases = append(next, s.Leases[i+1:]...)
	return live
}

// Renew extends the leases ids of *s held at now to expire p.Period after now, and returns how
// many it renewed. An expired lease is not renewed: its slots may have been taken meanwhile.
func Renew(p *Policy, s *State, now int64, ids ...uint64) int {
	if s.Alg != Concurrency {
		return 0
	}
	n := 0
	var next []Lease
	for i, l := range s.Leases {
		if l.Expires > now && slices.Contains(ids, l.ID) {
			if next == nil {
				next = slices.Clone(s.Leases)
			}
			next[i].Expires = now + p.PeriodMicros()
			n++
		}
	}
	if next != nil {
		s.Leases = next
	}
	return n
}

// LastExpiry is when the last lease of *s expires (µs), or 0 if it holds none.
func LastExpiry(s *State) int64 {
	last := int64(0)
	if s.Alg == Concurrency {
		for _, l := range s.Leases {
			last = max(last, l.Expires)
		}
	}
	return last
}
