package sluice

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/algorithm"
)

// COSTS KNOWN AFTER THE RESPONSE. A request whose real cost is known only once it has been
// served (the model tokens an upstream reports, whether a login failed) is charged an estimate
// up front and settled afterwards with the real cost (algorithm.Settle): a larger one is charged
// beyond the limit if need be — the balance goes below zero and the key's next requests wait
// until it is paid off, with exact RetryAfters — and a smaller one is refunded, never more than
// the charge still counts (nothing once its window has rolled, nothing a refilled bucket would
// not have had anyway). Each settlement is one atomic step on the store.

// Settler is implemented by stores that settle charges: both of sluice's stores.
type Settler interface {
	// Settle settles a charge of reserved on key under p, made by a decision at instant at (its
	// Decision.At, µs of the store's clock; SettleNow: as if made at the settlement's instant),
	// with the real cost actual. reserved and actual must be in 0..2^53 (an error wrapping
	// ErrInvalidCost otherwise, changing nothing). Errors wrapping ErrStoreUnavailable mean the
	// store could not settle: nothing changed.
	Settle(ctx context.Context, key string, p Policy, at, reserved, actual int64) error
}

// OnceSettler is implemented by stores whose settlements can be attempted again when an attempt's
// outcome is unknown, and are applied once however many attempts run: both of sluice's stores.
// Settlements retries only on such a store.
type OnceSettler interface {
	Settler
	// SettleOnce is Settle, made at most once for every call that passes the same id, as long as
	// the calls start within keep of this one: a call that failed with ErrStoreUnavailable or
	// whose context ended (it may or may not have been applied) can be made again with the same
	// id, and is then applied only if no earlier one was. id must be unique to the settlement
	// (Settlements makes one: 32 hexadecimal digits).
	SettleOnce(ctx context.Context, key string, p Policy, at, reserved, actual int64, id string, keep time.Duration) error
}

// SettleNow is the at of a settlement whose charge is taken as made at the settlement's own
// instant (Limiter.Settle): for a charge that may lie a window back, settle its decision's At.
const SettleNow int64 = math.MinInt64

// ErrCannotSettle is returned when the store does not implement Settler.
var ErrCannotSettle = errors.New("sluice: the store cannot settle costs (it does not implement sluice.Settler)")

// SettleDecision settles the charge that decision d made of reserved on key under p with the
// real cost actual, where d's cost was charged: on the store (at d.At), or on the local store of
// a guard's FailLocal fallback (d.Fallback FallbackLocal, with the local share of p). A decision
// that charged nothing — refused, or allowed unchecked by FailOpen — has nothing to settle. store
// is the one that decided: a Limiter's Store(), or one guarded by Guard (wrappers that have an
// Unwrap() Store method are looked through).
//
// SettleDecision makes one attempt: a settlement the store cannot make (ErrStoreUnavailable: a
// timeout, the breaker open) is returned as that error, not retried, nor applied to the local
// share instead (the charge it settles is on the store). Settlements.Settle retries it until it
// lands, applied once: what the gateway and the rate limit service settle with.
func SettleDecision(ctx context.Context, store Store, key string, p Policy, d Decision, reserved, actual int64) error {
	if !d.Allowed || d.Fallback == FallbackOpen || reserved == actual {
		return nil
	}
	return settleWhere(ctx, store, key, p, d, reserved, actual, "", 0)
}

// ChargeDecision charges cost on key under p, beyond the limit if need be, where decision d of
// that key (one that consumed nothing: refused, or a peek of cost 0) was decided: usage that
// must be counted whatever the answer was, such as the cost Envoy reports once a response has
// ended. It is the settlement of a charge of 0 whose real cost was cost, one atomic step on the
// store; nothing for a decision allowed unchecked by FailOpen, or a cost of 0.
func ChargeDecision(ctx context.Context, store Store, key string, p Policy, d Decision, cost int64) error {
	if d.Fallback == FallbackOpen || cost == 0 {
		return nil
	}
	d.At = SettleNow // charged at the settlement's instant: the decision's may lie in a window past
	return settleWhere(ctx, store, key, p, d, 0, cost, "", 0)
}

// settleWhere settles on the store that charged d: the guard's local fallback, or the store;
// with an id (not ""), once (OnceSettler.SettleOnce, keep its keep).
func settleWhere(ctx context.Context, store Store, key string, p Policy, d Decision, reserved, actual int64, id string, keep time.Duration) error {
	for {
		if g, ok := store.(*guard); ok {
			if d.Fallback == FallbackLocal {
				return settleOn(ctx, g.local, key, g.localPolicy(p), d.At, reserved, actual, id, keep)
			}
			if id != "" {
				return g.SettleOnce(ctx, key, p, d.At, reserved, actual, id, keep)
			}
			return g.Settle(ctx, key, p, d.At, reserved, actual)
		}
		u, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = u.Unwrap()
	}
	if d.Fallback == FallbackLocal {
		return fmt.Errorf("%w: a decision of a local fallback, on a store that is not a guard", ErrCannotSettle)
	}
	return settleOn(ctx, store, key, p, d.At, reserved, actual, id, keep)
}

// settleOn settles on store: once by id if it is not "" (the store must be an OnceSettler).
func settleOn(ctx context.Context, store Store, key string, p Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	if id != "" {
		s, ok := store.(OnceSettler)
		if !ok {
			return fmt.Errorf("%w: it cannot settle once by id (it does not implement sluice.OnceSettler)", ErrCannotSettle)
		}
		return s.SettleOnce(ctx, key, p, at, reserved, actual, id, keep)
	}
	s, ok := store.(Settler)
	if !ok {
		return ErrCannotSettle
	}
	return s.Settle(ctx, key, p, at, reserved, actual)
}

// settlesOnce reports whether a settlement of d on store goes to an OnceSettler (looking through
// the guard and wrappers as settleWhere does): whether it may be attempted again.
func settlesOnce(store Store, d Decision) bool {
	for {
		if g, ok := store.(*guard); ok {
			if d.Fallback == FallbackLocal {
				store = g.local
				break
			}
			store = g.store
			continue
		}
		if b, ok := store.(*BudgetStore); ok {
			store = b.store
			continue
		}
		u, ok := store.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		store = u.Unwrap()
	}
	_, ok := store.(OnceSettler)
	return ok
}

// Settle implements Settler for a guarded store (Guard): through the breaker, on the store. While
// the breaker keeps decisions off the store, the settlement is dropped; the settlement feeds the
// breaker by the guard's one health rule (a settlement of reserved == actual sends nothing, so it
// tells nothing). A decision that the local fallback made is settled there by SettleDecision,
// which knows it.
func (g *guard) Settle(ctx context.Context, key string, p Policy, at, reserved, actual int64) error {
	return g.settle(ctx, key, p, at, reserved, actual, "", 0)
}

// SettleOnce implements OnceSettler for a guarded store, as Settle: through the breaker.
func (g *guard) SettleOnce(ctx context.Context, key string, p Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	return g.settle(ctx, key, p, at, reserved, actual, id, keep)
}

func (g *guard) settle(ctx context.Context, key string, p Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	if _, ok := g.store.(Settler); !ok {
		return ErrCannotSettle
	}
	ok, probe := g.breaker.admit()
	if !ok {
		return fmt.Errorf("settlement not made: %w", errBreakerOpen)
	}
	err := settleOn(ctx, g.store, key, p, at, reserved, actual, id, keep)
	g.account(ctx, err, reserved != actual, probe)
	return err
}

// Settle settles a charge of reserved on key with the real cost actual, as if the charge had
// been made at the settlement's instant (SettleNow): a refund is given if the key's current
// window still counts it (a bucket: up to the whole of it), which is right for a charge made
// moments ago, in the window that is still running. For a charge that may lie further back, use
// Reserve, whose Reservation knows the instant of its decision.
//
// A settlement the store cannot make is dropped (the estimate stands) with an error wrapping
// ErrStoreUnavailable; with FailLocal it is not applied to the local share (see Reservation for
// what a reservation of the local fallback does).
func (l *Limiter) Settle(ctx context.Context, key string, reserved, actual int64) error {
	if l.policy.Algorithm == 0 {
		return ErrNoPolicy
	}
	return settleOn(ctx, l.store, key, l.policy, SettleNow, reserved, actual, "", 0) // (the guard, if l has one)
}

// Reserve decides a request of an estimated cost on key now, charging the estimate if it is
// approved (as AllowN), and returns the Reservation that settles it once the real cost is known:
//
//	r, err := lim.Reserve(ctx, key, 1000) // up to 1,000 model tokens
//	if err != nil || !r.Decision().Allowed { ... refuse ... }
//	used := callTheModel()
//	err = r.Settle(ctx, used) // 1,400: 400 more charged; 300: 700 refunded
//
// The error is AllowN's; a Reservation is returned with it when there is a decision (a cost that
// never fits).
func (l *Limiter) Reserve(ctx context.Context, key string, estimate int64) (*Reservation, error) {
	d, err := l.fixed.Decide(ctx, key, l.policy, estimate)
	return &Reservation{lim: l, key: key, cost: estimate, d: d}, err
}

// Reservation is a charged estimate waiting for its real cost, in the spirit of
// x/time/rate's Reservation: settle it once with Settle (the real cost), Commit (the estimate
// was right) or Cancel (refund it all, e.g. the request was never served). The first of these
// settles; later calls do nothing and return nil. It is safe for concurrent use.
//
// A reservation settles where its decision charged: on the store, at the decision's instant —
// so a refund after the window rolled gives nothing back, and one from a bucket that has refilled
// since gives only what is left of the charge — or, for a decision of the local fallback
// (FallbackLocal), on the local store with its share. A refused reservation, or one allowed
// unchecked by FailOpen, charged nothing and settles nothing.
type Reservation struct {
	lim  *Limiter
	key  string
	cost int64
	d    Decision
	once sync.Mutex
	done bool
}

// Decision returns the decision that made the reservation.
func (r *Reservation) Decision() Decision { return r.d }

// OK reports whether the reservation was approved.
func (r *Reservation) OK() bool { return r.d.Allowed }

// Settle settles the reservation with the real cost actual (0..2^53).
func (r *Reservation) Settle(ctx context.Context, actual int64) error {
	if actual < 0 || actual > algorithm.MaxLimit {
		return fmt.Errorf("%w: actual cost %d must be in 0..2^53", ErrInvalidCost, actual)
	}
	r.once.Lock()
	defer r.once.Unlock()
	if r.done {
		return nil
	}
	r.done = true
	return SettleDecision(ctx, r.lim.store, r.key, r.lim.policy, r.d, r.cost, actual)
}

// Commit settles the reservation at its estimate: nothing changes, and later settlements do nothing.
func (r *Reservation) Commit(ctx context.Context) error { return r.Settle(ctx, r.cost) }

// Cancel refunds the reservation: its real cost was 0.
func (r *Reservation) Cancel(ctx context.Context) error { return r.Settle(ctx, 0) }

// Settle implements Settler for a BudgetStore: on the store it wraps, for every policy. A unit
// spent from a local budget was counted there when the budget was taken (its decision's At is
// that take's), so its settlement goes there too: a refund gives the quota back to every
// instance, an extra is charged to all of them.
func (s *BudgetStore) Settle(ctx context.Context, key string, p Policy, at, reserved, actual int64) error {
	return settleOn(ctx, s.store, key, p, at, reserved, actual, "", 0)
}

// SettleOnce implements OnceSettler for a BudgetStore: on the store it wraps, as Settle.
func (s *BudgetStore) SettleOnce(ctx context.Context, key string, p Policy, at, reserved, actual int64, id string, keep time.Duration) error {
	return settleOn(ctx, s.store, key, p, at, reserved, actual, id, keep)
}
