package gateway

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/decision"
)

// exactRefusal reports whether every policy that refused v says exactly when to retry: a
// concurrency policy's Retry-After is a hint (a slot frees when a request ends), so a client back
// before it made no mistake, and is not counted as an early retry.
func exactRefusal(req *decision.Request, v *decision.Verdict) bool {
	for _, a := range v.Refusing(req) {
		if !algorithm.IsExact(&a.Policy) {
			return false
		}
	}
	return true
}

// The store wrappers pass a concurrency policy's releases and renewals on (sluice.Leaser), so
// that the decision layer's ReleaseSlots and Renewer reach the store under them.

func (w *watchedStore) Release(ctx context.Context, key string, p sluice.Policy, id uint64) error {
	return release(w.Store, ctx, key, p, id)
}

func (w *watchedStore) Renew(ctx context.Context, key string, p sluice.Policy, ids ...uint64) error {
	return renew(w.Store, ctx, key, p, ids)
}

func (t tracedStore) Release(ctx context.Context, key string, p sluice.Policy, id uint64) error {
	return release(t.Store, ctx, key, p, id)
}

func (t tracedStore) Renew(ctx context.Context, key string, p sluice.Policy, ids ...uint64) error {
	return renew(t.Store, ctx, key, p, ids)
}

func release(s sluice.Store, ctx context.Context, key string, p sluice.Policy, id uint64) error {
	l, ok := s.(sluice.Leaser)
	if !ok {
		return sluice.CheckConcurrency(s)
	}
	return l.Release(ctx, key, p, id)
}

func renew(s sluice.Store, ctx context.Context, key string, p sluice.Policy, ids []uint64) error {
	l, ok := s.(sluice.Leaser)
	if !ok {
		return sluice.CheckConcurrency(s)
	}
	return l.Renew(ctx, key, p, ids...)
}
