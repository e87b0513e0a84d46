package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Limiter applies one policy to many keys (clients) on a store, or a policy given with each call
// (AllowPolicy, AllowAll). It is safe for concurrent use.
type Limiter struct {
	store   Store         // the store, wrapped in a guard unless it is Infallible
	policy  Policy        // the zero Policy (Algorithm 0) for a Limiter made by New
	fixed   Store         // what Allow and AllowN decide on: store, or for New's Limiter noPolicy
	checker PolicyChecker // the store's, if it cannot take every policy
	sleep   func(ctx context.Context, d time.Duration) error
	guard   *guard // nil for an Infallible store
	config  guard  // what the options set, copied into guard by NewLimiter
}

// Infallible is implemented by stores that never fail with ErrStoreUnavailable (the memory
// store). A Limiter calls them directly: no breaker, no failure mode — and so a call small enough
// for the compiler to inline, which on the memory store's hot path is a tenth of a decision.
type Infallible interface {
	Store
	Infallible()
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
	// WithLocalFallback, WithFleetFallback), with Decision.Fallback = FallbackLocal.
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
// For FailLocal use WithLocalFallback or WithFleetFallback.
func WithFailureMode(m FailureMode) Option { return func(l *Limiter) { l.config.mode = m } }

// WithLocalFallback makes the limiter fail to local: while the store is unavailable it decides
// on local (e.g. memory.New()) with the policy's limit and burst multiplied by share, rounded down
// but at least 1 (a burst of 0 stays 0) — a conservative per-instance limit: with n instances,
// a share of 1/n keeps the total near the policy. share must be in (0, 1].
func WithLocalFallback(local Store, share float64) Option {
	return func(l *Limiter) {
		l.config.mode, l.config.local, l.config.share, l.config.size = FailLocal, local, share, nil
	}
}

// WithFleetFallback makes the limiter fail to local like WithLocalFallback, with a share that
// follows the number of instances: while the store is unavailable it decides on local with the
// policy's limit and burst divided by size(), rounded down but at least 1 (a burst of 0 stays 0).
// size is asked at every decision of the fallback, so it must be cheap (an atomic load): e.g. a
// Redis store's instance registry, (*redis.Fleet).Size, the live count it last saw. A size below
// 1 counts as 1.
func WithFleetFallback(local Store, size func() int) Option {
	return func(l *Limiter) { l.config.mode, l.config.local, l.config.size = FailLocal, local, size }
}

// WithBreaker sets the breaker: after threshold consecutive store failures, decisions skip the
// store for cooldown, then one probes it. Defaults: DefaultBreakerThreshold, DefaultBreakerCooldown.
func WithBreaker(threshold int, cooldown time.Duration) Option {
	return func(l *Limiter) {
		l.config.breaker.threshold, l.config.breaker.cooldown = int32(threshold), int64(cooldown)
	}
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
// ("token-bucket/5/1s/20", "fixed-window/10000/day@Europe/Berlin/0"), so that unnamed policies
// on one store never share state.
func NewLimiter(store Store, policy Policy, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("sluice: NewLimiter: store is nil (use memory.New() for an in-process store)")
	}
	if err := policy.Validate(); err != nil {
		return nil, err
	}
	if policy.Name == "" {
		policy.Name = policyName(&policy)
	}
	if pc, ok := store.(PolicyChecker); ok {
		if err := pc.CheckPolicy(policy); err != nil {
			return nil, err
		}
	}
	return newLimiter("NewLimiter", store, policy, opts)
}

// newLimiter is NewLimiter, or New (policy the zero Policy), past the policy's checks; fn names
// which in errors.
func newLimiter(fn string, store Store, policy Policy, opts []Option) (*Limiter, error) {
	l := &Limiter{store: store, policy: policy, sleep: sleepCtx}
	l.checker, _ = store.(PolicyChecker)
	l.config.breaker.threshold, l.config.breaker.cooldown = DefaultBreakerThreshold, int64(DefaultBreakerCooldown)
	for _, o := range opts {
		o(l)
	}
	g := &l.config
	if g.breaker.threshold < 1 || g.breaker.cooldown <= 0 {
		return nil, fmt.Errorf("sluice: %s: breaker threshold %d must be ≥ 1 and cooldown %v > 0", fn, g.breaker.threshold, time.Duration(g.breaker.cooldown))
	}
	if g.mode > FailLocal {
		return nil, fmt.Errorf("sluice: %s: unknown failure mode %d", fn, uint8(g.mode))
	}
	if g.mode == FailLocal {
		if g.local == nil {
			return nil, fmt.Errorf("sluice: %s: FailLocal needs WithLocalFallback(memory.New(), share) or WithFleetFallback", fn)
		}
		if g.size != nil {
			g.share = 1 // (not used: size decides)
		}
		if !(g.share > 0 && g.share <= 1) {
			return nil, fmt.Errorf("sluice: %s: local share %v must be in (0, 1]", fn, g.share)
		}
	}
	if _, ok := store.(Infallible); !ok {
		l.guard = newGuard(store, g)
		l.store = l.guard
	}
	l.fixed = l.store
	if policy.Algorithm == 0 {
		l.fixed = noPolicy{}
	}
	return l, nil
}

// Store returns the store l decides on: guarded by l's failure mode (unless it is Infallible), so
// that deciding on it directly (DecideAll, say) fails the way l's own decisions do.
func (l *Limiter) Store() Store { return l.store }

// Policy returns the limiter's policy (with its Name filled in); the zero Policy for a Limiter
// made by New.
func (l *Limiter) Policy() Policy { return l.policy }

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.fixed.Decide(ctx, key, l.policy, 1)
}

// AllowN decides a request of cost on key now, and consumes cost from the key's quota if (and
// only if) it is approved. A cost of 0 peeks: it reports the decision and consumes nothing.
// An approved leaky-bucket request carries a Delay: serve it only after that long.
//
// When the store cannot decide, the failure mode applies (WithFailureMode, WithLocalFallback);
// an error of the caller's own context is returned as it is. A Limiter made by New returns
// ErrNoPolicy (see AllowPolicy).
func (l *Limiter) AllowN(ctx context.Context, key string, cost int64) (Decision, error) {
	return l.fixed.Decide(ctx, key, l.policy, cost)
}

// AllowNWithin is AllowN for a caller that holds an approved leaky-bucket request for at most
// maxDelay (a proxy or middleware; ≤ 0: no hold at all): a request that would be held longer is
// refused and consumes nothing, with a RetryAfter until its hold would be maxDelay. For the other
// algorithms it is AllowN.
func (l *Limiter) AllowNWithin(ctx context.Context, key string, cost int64, maxDelay time.Duration) (Decision, error) {
	if l.policy.Algorithm != LeakyBucket {
		return l.AllowN(ctx, key, cost)
	}
	if maxDelay <= 0 {
		maxDelay = NoDelay
	}
	var out [1]Decision
	_, err := l.fixed.DecideAll(ctx, key, []Limit{{Policy: l.policy, Cost: cost, MaxDelay: maxDelay}}, out[:])
	return out[0], err
}

// StoreAvailable reports whether decisions currently go to the store (false while the breaker is
// open after repeated failures; always true for an Infallible store).
func (l *Limiter) StoreAvailable() bool { return l.guard == nil || !l.guard.breaker.open() }

// Wait is shorthand for WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until a request of cost on key is approved (and, for the leaky bucket, its Delay
// has passed), or ctx ends. It retries exactly when a refusal's RetryAfter says, so it never asks
// the store in a loop. It returns an error wrapping ErrCostExceedsLimit at once for a cost that can
// never fit, and ErrWaitExceedsDeadline at once if ctx's deadline comes first. A leaky-bucket slot
// is consumed when approved: if ctx ends during its Delay, the slot is spent and ctx.Err() returned.
func (l *Limiter) WaitN(ctx context.Context, key string, cost int64) error {
	if l.policy.Algorithm == 0 {
		return ErrNoPolicy
	}
	return l.wait(ctx, key, l.policy, cost)
}

// wait is WaitN under p, a checked policy.
func (l *Limiter) wait(ctx context.Context, key string, p Policy, cost int64) error {
	for {
		d, err := l.store.Decide(ctx, key, p, cost)
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
