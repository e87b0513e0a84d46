package sluice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// Per-call policies: a Limiter decides under its own policy (Allow, AllowN), or under one given
// with each call (AllowPolicy, AllowAll), as redis_rate's Allow(ctx, key, limit) does, so that one
// Limiter serves every tenant's contract, whatever it is, without a Limiter per policy. Both ways
// go through the same guarded store: the failure mode, the breaker and the local fallback apply.

// ErrNoPolicy is the error of Allow, AllowN, AllowNWithin, Wait, WaitN, Reserve and Settle on a
// Limiter made by New, which has no policy of its own.
var ErrNoPolicy = errors.New("sluice: this Limiter has no policy of its own (it was made by sluice.New): pass the policy with each call (AllowPolicy, WaitPolicy, AllowAll), or make it with NewLimiter")

// New returns a Limiter on store without a policy of its own: every call names its policy
// (AllowPolicy, WaitPolicy, AllowAll, DecideAll); Allow, AllowN, AllowNWithin, Wait, WaitN,
// Reserve and Settle return ErrNoPolicy. The options are NewLimiter's.
func New(store Store, opts ...Option) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("sluice: New: store is nil (use memory.New() for an in-process store)")
	}
	return newLimiter("New", store, Policy{}, opts)
}

// CheckPolicy returns p as l decides with it: validated (an error wrapping ErrInvalidPolicy names
// the field), checked against l's store if it cannot take every policy (PolicyChecker), and, if it
// has no Name, named after its numbers as NewLimiter names an unnamed policy
// ("token-bucket/5/1s/20", "fixed-window/10000/day/Europe/Berlin"), so that the same numbers keep
// one state however they are passed. AllowPolicy and AllowAll call it for every policy they are
// given; it does not allocate for a valid named policy, nor, mostly, for an unnamed one (the
// names of up to 1024 sets of numbers are kept; name policies that vary more than that).
func (l *Limiter) CheckPolicy(p Policy) (Policy, error) {
	if err := p.Validate(); err != nil {
		return p, err
	}
	if p.Name == "" {
		p.Name = policyName(&p)
	}
	if l.checker != nil {
		if err := l.checker.CheckPolicy(p); err != nil {
			return p, err
		}
	}
	return p, nil
}

// AllowPolicy decides a request of cost on key under p now, as AllowN does under the Limiter's own
// policy: cost is consumed only if it is approved, 0 peeks, and the failure mode applies when the
// store cannot decide. p is checked first (CheckPolicy): an invalid one returns an error wrapping
// ErrInvalidPolicy and decides nothing. Its state is kept under (key, p.Name): the state of every
// other call, here or by another Limiter on the same store, with that policy name and key.
func (l *Limiter) AllowPolicy(ctx context.Context, key string, p Policy, cost int64) (Decision, error) {
	p, err := l.CheckPolicy(p)
	if err != nil {
		return Decision{}, err
	}
	return l.store.Decide(ctx, key, p, cost)
}

// WaitPolicy is WaitN under p: it blocks until a request of cost on key is approved under p (and a
// leaky bucket's Delay has passed), or ctx ends. p is checked first, as AllowPolicy checks it.
func (l *Limiter) WaitPolicy(ctx context.Context, key string, p Policy, cost int64) error {
	p, err := l.CheckPolicy(p)
	if err != nil {
		return err
	}
	return l.wait(ctx, key, p, cost)
}

// AllowAll decides several limits of one request at once, all or nothing (see Store.DecideAll):
// "10 a second and 10,000 a day", or a client's quota and its tenant's, each limit under key or
// its own Limit.Key. The costs are consumed only if every enforced limit (not DryRun) allows;
// a refusal by one consumes nothing from the others. ok reports whether all allowed; ds[i] is
// limits[i]'s decision. Each policy is checked first (CheckPolicy), and the (key, policy name)
// pairs must be distinct: otherwise an error names the limit and nothing is decided. No limits:
// ok, with no decisions. The failure mode applies as to AllowN, all or nothing in the fallback too.
//
// AllowAll allocates ds; DecideAll decides into a slice of the caller's.
func (l *Limiter) AllowAll(ctx context.Context, key string, limits []Limit) (ok bool, ds []Decision, err error) {
	ds = make([]Decision, len(limits))
	ok, err = l.DecideAll(ctx, key, limits, ds)
	return ok, ds, err
}

// DecideAll is AllowAll into out, which must be as long as limits. It does not allocate when the
// policies are valid and named. limits is not modified.
func (l *Limiter) DecideAll(ctx context.Context, key string, limits []Limit, out []Decision) (bool, error) {
	if len(out) != len(limits) {
		return false, fmt.Errorf("sluice: DecideAll: %d decisions for %d limits (out must be as long as limits)", len(out), len(limits))
	}
	clear(out)
	if len(limits) == 0 {
		return true, nil
	}
	checked := limits
	for i := range limits {
		p, err := l.CheckPolicy(limits[i].Policy)
		if err != nil {
			return false, fmt.Errorf("sluice: limits[%d]: %w", i, err)
		}
		if p.Name != limits[i].Policy.Name { // named here: decide on a copy, the caller's unchanged
			if &checked[0] == &limits[0] {
				checked = append([]Limit(nil), limits...)
			}
			checked[i].Policy = p
		}
	}
	for i := 1; i < len(checked); i++ {
		for j := 0; j < i; j++ {
			if checked[i].Policy.Name == checked[j].Policy.Name && checked[i].EffectiveKey(key) == checked[j].EffectiveKey(key) {
				return false, fmt.Errorf("sluice: limits[%d] and limits[%d] both count policy %q under one key: each (key, policy name) may appear once", j, i, checked[i].Policy.Name)
			}
		}
	}
	return l.store.DecideAll(ctx, key, checked, out)
}

// noPolicy is the store Allow and AllowN decide on in a Limiter made by New: it refuses to,
// without a branch in their hot path.
type noPolicy struct{}

func (noPolicy) Decide(context.Context, string, Policy, int64) (Decision, error) {
	return Decision{}, ErrNoPolicy
}

func (noPolicy) DecideAll(context.Context, string, []Limit, []Decision) (bool, error) {
	return false, ErrNoPolicy
}

// policyName is the name of an unnamed policy: its numbers, formatted once per set of numbers.
func policyName(p *Policy) string {
	k := nameKey{p.Algorithm, p.Limit, p.Period, p.Burst, p.Calendar, p.Location}
	if m := names.m.Load(); m != nil {
		if n, ok := (*m)[k]; ok {
			return n
		}
	}
	n := formatName(p)
	names.mu.Lock()
	defer names.mu.Unlock()
	old := names.m.Load()
	if old == nil || len(*old) < maxNames {
		m := make(map[nameKey]string, 1+len(deref(old)))
		for k, v := range deref(old) {
			m[k] = v
		}
		m[k] = n
		names.m.Store(&m)
	}
	return n
}

// formatName names p by its numbers. A policy with a period keeps the name NewLimiter has always
// given it ("token-bucket/5/1s/20": a Redis store's state of it stays readable across versions);
// a calendar one is named by its calendar and zone, which its period (0) cannot tell apart.
func formatName(p *Policy) string {
	if p.Calendar != algorithm.NoCalendar {
		zone := "UTC"
		if p.Location != nil {
			zone = p.Location.String()
		}
		return fmt.Sprintf("%v/%d/%v/%s", p.Algorithm, p.Limit, p.Calendar, zone)
	}
	return fmt.Sprintf("%v/%d/%v/%d", p.Algorithm, p.Limit, p.Period, p.Burst)
}

// nameKey is what an unnamed policy's name says.
type nameKey struct {
	alg    Algorithm
	limit  int64
	period time.Duration
	burst  int64
	cal    algorithm.Calendar
	loc    *time.Location
}

// names caches the names of unnamed policies: read without a lock (a map replaced, never
// written, once published), written under mu, at most maxNames of them.
var names struct {
	mu sync.Mutex
	m  atomic.Pointer[map[nameKey]string]
}

const maxNames = 1024

func deref(m *map[nameKey]string) map[nameKey]string {
	if m == nil {
		return nil
	}
	return *m
}
