package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// guard wraps a store that can fail (Redis) with a breaker and a failure mode. A Limiter puts one
// around every store that is not Infallible.
//
// THE STORE'S HEALTH. One rule (account) says what every call through the guard — Decide,
// DecideAll, Settle, and a lease's Release and Renew — tells of the store's health, and only it
// feeds the breaker and the count of store errors:
//
//   - a round trip to the store that answered is a success: a decision of the store's backend
//     (Decision.Source FromStore), a settlement or lease call that returned nil after a call, or
//     an error wrapping ErrUnconfirmed (the store applied the change; replicas did not confirm it);
//   - ErrStoreUnavailable while the caller still waits is a failure (a timeout, a lost
//     connection, Redis not connected), answered by the failure mode — unless the error also
//     wraps ErrStoreSlow: the call got no reply in time but the store is not known to be down
//     (the Redis store says so until Redis has answered nothing for its SlowTimeout), which the
//     failure mode answers and the breaker does not count, as neutral below. A healthy store on
//     a busy machine answers late; only one that answers nothing opens the breaker;
//   - anything else is neutral: a refusal from the negative cache (FromCache), a unit spent from
//     a local budget (FromBudget), an error of a check made before any call (a cost over the
//     limit, an invalid policy: any client can send one), a call the caller gave up on, a call
//     that sent nothing (a settlement of reserved == actual, a renewal of no lease). It neither
//     closes nor opens the breaker; a neutral probe is handed back, so the next call probes.
//
// So answers the store never gave cannot hold the breaker closed while the store is dead, and the
// breaker opens after its threshold of consecutive failures whatever else is answered meanwhile.
type guard struct {
	store   Store
	mode    FailureMode
	local   Store      // FailLocal: the in-process store
	share   float64    // FailLocal: this instance's share of a policy
	size    func() int // FailLocal, if set instead of share: the instances that share a policy
	breaker breaker
	errors  atomic.Uint64 // the calls that failed (account's failures, the slow ones included)
}

// Guard wraps store with the breaker and the failure mode that opts set (WithFailureMode,
// WithLocalFallback, WithFleetFallback, WithBreaker), as NewLimiter does for every store that is not Infallible:
// for callers that use a store directly, such as the gateway's DecideAll. An Infallible store is
// returned as it is. The result implements Available and StoreErrors.
func Guard(store Store, opts ...Option) (Store, error) {
	l, err := NewLimiter(store, Policy{Name: "guard", Algorithm: FixedWindow, Limit: 1, Period: time.Millisecond}, opts...)
	if err != nil {
		return nil, err
	}
	return l.store, nil
}

// Available is implemented by a guarded store: false while its breaker keeps decisions off the
// store after repeated failures.
type Available interface {
	Available() bool
}

// Available reports whether decisions go to the store.
func (g *guard) Available() bool { return !g.breaker.open() }

// StoreErrors is implemented by a guarded store (Guard): the calls to the store that failed
// since it was guarded — ErrStoreUnavailable while the caller still waited: a timeout, a lost
// connection, Redis not connected; the slow ones (ErrStoreSlow) too, which the breaker does not
// count — whatever the failure mode then answered (fail-open and local fallbacks included).
// Calls the open breaker kept off the store are not counted: they were not made.
type StoreErrors interface {
	StoreErrors() uint64
}

// StoreErrors reports how many calls to the store failed.
func (g *guard) StoreErrors() uint64 { return g.errors.Load() }

func newGuard(store Store, config *guard) *guard {
	g := &guard{store: store, mode: config.mode, local: config.local, share: config.share, size: config.size}
	g.breaker.threshold, g.breaker.cooldown = config.breaker.threshold, config.breaker.cooldown
	return g
}

var errBreakerOpen = fmt.Errorf("%w: breaker open after repeated store failures", ErrStoreUnavailable)

// account is the one health rule (see guard): it feeds the breaker with what a call that the
// breaker admitted (probe: as its probe) told of the store, and reports whether the call failed
// — ErrStoreUnavailable while ctx is alive, so that the failure mode decides; a slow store's
// (ErrStoreSlow) is neutral to the breaker. roundTrip says whether a nil error came from a round
// trip to the store (a decision of its backend, a call that was sent).
func (g *guard) account(ctx context.Context, err error, roundTrip, probe bool) (failed bool) {
	switch {
	case err == nil && roundTrip, errors.Is(err, ErrUnconfirmed):
		g.breaker.success()
	case errors.Is(err, ErrStoreUnavailable) && ctx.Err() == nil:
		g.errors.Add(1)
		switch {
		case !errors.Is(err, ErrStoreSlow):
			g.breaker.failure()
		case probe:
			g.breaker.abandon() // slow: it told nothing of whether the store is down
		}
		return true
	case probe:
		g.breaker.abandon() // neutral: it told nothing of the store's health
	}
	return false
}

// Decide implements Store: the store while the breaker lets it, else (and when the store fails)
// the failure mode.
func (g *guard) Decide(ctx context.Context, key string, p Policy, cost int64) (Decision, error) {
	ok, probe := g.breaker.admit()
	if !ok {
		return g.fallback(ctx, key, p, cost, errBreakerOpen)
	}
	d, err := g.store.Decide(ctx, key, p, cost)
	if g.account(ctx, err, d.Source == FromStore, probe) {
		return g.fallback(ctx, key, p, cost, err)
	}
	return d, err
}

// DecideAll implements Store like Decide, all or nothing in the fallback too. The call made a
// round trip if any of its decisions is the store backend's.
func (g *guard) DecideAll(ctx context.Context, key string, limits []Limit, out []Decision) (bool, error) {
	ok, probe := g.breaker.admit()
	if !ok {
		return g.fallbackAll(ctx, key, limits, out, errBreakerOpen)
	}
	all, err := g.store.DecideAll(ctx, key, limits, out)
	if g.account(ctx, err, fromStore(out), probe) {
		return g.fallbackAll(ctx, key, limits, out, err)
	}
	return all, err
}

// fromStore reports whether any of ds is the store backend's answer.
func fromStore(ds []Decision) bool {
	for i := range ds {
		if ds[i].Source == FromStore {
			return true
		}
	}
	return false
}

// fallback decides without the store, by the failure mode.
func (g *guard) fallback(ctx context.Context, key string, p Policy, cost int64, cause error) (Decision, error) {
	switch g.mode {
	case FailOpen:
		return Decision{Allowed: true, Limit: p.Capacity(), Remaining: max(0, p.Capacity()-cost), Fallback: FallbackOpen}, nil
	case FailLocal:
		d, err := g.local.Decide(ctx, key, g.localPolicy(p), cost)
		d.Fallback = FallbackLocal
		return d, err
	}
	if ctx.Err() != nil {
		cause = ctx.Err()
	}
	return Decision{Limit: p.Capacity()}, cause
}

func (g *guard) fallbackAll(ctx context.Context, key string, limits []Limit, out []Decision, cause error) (bool, error) {
	switch g.mode {
	case FailOpen:
		for i, l := range limits {
			out[i] = Decision{Allowed: true, Limit: l.Policy.Capacity(), Remaining: max(0, l.Policy.Capacity()-l.Cost), Fallback: FallbackOpen}
		}
		return true, nil
	case FailLocal:
		local := make([]Limit, len(limits))
		for i, l := range limits {
			local[i] = l // each under its own Key still: the same keys, each with its share
			local[i].Policy = g.localPolicy(l.Policy)
		}
		ok, err := g.local.DecideAll(ctx, key, local, out)
		for i := range out {
			out[i].Fallback = FallbackLocal
		}
		return ok, err
	}
	for i, l := range limits {
		out[i] = Decision{Limit: l.Policy.Capacity()}
	}
	return false, cause
}

// localPolicy is p with its limit and burst multiplied by the local share (divided by the
// fleet's size, exactly), rounded down but at least 1 (a burst of 0 stays 0).
func (g *guard) localPolicy(p Policy) Policy {
	if g.size != nil {
		n := int64(max(1, g.size()))
		p.Limit = max(1, p.Limit/n)
		if p.Burst > 0 {
			p.Burst = max(1, p.Burst/n)
		}
		return p
	}
	p.Limit = max(1, int64(float64(p.Limit)*g.share))
	if p.Burst > 0 {
		p.Burst = max(1, int64(float64(p.Burst)*g.share))
	}
	return p
}

// CheckPolicy passes the question on to the wrapped store.
func (g *guard) CheckPolicy(p Policy) error {
	if err := checkConcurrency(g.store, p); err != nil {
		return err
	}
	if pc, ok := g.store.(PolicyChecker); ok {
		return pc.CheckPolicy(p)
	}
	return nil
}
