package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
	_ "time/tzdata" // the zones, also where there is no /usr/share/zoneinfo
)

func loadZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// An unnamed calendar policy is named after its calendar and zone, so that unnamed policies of
// other zones on one store never share a key's state.
func TestNewLimiterNamesCalendarPolicies(t *testing.T) {
	berlin, tokyo := loadZone(t, "Europe/Berlin"), loadZone(t, "Asia/Tokyo")
	clock := sluice.NewManualClock(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	st := memory.New(memory.WithClock(clock))
	a, err := sluice.NewLimiter(st, sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Calendar: sluice.Day, Location: berlin})
	if err != nil {
		t.Fatal(err)
	}
	b, err := sluice.NewLimiter(st, sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 2, Calendar: sluice.Day, Location: tokyo})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := a.Policy().Name, "fixed-window/2/day/Europe/Berlin"; got != want {
		t.Errorf("name %q, want %q", got, want)
	}
	ctx := context.Background()
	for range 2 {
		if d, _ := a.Allow(ctx, "k"); !d.Allowed {
			t.Fatal("refused under Berlin's day")
		}
	}
	if d, _ := b.Allow(ctx, "k"); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Tokyo's policy saw Berlin's counts: %+v", d)
	}
}

// A budget of a calendar policy expires at the local boundary that ends the window it was
// counted in: for the sliding window, a day before the store's ResetAfter — and that day is the
// next one's length, 25 hours before Berlin's 2026-10-25 ends.
func TestBudgetCalendarEndsAtLocalBoundary(t *testing.T) {
	berlin := loadZone(t, "Europe/Berlin")
	for _, c := range []struct {
		alg   sluice.Algorithm
		start time.Time // an hour before local midnight
	}{
		{sluice.FixedWindow, time.Date(2026, 3, 28, 23, 0, 0, 0, berlin)},
		{sluice.SlidingWindow, time.Date(2026, 10, 24, 23, 0, 0, 0, berlin)}, // the 25th lasts 25 hours
		{sluice.SlidingWindow, time.Date(2026, 3, 28, 23, 0, 0, 0, berlin)},  // the 29th lasts 23
		{sluice.SlidingWindow, time.Date(2026, 12, 31, 23, 0, 0, 0, berlin)},
	} {
		clock, _, shared := budgetWorld(c.start)
		p := sluice.Policy{Name: "cal", Algorithm: c.alg, Limit: 1000, Calendar: sluice.Day, Location: berlin}
		b := sluice.Budgeted(shared, budgetFor(sluice.LocalBudget{Size: 10, MaxAge: 48 * time.Hour}), sluice.WithBudgetClock(clock))
		mustDecide(t, b, "k", p, 1)
		clock.Advance(time.Hour - time.Microsecond)
		mustDecide(t, b, "k", p, 1)
		if n := shared.calls.Load(); n != 1 {
			t.Fatalf("%v from %v: %d store calls inside the day; want 1", c.alg, c.start, n)
		}
		clock.Advance(time.Microsecond) // local midnight
		mustDecide(t, b, "k", p, 1)
		if n := shared.calls.Load(); n != 2 {
			t.Fatalf("%v from %v: %d store calls: a budget outlived its day", c.alg, c.start, n)
		}
	}
}
