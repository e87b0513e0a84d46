package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Concurrency runs the conformance tests of concurrency policies (sluice.Leaser) on stores made
// by newStore: a store that does not implement Leaser fails them.
func Concurrency(t *testing.T, newStore NewStore) {
	t.Run("steps", func(t *testing.T) { concurrencySteps(t, newStore) })
	t.Run("fuzzed", func(t *testing.T) {
		for i := range 12 {
			t.Run(fmt.Sprint(i), func(t *testing.T) { concurrencyFuzzed(t, newStore, uint64(i)) })
		}
	})
	t.Run("with-rate", func(t *testing.T) { concurrencyWithRate(t, newStore) })
	t.Run("with-calendar-rate", func(t *testing.T) { concurrencyWithCalendarRate(t, newStore) })
	t.Run("no-lease", func(t *testing.T) { concurrencyNoLease(t, newStore) })
	t.Run("goroutines", func(t *testing.T) { ConcurrentSlots(t, newStore, 16, 40) })
}

// concPolicy is the suite's concurrency policy: 3 slots, a 10s lease.
var concPolicy = sluice.Policy{Name: "conc", Algorithm: sluice.Concurrency, Limit: 3, Period: 10 * time.Second}

const concT0 = int64(1_700_000_000_000_000) // a real instant, µs

func leaser(t *testing.T, st sluice.Store) sluice.Leaser {
	t.Helper()
	l, ok := st.(sluice.Leaser)
	if !ok {
		t.Fatalf("%T does not implement sluice.Leaser", st)
	}
	return l
}

// acquire takes cost slots of p on key under id, alone.
func acquire(st sluice.Store, key string, p sluice.Policy, id uint64, cost int64) (sluice.Decision, error) {
	var out [1]sluice.Decision
	_, err := st.DecideAll(context.Background(), key, []sluice.Limit{{Policy: p, Cost: cost, Lease: id}}, out[:])
	return out[0], err
}

// concurrencySteps: N slots, a refusal with its hint, a release, a renewal that keeps a slow
// request's slot past its first lease, and expiry, on a virtual clock.
func concurrencySteps(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(concT0))
	st := newStore(t, clock)
	ls := leaser(t, st)
	ctx := context.Background()
	const s = int64(time.Second / time.Microsecond)
	at := func(us int64) { clock.Set(time.UnixMicro(concT0 + us)) }
	want := func(step string, d sluice.Decision, err error, allowed bool, remaining int64, retry, reset time.Duration) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		w := sluice.Decision{Allowed: allowed, Limit: 3, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
		d.At = 0 // a slot has nothing to settle: its instant is not part of the table
		if d != w {
			t.Fatalf("%s: got %+v, want %+v", step, d, w)
		}
	}
	for id := uint64(1); id <= 3; id++ {
		at(int64(id-1) * s)
		d, err := acquire(st, "k", concPolicy, id, 1)
		want(fmt.Sprint("acquire ", id), d, err, true, 3-int64(id), 0, 10*time.Second)
	}
	d, err := acquire(st, "k", concPolicy, 4, 1)
	want("full", d, err, false, 0, time.Second, 10*time.Second)
	d, err = st.Decide(ctx, "k", concPolicy, 0)
	want("peek", d, err, true, 0, 0, 10*time.Second)
	at(3 * s)
	if err := ls.Release(ctx, "k", concPolicy, 2); err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(ctx, "k", concPolicy, 2); err != nil { // twice: nothing more
		t.Fatal(err)
	}
	d, err = acquire(st, "k", concPolicy, 4, 1)
	want("after a release", d, err, true, 0, 0, 10*time.Second)
	at(9 * s)
	if err := ls.Renew(ctx, "k", concPolicy, 1, 99); err != nil { // 99: never held
		t.Fatal(err)
	}
	// Lease 1 expires at 19s, 3 at 12s, 4 at 13s.
	at(11*s + s/2)
	d, err = acquire(st, "k", concPolicy, 5, 1)
	want("renewed, still full", d, err, false, 0, time.Second/2, 7*time.Second+time.Second/2)
	at(12*s - 1)
	d, err = acquire(st, "k", concPolicy, 5, 1)
	want("a µs before an expiry", d, err, false, 0, time.Microsecond, 7*time.Second+time.Microsecond)
	at(12 * s)
	d, err = acquire(st, "k", concPolicy, 5, 1)
	want("at the expiry", d, err, true, 0, 0, 10*time.Second)
	at(13 * s)
	if err := ls.Renew(ctx, "k", concPolicy, 4); err != nil { // expired at 13s: not renewed
		t.Fatal(err)
	}
	// 1 (until 19s) and 5 (until 22s) hold two slots: one is free, not the two wanted (had 4 been
	// renewed, none would be).
	d, err = acquire(st, "k", concPolicy, 6, 2)
	want("two slots, one free", d, err, false, 1, time.Second, 9*time.Second)
	at(19 * s)
	d, err = acquire(st, "k", concPolicy, 6, 2)
	want("two slots", d, err, true, 0, 0, 10*time.Second)
	at(23 * s)
	if err := ls.Release(ctx, "k", concPolicy, 6); err != nil {
		t.Fatal(err)
	}
	d, err = st.Decide(ctx, "k", concPolicy, 0)
	want("all gone", d, err, true, 3, 0, 0)
}

// concurrencyFuzzed: random acquisitions, releases, renewals and time steps on three keys give
// decision for decision what the pure core gives.
func concurrencyFuzzed(t *testing.T, newStore NewStore, stream uint64) {
	r := rand.New(rand.NewPCG(7, stream))
	p := sluice.Policy{Name: "conc-fuzz", Algorithm: sluice.Concurrency, Limit: 1 + r.Int64N(4), Period: time.Duration(1+r.Int64N(2000)) * time.Millisecond}
	clock := sluice.NewManualClock(time.UnixMicro(concT0))
	st := newStore(t, clock)
	ls := leaser(t, st)
	ctx := context.Background()
	keys := []string{"a", "b", "c"}
	ref := map[string]*algorithm.State{}
	held := map[string][]uint64{}
	now, next := concT0, uint64(1)
	for step := range 150 {
		k := keys[r.IntN(len(keys))]
		if ref[k] == nil {
			ref[k] = &algorithm.State{}
		}
		switch op := r.IntN(10); {
		case op < 2:
			now += r.Int64N(p.PeriodMicros() / 2)
			clock.Set(time.UnixMicro(now))
		case op < 4 && len(held[k]) > 0:
			i := r.IntN(len(held[k]))
			id := held[k][i]
			held[k] = append(held[k][:i], held[k][i+1:]...)
			algorithm.Release(ref[k], now, id)
			if err := ls.Release(ctx, k, p, id); err != nil {
				t.Fatalf("step %d: release: %v", step, err)
			}
		case op < 5 && len(held[k]) > 0:
			id := held[k][r.IntN(len(held[k]))]
			algorithm.Renew(&p, ref[k], now, id)
			if err := ls.Renew(ctx, k, p, id); err != nil {
				t.Fatalf("step %d: renew: %v", step, err)
			}
		default:
			cost := r.Int64N(p.Limit + 1) // 0 (a peek) .. every slot
			id := next
			next++
			var want sluice.Decision
			if err := algorithm.Acquire(&p, ref[k], now, id, cost, &want); err != nil {
				t.Fatal(err)
			}
			got, err := acquire(st, k, p, id, cost)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			if got != want {
				t.Fatalf("step %d (key %s, cost %d, at +%dµs, policy %+v): got %+v, the core %+v", step, k, cost, now-concT0, p, got, want)
			}
			if want.Allowed && cost > 0 {
				held[k] = append(held[k], id)
			}
		}
	}
}

// concurrencyWithRate: a concurrency limit and a rate limit of one request, all or nothing: a
// rate refusal takes no slot, a concurrency refusal consumes no rate quota.
func concurrencyWithRate(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(concT0))
	st := newStore(t, clock)
	ctx := context.Background()
	conc := sluice.Policy{Name: "slots", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	rate := sluice.Policy{Name: "rate", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}
	both := func(id uint64) (bool, [2]sluice.Decision) {
		var out [2]sluice.Decision
		ok, err := st.DecideAll(ctx, "k", []sluice.Limit{{Policy: rate, Cost: 1}, {Policy: conc, Cost: 1, Lease: id}}, out[:])
		if err != nil {
			t.Fatal(err)
		}
		return ok, out
	}
	for id := uint64(1); id <= 2; id++ {
		if ok, out := both(id); !ok {
			t.Fatalf("request %d refused: %+v", id, out)
		}
	}
	// The slots are full: refused, and the rate's quota is untouched (1 of 3 left).
	ok, out := both(3)
	if ok || out[1].Allowed || !out[0].Allowed {
		t.Fatalf("third request: %v %+v", ok, out)
	}
	if d, _ := st.Decide(ctx, "k", rate, 0); d.Remaining != 1 {
		t.Fatalf("a concurrency refusal consumed rate quota: %d left, want 1", d.Remaining)
	}
	if err := leaser(t, st).Release(ctx, "k", conc, 1); err != nil {
		t.Fatal(err)
	}
	if ok, out := both(3); !ok {
		t.Fatalf("after a release: %+v", out)
	}
	// The rate is spent now (3 of 3): a release frees a slot, and the rate refuses, taking none.
	if err := leaser(t, st).Release(ctx, "k", conc, 2); err != nil {
		t.Fatal(err)
	}
	ok, out = both(4)
	if ok || out[0].Allowed || !out[1].Allowed {
		t.Fatalf("rate-refused request: %v %+v", ok, out)
	}
	if d, _ := st.Decide(ctx, "k", conc, 0); d.Remaining != 1 {
		t.Fatalf("a rate refusal took a slot: %d free, want 1", d.Remaining)
	}
}

// concurrencyWithCalendarRate: a calendar rate limit (a UTC day) in a request with a concurrency
// limit is decided in its calendar window, and its decision's At settles its charge (a refund
// gives the quota back), as it would be alone.
func concurrencyWithCalendarRate(t *testing.T, newStore NewStore) {
	clock := sluice.NewManualClock(time.UnixMicro(concT0))
	st := newStore(t, clock)
	ctx := context.Background()
	conc := sluice.Policy{Name: "slots", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	daily := sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: sluice.Day}
	var out [2]sluice.Decision
	ok, err := st.DecideAll(ctx, "k", []sluice.Limit{{Policy: daily, Cost: 2}, {Policy: conc, Cost: 1, Lease: 1}}, out[:])
	if err != nil || !ok {
		t.Fatalf("a calendar rate limit with a concurrency limit: %v %v %+v", ok, err, out)
	}
	_, end := daily.Calendar.Window(daily.Location, concT0)
	want := sluice.Decision{Allowed: true, Limit: 3, Remaining: 1, ResetAfter: time.Duration(end-concT0) * time.Microsecond, At: concT0}
	if out[0] != want {
		t.Fatalf("the calendar rate limit: got %+v, want %+v", out[0], want)
	}
	settler, ok := st.(sluice.Settler)
	if !ok {
		t.Fatalf("%T does not implement sluice.Settler", st)
	}
	clock.Set(time.UnixMicro(concT0 + 1))
	if err := settler.Settle(ctx, "k", daily, out[0].At, 2, 0); err != nil {
		t.Fatal(err)
	}
	if d, err := st.Decide(ctx, "k", daily, 0); err != nil || d.Remaining != 3 {
		t.Fatalf("after a refund of the whole charge: %+v %v, want 3 left", d, err)
	}
}

// concurrencyNoLease: slots are taken only under a lease.
func concurrencyNoLease(t *testing.T, newStore NewStore) {
	st := newStore(t, sluice.NewManualClock(time.UnixMicro(concT0)))
	if _, err := st.Decide(context.Background(), "k", concPolicy, 1); !errors.Is(err, sluice.ErrNoLease) {
		t.Fatalf("Decide of cost 1: %v, want ErrNoLease", err)
	}
	if _, err := acquire(st, "k", concPolicy, 0, 1); !errors.Is(err, sluice.ErrNoLease) {
		t.Fatalf("DecideAll without a lease: %v, want ErrNoLease", err)
	}
	if _, err := acquire(st, "k", concPolicy, 1, 4); !errors.Is(err, sluice.ErrCostExceedsLimit) {
		t.Fatalf("4 slots of 3: %v, want ErrCostExceedsLimit", err)
	}
	if d, err := st.Decide(context.Background(), "k", concPolicy, 0); err != nil || d.Remaining != 3 {
		t.Fatalf("after the errors: %+v %v, want all 3 slots free", d, err)
	}
}

// ConcurrentSlots: goroutines each take a slot of one key (limit 5), hold it while counting
// themselves in flight, and release it, rounds times; at no moment are more than 5 in flight,
// and every slot is free at the end.
func ConcurrentSlots(t *testing.T, newStore NewStore, goroutines, rounds int) {
	clock := sluice.NewManualClock(time.UnixMicro(concT0)) // still: no lease expires
	st := newStore(t, clock)
	ls := leaser(t, st)
	p := sluice.Policy{Name: "conc-race", Algorithm: sluice.Concurrency, Limit: 5, Period: time.Minute}
	var inFlight, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				id := sluice.NewLeaseID()
				d, err := acquire(st, "hot", p, id, 1)
				if err != nil {
					errs <- err
					return
				}
				if !d.Allowed {
					continue
				}
				admitted.Add(1)
				n := inFlight.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				inFlight.Add(-1) // before the release: the slot is still ours
				if err := ls.Release(context.Background(), "hot", p, id); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if peak.Load() > 5 {
		t.Fatalf("%d in flight at once, limit 5", peak.Load())
	}
	if admitted.Load() < int64(rounds) {
		t.Fatalf("only %d admitted of %d tries", admitted.Load(), goroutines*rounds)
	}
	if d, err := st.Decide(context.Background(), "hot", p, 0); err != nil || d.Remaining != 5 {
		t.Fatalf("at the end: %+v %v, want every slot free", d, err)
	}
}
