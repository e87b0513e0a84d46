// Package sluice is a rate limiter whose decisions are exact and the same on every store:
// in process (store/memory), or shared by many instances in Redis (store/redis).
//
//	policy := sluice.Policy{Name: "orders-api", Algorithm: sluice.TokenBucket,
//		Limit: 5, Period: time.Second, Burst: 20}
//	lim, err := sluice.NewLimiter(memory.New(), policy)
//	d, err := lim.Allow(ctx, "customer-42")
//
// Or one Limiter for every contract, each call passing its policy (several at once: all or
// nothing):
//
//	lim, err := sluice.New(store)
//	d, err := lim.AllowPolicy(ctx, "customer-42", plans[tier], 1)
//	ok, ds, err := lim.AllowAll(ctx, "customer-42", []sluice.Limit{{Policy: perSecond, Cost: 1}, {Policy: daily, Cost: 1}})
//
// The algorithms themselves live in package algorithm, a pure core with no clock and no I/O;
// this package re-exports its types so that callers need only one import.
package sluice

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// The core's types, re-exported. See package algorithm for their exact semantics.
type (
	Policy    = algorithm.Policy
	Decision  = algorithm.Decision
	Algorithm = algorithm.Algorithm
)

// The five algorithms.
const (
	FixedWindow   = algorithm.FixedWindow
	SlidingLog    = algorithm.SlidingLog
	SlidingWindow = algorithm.SlidingWindow
	TokenBucket   = algorithm.TokenBucket
	LeakyBucket   = algorithm.LeakyBucket
)

// Fallback says how a Limiter decided when its store failed; see WithFailureMode.
type Fallback = algorithm.Fallback

const (
	NoFallback    = algorithm.NoFallback
	FallbackOpen  = algorithm.FallbackOpen
	FallbackLocal = algorithm.FallbackLocal
)

// Source says where a store's answer came from; see Decision.Source.
type Source = algorithm.Source

const (
	FromStore  = algorithm.FromStore
	FromCache  = algorithm.FromCache
	FromBudget = algorithm.FromBudget
)

// Never is the RetryAfter of a request that can never be approved (a negative duration).
const Never = algorithm.Never

// Sentinel errors, for errors.Is.
var (
	// ErrCostExceedsLimit: the request's cost can never be approved under its policy.
	ErrCostExceedsLimit = algorithm.ErrCostExceedsLimit
	// ErrInvalidPolicy: a policy failed validation; the message names the field.
	ErrInvalidPolicy = algorithm.ErrInvalidPolicy
	// ErrInvalidCost: a negative cost.
	ErrInvalidCost = algorithm.ErrInvalidCost
	// ErrStoreUnavailable: the store could not decide (timeout, connection lost, breaker open).
	// Stores wrap their failures in it; a Limiter then applies its failure mode.
	ErrStoreUnavailable = errors.New("sluice: store unavailable")
	// ErrUnconfirmed: the store applied a write (a settlement, a decision's charge) but could not
	// confirm it as asked (replicas_ack: too few replicas acknowledged it in time). Unlike
	// ErrStoreUnavailable, the change was made: do not retry it.
	ErrUnconfirmed = errors.New("sluice: store change applied but not confirmed")
	// ErrStoreSlow, beside ErrStoreUnavailable in a store's error: the call got no reply in time,
	// but the store is not known to be down — it may only be slow (a busy machine schedules it
	// late). The failure mode answers the call; the breaker does not count it against the
	// store's health (guard.account). The Redis store says so until Redis has answered nothing
	// for its SlowTimeout.
	ErrStoreSlow = errors.New("sluice: store slow")
)

// ParseAlgorithm returns the algorithm named s ("fixed-window", "sliding-log", "sliding-window",
// "token-bucket", "leaky-bucket").
func ParseAlgorithm(s string) (Algorithm, error) { return algorithm.ParseAlgorithm(s) }

// Clock tells a store what time it is. Stores take one so that tests and the simulator can run
// them on a virtual clock.
type Clock interface{ Now() time.Time }

// Store keeps the state of every key and applies decisions to it atomically: concurrent Decide
// calls on one key behave as if made one after another. Implementations: store/memory, store/redis.
type Store interface {
	// Decide decides a request of cost on key under p, at the store's own clock. p must be valid
	// (Policy.Validate); a store keeps one state per (p.Name, key). Errors wrapping
	// ErrCostExceedsLimit and ErrInvalidCost come with a Decision (RetryAfter Never); other errors
	// mean the store could not decide.
	Decide(ctx context.Context, key string, p Policy, cost int64) (Decision, error)

	// DecideAll decides several limits of one request at once, all or nothing: each limit is
	// decided as if alone, at one instant, and their costs are consumed only if every enforced one
	// (not DryRun) allows, so a refusal by one consumes nothing from the others ("10 a second and
	// 10,000 a day"). A dry-run limit is decided in the same atomic step: it consumes when the
	// request is allowed and it allows, it never refuses the request, and it consumes nothing when
	// an enforced limit refuses. DecideAll fills out[i] for limits[i] and reports whether every
	// enforced limit allowed. len(out) must be len(limits).
	//
	// Each limit counts under key, or under its own Limit.Key if set: the state that a Decide
	// or DecideAll of that key under the same policy name uses, so limits of one request under
	// different keys (the client's, a header's value, a path) are decided together, all or
	// nothing across the keys. The (key, Policy.Name) pairs of one call must be distinct.
	//
	// Both stores keep this exactly, with one exception: on a Redis Cluster, limits whose keys
	// lie in different hash slots cannot be decided in one atomic script. The Redis store then
	// first decides every slot's limits without writing (one call per slot, in parallel; skipped
	// when one slot holds all the enforced limits) and answers a refusal found there with
	// nothing written anywhere; only if all allow does it commit slot by slot, the one with the
	// least quota left first, each commit deciding its limits again atomically and writing only
	// if they all still allow. No limit ever approves beyond itself. But a concurrent request
	// may spend a slot's quota between the check and that slot's commit: the request is then
	// refused, and the slots committed before it keep its cost (a refused request consumed
	// there); and a commit that fails (a timeout, a node lost) fails the call with
	// ErrStoreUnavailable, the slots committed before it keeping the cost. Each slot's limits
	// are decided at one instant of its own node's clock.
	DecideAll(ctx context.Context, key string, limits []Limit, out []Decision) (bool, error)
}

// Limit is one policy, the cost a request takes from it, and how it is applied.
type Limit struct {
	// Key, if not "", is the key this limit counts under instead of DecideAll's key: its state
	// is kept under (Key, Policy.Name), exactly the state of a Decide(ctx, Key, Policy, ...) or
	// of a DecideAll(ctx, Key, ...) limit of that policy without a Key.
	Key    string
	Policy Policy
	Cost   int64
	// MaxDelay bounds, for a leaky-bucket policy, how long an approval may hold the request:
	// one that would be held longer is refused, consuming nothing, with a RetryAfter until its
	// hold would be MaxDelay. 0 means no bound; NoDelay (any negative value) holds nothing, so
	// a request that would wait at all is refused. The other algorithms ignore it.
	MaxDelay time.Duration
	// DryRun: the limit counts but never refuses the request (see DecideAll).
	DryRun bool
	// Lease is the ID a Concurrency policy's slots are taken under (NewLeaseID; see Leaser);
	// required with a cost > 0 there (else ErrNoLease). The other algorithms ignore it.
	Lease uint64
}

// EffectiveKey is the key l counts under in a DecideAll of key: l.Key, or key if l.Key is "".
func (l *Limit) EffectiveKey(key string) string {
	if l.Key != "" {
		return l.Key
	}
	return key
}

// NoDelay is a Limit.MaxDelay that allows no hold at all.
const NoDelay time.Duration = -1

// MaxDelayMicros is l's MaxDelay as algorithm.DecideWithin takes it: µs, rounded down (a hold is
// a whole number of µs), or -1 for no bound.
func (l *Limit) MaxDelayMicros() int64 {
	switch {
	case l.MaxDelay == 0:
		return -1
	case l.MaxDelay < 0:
		return 0
	}
	return int64(l.MaxDelay / time.Microsecond)
}

// PolicyChecker is implemented by stores that cannot take every valid policy; NewLimiter asks
// them before accepting a policy. Both of sluice's stores take every policy Validate accepts
// (the Redis scripts compute exactly beyond 2^53), so neither implements it.
type PolicyChecker interface {
	CheckPolicy(p Policy) error
}
