package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter applies one policy to many keys (clients) on a store. It is safe for concurrent use.
type Limiter struct {
	store  Store
	policy Policy
	sleep  func(ctx context.Context, d time.Duration) error
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
	l := &Limiter{store: store, policy: policy, sleep: sleepCtx}
	for _, o := range opts {
		o(l)
	}
	return l, nil
}

// Policy returns the limiter's policy (with its Name filled in).
func (l *Limiter) Policy() Policy { return l.policy }

// Allow is shorthand for AllowN(ctx, key, 1). (It calls the store itself rather than AllowN:
// each extra hop that passes a Decision on costs a copy with store-forwarding stalls.)
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.store.Decide(ctx, key, l.policy, 1)
}

// AllowN decides a request of cost on key now, and consumes cost from the key's quota if (and
// only if) it is approved. A cost of 0 peeks: it reports the decision and consumes nothing.
// An approved leaky-bucket request carries a Delay: serve it only after that long.
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.store.Decide(ctx, key, l.policy, cost)
}

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
