package storetest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// OnceStore is a store that settles, once by id too: the memory store, say.
type OnceStore interface {
	sluice.Store
	sluice.Settler
	sluice.OnceSettler
}

// SettleOutage is a store whose settlements (once by id or not) fail with
// sluice.ErrStoreUnavailable, changing nothing, while Down is set: decisions still go through.
// It stands for a store that answers decisions but not a settlement, for tests of what becomes of
// a settlement that could not land when it was made.
type SettleOutage struct {
	OnceStore
	Down atomic.Bool
}

// NewSettleOutage returns a SettleOutage on store, up.
func NewSettleOutage(store OnceStore) *SettleOutage { return &SettleOutage{OnceStore: store} }

func (o *SettleOutage) Settle(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64) error {
	if o.Down.Load() {
		return sluice.ErrStoreUnavailable
	}
	return o.OnceStore.Settle(ctx, key, p, at, reserved, actual)
}

func (o *SettleOutage) SettleOnce(ctx context.Context, key string, p sluice.Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	if o.Down.Load() {
		return sluice.ErrStoreUnavailable
	}
	return o.OnceStore.SettleOnce(ctx, key, p, at, reserved, actual, id, keep)
}
