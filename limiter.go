package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter applies one policy to many keys (clients) on a store. It is safe for concurrent use.
type Limiter struct {
	store   Store
	policy  Policy
	sleep   func(ctx context.Context, d time.Duration) error
	mode    FailureMode
	local   Store   // FailLocal: the in-process store
	share   float64 // FailLocal: this instance's share of the limit
	localP  Policy  // FailLocal: policy with limit and burst × share
	breaker breaker
}

// FailureMode says what a Limiter does when its store cannot decide (an error wrapping
// ErrStoreUnavailable: a timeout, a lost connection, or the breaker open after repeated failures).
type FailureMode uint8

const (
	// FailClosed refuses: AllowN returns an error wrapping ErrStoreUnavailable (not a quota
	// refusal: Allowed is false and RetryAfter 0). The default.
	FailClosed FailureMode = iota
	// FailOpen allows, with Decision.Fallback = FallbackOpen so that callers can count it.
	FailOpen
	// FailLocal decides on an in-process store with this instance's share of the policy (see
	// WithLocalFallback), with Decision.Fallback = FallbackLocal.
	FailLocal
)

func (m FailureMode) String() string {
	switch m {
	case FailClosed:
		return "fail-closed"
	case FailOpen:
		return "fail-open"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// WithFailureMode sets what happens when the store fails: FailClosed (the default) or FailOpen.
// For FailLocal use WithLocalFallback.
func WithFailureMode(m FailureMode) Option { return func(l *Limiter) { l.mode = m } }

// WithLocalFallback makes the limiter fail to local: while the store is unavailable it decides
// on local (e.g. memory.New()) with the policy's limit and burst multiplied by share, rounded down
// but at least 1 (a burst of 0 stays 0) — a conservative per-instance limit: with n instances,
// a share of 1/n keeps the total near the policy. share must be in (0, 1].
func WithLocalFallback(local Store, share float64) Option {
	return func(l *Limiter) { l.mode, l.local, l.share = FailLocal, local, share }
}

// WithBreaker sets the breaker: after threshold consecutive store failures, decisions skip the
// store for cooldown, then one probes it. Defaults: DefaultBreakerThreshold, DefaultBreakerCooldown.
func WithBreaker(threshold int, cooldown time.Duration) Option {
	return func(l *Limiter) { l.breaker.threshold, l.breaker.cooldown = int32(threshold), int64(cooldown) }
}

// Option configures a Limiter.
type Option func(*Limiter)

// WithSleep replaces how Wait waits (by default a timer that honours the context). Tests and
// simulations pass one that advances a virtual clock.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(l *Limiter) { l.sleep = sleep }
}

// ErrWaitExceedsDeadline is returned by Wait when the context's deadline comes before the request
// could be approved; Wait then returns at once instead of sleeping in vain.
var ErrWaitExceedsDeadline = errors.New("sluice: wait would exceed the context deadline")

// NewLimiter returns a Limiter of policy on store. It returns an error wrapping ErrInvalidPolicy,
// naming the field, if the policy is invalid. A policy without a Name is named after its numbers
// ("token-bucket/5/1s/20"), so that unnamed policies on one store never share state.
func NewLimiter(store Store, policy Policy, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("sluice: NewLimiter: store is nil (use memory.New() for an in-process store)")
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if policy.Name == "" {
		policy.Name = fmt.Sprintf("%v/%d/%v/%d", policy.Algorithm, policy.Limit, policy.Period, policy.Burst)
	}
	if pc, ok := store.(PolicyChecker); ok {
		if err := pc.CheckPolicy(policy); err != nil {
			return nil, err
		}
	}
	l := &Limiter{store: store, policy: policy, sleep: sleepCtx}
	l.breaker.threshold, l.breaker.cooldown = DefaultBreakerThreshold, int64(DefaultBreakerCooldown)
	for _, o := range opts {
		o(l)
	}
	if l.breaker.threshold < 1 || l.breaker.cooldown <= 0 {
		return nil, fmt.Errorf("sluice: NewLimiter: breaker threshold %d must be ≥ 1 and cooldown %v > 0", l.breaker.threshold, time.Duration(l.breaker.cooldown))
	}
	if l.mode > FailLocal {
		return nil, fmt.Errorf("sluice: NewLimiter: unknown failure mode %d", uint8(l.mode))
	}
	if l.mode == FailLocal {
		if l.local == nil {
			return nil, errors.New("sluice: NewLimiter: FailLocal needs WithLocalFallback(memory.New(), share)")
		}
		if !(l.share > 0 && l.share <= 1) {
			return nil, fmt.Errorf("sluice: NewLimiter: local share %v must be in (0, 1]", l.share)
		}
		l.localP = policy
		l.localP.Limit = max(1, int64(float64(policy.Limit)*l.share))
		if policy.Burst > 0 {
			l.localP.Burst = max(1, int64(float64(policy.Burst)*l.share))
		}
	}
	return l, nil
}

// Policy returns the limiter's policy (with its Name filled in).
func (l *Limiter) Policy() Policy { return l.policy }

// Allow is shorthand for AllowN(ctx, key, 1). (It calls the store itself rather than AllowN:
// each extra hop that passes a Decision on costs a copy with store-forwarding stalls.)
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	if !l.breaker.ready() {
		return l.fallback(ctx, key, 1, errBreakerOpen)
	}
	d, err := l.store.Decide(ctx, key, l.policy, 1)
	if err != nil {
		return l.failed(ctx, key, 1, d, err)
	}
	if !d.Cached { // a cached answer says nothing of the store's health
		l.breaker.success()
	}
	return d, nil
}

// AllowN decides a request of cost on key now, and consumes cost from the key's quota if (and
// only if) it is approved. A cost of 0 peeks: it reports the decision and consumes nothing.
// An approved leaky-bucket request carries a Delay: serve it only after that long.
//
// When the store cannot decide, the failure mode applies (WithFailureMode, WithLocalFallback);
// an error of the caller's own context is returned as it is.
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	if !l.breaker.ready() {
		return l.fallback(ctx, key, cost, errBreakerOpen)
	}
	d, err := l.store.Decide(ctx, key, l.policy, cost)
	if err != nil {
		return l.failed(ctx, key, cost, d, err)
	}
	if !d.Cached { // a cached answer says nothing of the store's health
		l.breaker.success()
	}
	return d, nil
}

var errBreakerOpen = fmt.Errorf("%w: breaker open after repeated store failures", ErrStoreUnavailable)

// failed handles an error from the store: a store failure feeds the breaker and falls back;
// anything else (a cost that never fits, the caller's context ending) is the caller's answer.
func (l *Limiter) failed(ctx context.Context, key string, cost int64, d Decision, err error) (Decision, error) {
	if !errors.Is(err, ErrStoreUnavailable) {
		if errors.Is(err, ErrCostExceedsLimit) || errors.Is(err, ErrInvalidCost) || errors.Is(err, ErrInvalidPolicy) {
			l.breaker.success() // the store answered
		}
		return d, err
	}
	if ctx.Err() != nil {
		return Decision{Limit: l.policy.Capacity()}, ctx.Err() // the caller gave up: not the store's failure
	}
	l.breaker.failure()
	return l.fallback(ctx, key, cost, err)
}

// fallback decides without the store, by the failure mode.
func (l *Limiter) fallback(ctx context.Context, key string, cost int64, cause error) (Decision, error) {
	switch l.mode {
	case FailOpen:
		return Decision{Allowed: true, Limit: l.policy.Capacity(), Remaining: max(0, l.policy.Capacity()-cost), Fallback: FallbackOpen}, nil
	case FailLocal:
		d, err := l.local.Decide(ctx, key, l.localP, cost)
		d.Fallback = FallbackLocal
		return d, err
	}
	return Decision{Limit: l.policy.Capacity()}, cause
}

// StoreAvailable reports whether decisions currently go to the store (false while the breaker is
// open after repeated failures).
func (l *Limiter) StoreAvailable() bool { return !l.breaker.open() }

// Wait is shorthand for WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until a request of cost on key is approved (and, for the leaky bucket, its Delay
// has passed), or ctx ends. It retries exactly when a refusal's RetryAfter says, so it never asks
// the store in a loop. It returns an error wrapping ErrCostExceedsLimit at once for a cost that can
// never fit, and ErrWaitExceedsDeadline at once if ctx's deadline comes first. A leaky-bucket slot
// is consumed when approved: if ctx ends during its Delay, the slot is spent and ctx.Err() returned.
func (l *Limiter) WaitN(ctx context.Context, key string, cost int64) error {
	for {
		d, err := l.AllowN(ctx, key, cost)
		if err != nil {
			return err
		}
		if d.Allowed {
			if d.Delay > 0 {
				return l.sleep(ctx, d.Delay)
			}
			return nil
		}
		if err := l.sleep(ctx, d.RetryAfter); err != nil {
			return err
		}
	}
}

// sleepCtx waits d on a timer, or returns early when ctx ends or its deadline is too soon.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return fmt.Errorf("%w (needs %v)", ErrWaitExceedsDeadline, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
