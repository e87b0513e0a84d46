package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// guard wraps a store that can fail (Redis) with a breaker and a failure mode. A Limiter puts one
// around every store that is not Infallible.
type guard struct {
	store   Store
	mode    FailureMode
	local   Store      // FailLocal: the in-process store
	share   float64    // FailLocal: this instance's share of a policy
	size    func() int // FailLocal, if set instead of share: the instances that share a policy
	breaker breaker
}

// Guard wraps store with the breaker and the failure mode that opts set (WithFailureMode,
// WithLocalFallback, WithFleetFallback, WithBreaker), as NewLimiter does for every store that is not Infallible:
// for callers that use a store directly, such as the gateway's DecideAll. An Infallible store is
// returned as it is. The result implements Available.
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

func newGuard(store Store, config *guard) *guard {
	g := &guard{store: store, mode: config.mode, local: config.local, share: config.share, size: config.size}
	g.breaker.threshold, g.breaker.cooldown = config.breaker.threshold, config.breaker.cooldown
	return g
}

var errBreakerOpen = fmt.Errorf("%w: breaker open after repeated store failures", ErrStoreUnavailable)

// Decide implements Store: the store while the breaker lets it, else (and when the store fails)
// the failure mode.
func (g *guard) Decide(ctx context.Context, key string, p Policy, cost int64) (Decision, error) {
	if !g.breaker.ready() {
		return g.fallback(ctx, key, p, cost, errBreakerOpen)
	}
	d, err := g.store.Decide(ctx, key, p, cost)
	if err != nil {
		if g.storeFailed(ctx, err) {
			return g.fallback(ctx, key, p, cost, err)
		}
		return d, err
	}
	if !d.Cached() { // a cached answer says nothing of the store's health
		g.breaker.success()
	}
	return d, nil
}

// DecideAll implements Store like Decide, all or nothing in the fallback too.
func (g *guard) DecideAll(ctx context.Context, key string, limits []Limit, out []Decision) (bool, error) {
	if !g.breaker.ready() {
		return g.fallbackAll(ctx, key, limits, out, errBreakerOpen)
	}
	ok, err := g.store.DecideAll(ctx, key, limits, out)
	if err != nil {
		if g.storeFailed(ctx, err) {
			return g.fallbackAll(ctx, key, limits, out, err)
		}
		return ok, err
	}
	g.breaker.success()
	return ok, nil
}

// storeFailed reports whether err is the store's failure, feeding the breaker; other errors (a
// cost that never fits, the caller's context ending) are the caller's answer.
func (g *guard) storeFailed(ctx context.Context, err error) bool {
	if !errors.Is(err, ErrStoreUnavailable) {
		g.breaker.success() // the store answered
		return false
	}
	if ctx.Err() != nil {
		g.breaker.abandon() // the caller gave up: not the store's failure, nor an answer of its health
		return false
	}
	g.breaker.failure()
	return true
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
