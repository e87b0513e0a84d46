package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// settle runs the settlement part of the suite: fuzzed traces of requests whose approvals are
// settled later with random real costs, each settlement and the decisions after it equal to the
// pure core's (algorithm.Settle), also of calendar policies across real calendar edges, and
// concurrent reservations settled at once, exactly.
func (s Suite) settle(t *testing.T) {
	t.Run("fuzzed", func(t *testing.T) {
		for i, tr := range FuzzedTraces(4, 16, 80) {
			t.Run(fmt.Sprintf("%d-%v", i, tr.Policy.Algorithm), func(t *testing.T) { s.ReplaySettle(t, tr, uint64(i)) })
		}
	})
	t.Run("fuzzed-large", func(t *testing.T) {
		for i, tr := range FuzzedLargeTraces(5, 6, 40) {
			t.Run(fmt.Sprintf("%d-%v", i, tr.Policy.Algorithm), func(t *testing.T) { s.ReplaySettle(t, tr, uint64(i)) })
		}
	})
	t.Run("calendar", func(t *testing.T) {
		for i, tr := range CalendarSettleTraces(6, 60) {
			t.Run(fmt.Sprintf("%d-%s", i, tr.Policy.Name), func(t *testing.T) { s.ReplaySettle(t, tr, uint64(i)) })
		}
	})
	t.Run("concurrent", func(t *testing.T) { ConcurrentSettle(t, s.New, 16, 10) })
	t.Run("refused", s.settleRefused)
}

// settleRefused: what the core refuses to settle, every store refuses alike, writing nothing: a
// concurrency limit (it has no charge: its slots are given back by Release) and costs out of
// range.
func (s Suite) settleRefused(t *testing.T) {
	store := s.New(t, sluice.NewManualClock(time.Unix(1_700_000_000, 0)))
	settler, ok := store.(sluice.Settler)
	if !ok {
		t.Fatalf("%T does not implement sluice.Settler", store)
	}
	ctx := context.Background()
	conc := sluice.Policy{Name: "settle-conc", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	fw := sluice.Policy{Name: "settle-fw", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Minute}
	for _, c := range []struct {
		p                sluice.Policy
		reserved, actual int64
		want             error
	}{
		{conc, 1, 2, sluice.ErrInvalidPolicy},
		{conc, 2, 1, sluice.ErrInvalidPolicy},
		{fw, -1, 1, sluice.ErrInvalidCost},
		{fw, 1, algorithm.MaxLimit + 1, sluice.ErrInvalidCost},
	} {
		if err := settler.Settle(ctx, "k", c.p, sluice.SettleNow, c.reserved, c.actual); !errors.Is(err, c.want) {
			t.Errorf("Settle(%v, reserved %d, actual %d): %v, want %v", c.p.Algorithm, c.reserved, c.actual, err, c.want)
		}
	}
	if d, err := store.Decide(ctx, "k", fw, 0); err != nil || d.Remaining != fw.Limit {
		t.Fatalf("peek after the refused settlements: %+v %v, want the whole limit", d, err)
	}
}

// reservation is an approved request of a trace, waiting for its settlement.
type reservation struct {
	key      string
	at, cost int64 // the decision's At and cost
}

// ReplaySettle runs tr on a fresh store and on the core, settling approved requests (a random
// one of those pending, before a random half of the steps) with a random real cost from 0 to
// twice the estimate and a few more: every settlement's error, and every decision, the core's.
func (s Suite) ReplaySettle(t *testing.T, tr Trace, stream uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(stream, 0x5e771e))
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := s.New(t, clock)
	settler, ok := store.(sluice.Settler)
	if !ok {
		t.Fatalf("%T does not implement sluice.Settler", store)
	}
	ref := map[string]*algorithm.State{}
	p := tr.Policy
	ctx := context.Background()
	var pending []reservation
	for i, st := range tr.Steps {
		clock.Set(time.UnixMicro(st.At))
		if len(pending) > 0 && r.IntN(2) == 0 {
			j := r.IntN(len(pending))
			res := pending[j]
			pending = append(pending[:j], pending[j+1:]...)
			// From 0 to twice the estimate and a few more (the estimate itself, ±1), up to 2^53.
			c := res.cost
			if c > algorithm.MaxLimit/2 {
				c = algorithm.MaxLimit / 2
			}
			actual := []int64{c / 2, c - 1, c, c + 1, 2 * c, c + 3, r.Int64N(2*c + 1)}[r.IntN(7)]
			if actual < 0 {
				actual = 0
			}
			if r.IntN(4) == 0 {
				actual = 0 // a refund of it all
			}
			rs := ref[res.key]
			_, wantErr := algorithm.Settle(&p, rs, res.at, st.At, res.cost, actual)
			gotErr := settler.Settle(ctx, res.key, p, res.at, res.cost, actual)
			if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && !sameKind(wantErr, gotErr)) {
				t.Fatalf("%s step %d: settling %+v to %d at %d: error %v, want %v", tr.Name, i, res, actual, st.At, gotErr, wantErr)
			}
			want, _ := algorithm.Decide(&p, rs, st.At, 0)
			got, err := store.Decide(ctx, res.key, p, 0)
			if s.CachedRefusals && !want.Allowed && got.Cached() && got.Remaining <= want.Remaining {
				got.Remaining, got.Source = want.Remaining, sluice.FromStore // (as Replay allows)
			}
			if err != nil || got != want {
				t.Fatalf("%s step %d: after settling %+v to %d at %d (policy %+v):\n got %+v, %v\nwant %+v", tr.Name, i, res, actual, st.At, p, got, err, want)
			}
		}
		want, wantErr := decideRef(ref, &p, st)
		got, gotErr := store.Decide(ctx, st.Key, p, st.Cost)
		if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && !sameKind(wantErr, gotErr)) {
			t.Fatalf("%s step %d %+v: error %v, want %v", tr.Name, i, st, gotErr, wantErr)
		}
		if s.CachedRefusals && !want.Allowed && got.Cached() && got.Remaining <= want.Remaining {
			got.Remaining, got.Source = want.Remaining, sluice.FromStore
		}
		if got != want {
			t.Fatalf("%s step %d %+v (policy %+v):\n got %+v\nwant %+v", tr.Name, i, st, p, got, want)
		}
		if got.Allowed && st.Cost > 0 {
			pending = append(pending, reservation{key: st.Key, at: got.At, cost: st.Cost})
		}
	}
}

// ConcurrentSettle: goroutines reserve 5 each and settle at once, half of them to 2 and half to
// 7, on one key of a fixed window far from its limit: the count is then exactly the real costs'
// sum, on every algorithm's counterpart of it (a sliding log's entries, a bucket's tat, a
// calendar window's count).
func ConcurrentSettle(t *testing.T, newStore NewStore, goroutines, rounds int) {
	clock := sluice.NewManualClock(time.UnixMicro(0))
	store := newStore(t, clock)
	settler, ok := store.(sluice.Settler)
	if !ok {
		t.Fatalf("%T does not implement sluice.Settler", store)
	}
	ctx := context.Background()
	for _, p := range []sluice.Policy{
		{Name: "settle-fixed", Algorithm: sluice.FixedWindow, Limit: 100_000, Period: time.Hour},
		{Name: "settle-log", Algorithm: sluice.SlidingLog, Limit: 100_000, Period: time.Hour},
		{Name: "settle-bucket", Algorithm: sluice.TokenBucket, Limit: 100_000, Period: time.Hour},
		{Name: "settle-calendar-fixed", Algorithm: sluice.FixedWindow, Limit: 100_000, Calendar: algorithm.Day},
		{Name: "settle-calendar-sliding", Algorithm: sluice.SlidingWindow, Limit: 100_000, Calendar: algorithm.Month},
	} {
		var wg sync.WaitGroup
		errs := make(chan error, goroutines*rounds)
		for g := range goroutines {
			wg.Go(func() {
				for range rounds {
					d, err := store.Decide(ctx, "shared", p, 5)
					if err != nil || !d.Allowed {
						errs <- fmt.Errorf("reserve: %+v %v", d, err)
						return
					}
					if err := settler.Settle(ctx, "shared", p, d.At, 5, int64(2+5*(g%2))); err != nil {
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
		var used int64
		for g := range goroutines {
			used += int64(rounds * (2 + 5*(g%2)))
		}
		if d, err := store.Decide(ctx, "shared", p, 0); err != nil || d.Remaining != p.Limit-used {
			t.Fatalf("%s: remaining %d after settling every reservation (%v), want %d: settlements lost or doubled", p.Name, d.Remaining, err, p.Limit-used)
		}
	}
}
