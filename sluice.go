// Package sluice is a rate limiter whose decisions are exact and the same on every store:
// in process (store/memory), or shared by many instances in Redis (store/redis).
//
//	policy := sluice.Policy{Name: "orders-api", Algorithm: sluice.TokenBucket,
//		Limit: 5, Period: time.Second, Burst: 20}
//	lim, err := sluice.NewLimiter(memory.New(), policy)
//	d, err := lim.Allow(ctx, "customer-42")
//
// The algorithms themselves live in package algorithm, a pure core with no clock and no I/O;
// this package re-exports its types so that callers need only one import.
package sluice

import (
	"context"
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
}
