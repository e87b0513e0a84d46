package sluice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/sluicehq/sluice/algorithm"
)

// Concurrency is the algorithm of a concurrency limit: at most Limit requests of a key in flight
// at once, across every instance on the store; Period is a slot's lease, how long it is held
// without renewal. It is not one of the five rate algorithms (algorithm.Algorithms).
//
// A request takes its slots in DecideAll, all or nothing with the request's other limits, under
// the lease ID in its Limit.Lease (NewLeaseID): a rate limit's refusal takes no slot, and a
// concurrency refusal consumes nothing from the rate limits. Cost is the number of slots (0
// peeks). The caller gives the slots back with Leaser.Release when the response ends, and while
// the request is in flight renews its lease with Leaser.Renew, well within the lease time; the
// slots of a caller that died (or never releases) come back when their lease expires. A refusal's
// RetryAfter is a hint (a slot may free at any moment), at most algorithm.RetryHint, so no
// refusal of a concurrency limit is cached (algorithm.IsExact). Decide, which takes no lease,
// only peeks: a cost > 0 fails with ErrNoLease.
const Concurrency = algorithm.Concurrency

// ErrNoLease: a concurrency policy was asked for slots without a lease ID (Decide, or a Limit
// whose Lease is 0).
var ErrNoLease = algorithm.ErrNoLease

// Leaser is implemented by stores that take concurrency policies (both of sluice's): slots are
// taken by DecideAll, under each Limit's Lease, and given back or renewed here. Stores that do not
// implement it refuse concurrency policies (CheckConcurrency).
//
// Release gives back the slots of lease id of key under p (p.Name names the state, as in
// DecideAll); releasing a lease not held (expired, released already, or never taken) does
// nothing. Renew extends each lease of ids still held to expire p.Period from now; an expired
// one is not renewed (its slots may be taken by now). Both fail, wrapping ErrStoreUnavailable,
// only when the store could not be reached; a lease then expires on its own.
type Leaser interface {
	Release(ctx context.Context, key string, p Policy, id uint64) error
	Renew(ctx context.Context, key string, p Policy, ids ...uint64) error
}

// NewLeaseID returns a random lease ID, never 0. IDs need only be unique among a key's leases
// in flight: 64 random bits are.
func NewLeaseID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// CheckConcurrency reports whether store can take concurrency policies: nil, or an error naming
// the store's type.
func CheckConcurrency(store Store) error {
	if _, ok := store.(Leaser); ok {
		return nil
	}
	return fmt.Errorf("%w: the store (%T) does not take concurrency policies (it does not implement sluice.Leaser)", ErrInvalidPolicy, store)
}

// Release implements Leaser: on the store and, if the guard fails to local, on the local store
// too (a slot taken while the store was down was taken there; releasing one not held does
// nothing).
func (g *guard) Release(ctx context.Context, key string, p Policy, id uint64) error {
	return g.lease(ctx, p, true, func(l Leaser, p Policy) error { return l.Release(ctx, key, p, id) })
}

// Renew implements Leaser as Release does (a renewal of no lease sends nothing).
func (g *guard) Renew(ctx context.Context, key string, p Policy, ids ...uint64) error {
	return g.lease(ctx, p, len(ids) > 0, func(l Leaser, p Policy) error { return l.Renew(ctx, key, p, ids...) })
}

// lease is Release and Renew: do on the local store under its share of p if the guard fails to
// local, then on the store if the breaker admits the call (it may be the probe: a release that
// answers is a round trip like a decision's), feeding the breaker by the guard's one health rule
// (sends: whether the call sends anything); the errors of both, joined.
func (g *guard) lease(ctx context.Context, p Policy, sends bool, do func(l Leaser, p Policy) error) error {
	var errLocal error
	if g.mode == FailLocal {
		if l, ok := g.local.(Leaser); ok {
			errLocal = do(l, g.localPolicy(p))
		}
	}
	l, ok := g.store.(Leaser)
	if !ok {
		return errors.Join(CheckConcurrency(g.store), errLocal)
	}
	ok, probe := g.breaker.admit()
	if !ok {
		return errors.Join(errBreakerOpen, errLocal)
	}
	err := do(l, p)
	g.account(ctx, err, sends, probe)
	return errors.Join(err, errLocal)
}

// Release implements Leaser: concurrency policies take no budget (LocalBudget.Validate), so
// their slots are the wrapped store's.
func (s *BudgetStore) Release(ctx context.Context, key string, p Policy, id uint64) error {
	l, ok := s.store.(Leaser)
	if !ok {
		return CheckConcurrency(s.store)
	}
	return l.Release(ctx, key, p, id)
}

// Renew implements Leaser, as Release.
func (s *BudgetStore) Renew(ctx context.Context, key string, p Policy, ids ...uint64) error {
	l, ok := s.store.(Leaser)
	if !ok {
		return CheckConcurrency(s.store)
	}
	return l.Renew(ctx, key, p, ids...)
}

// checkConcurrency is CheckPolicy's question for a wrapper of store: a concurrency policy needs a
// Leaser under it.
func checkConcurrency(store Store, p Policy) error {
	if p.Algorithm != Concurrency {
		return nil
	}
	return CheckConcurrency(store)
}
