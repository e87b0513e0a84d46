package gateway

import (
	"context"

	"github.com/sluicehq/sluice"
)

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
