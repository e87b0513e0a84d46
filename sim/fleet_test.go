package sim

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// fleetTraffic are patterns whose bursts and lulls leave budgets half spent, to be spent later.
var fleetTraffic = []string{
	"6 at once; idle 500ms; 10/s for 2s",
	"3/s for 2s; 30 at once; idle 700ms; 30 in 300ms",
	"25/s for 3s",
	"7 at once; idle 950ms; 7 at once; idle 90ms; 40 in 1s",
	"1/s for 3s; 12 at once; idle 1100ms; 12 at once",
}

// A fleet's run keeps the bound of sluice.LocalBudget, on the simulator's virtual clock: the
// windows admit at most their limit in each window; a token bucket, over every interval, at most
// what an exact run may plus min(rate × max_age, instances × size). And the requests go to the
// instances in turn.
func TestFleetKeepsTheBound(t *testing.T) {
	for _, p := range []sluice.Policy{
		{Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Second},
		{Algorithm: sluice.SlidingWindow, Limit: 10, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second},
		{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second, Burst: 20},
	} {
		for _, f := range []Fleet{
			{Instances: 1, Budget: sluice.LocalBudget{Size: 4, MaxAge: time.Second}},
			{Instances: 3, Budget: sluice.LocalBudget{Size: 5, MaxAge: time.Second}},
			{Instances: 4, Budget: sluice.LocalBudget{Size: 3, MaxAge: 300 * time.Millisecond}},
		} {
			for _, pattern := range fleetTraffic {
				name := fmt.Sprintf("%v burst %d, %d × %d for %v, %s", p.Algorithm, p.Burst, f.Instances, f.Budget.Size, f.Budget.MaxAge, pattern)
				reqs, err := ParseTraffic(pattern)
				if err != nil {
					t.Fatal(err)
				}
				var rows []Row
				sum, err := SimulateFleet(p, f, reqs, func(r Row) error { rows = append(rows, r); return nil })
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for i, r := range rows {
					if r.Instance != i%f.Instances+1 {
						t.Fatalf("%s: request %d went to instance %d; want %d (in turn)", name, i+1, r.Instance, i%f.Instances+1)
					}
				}
				if sum.Allowed == 0 {
					t.Fatalf("%s: nothing allowed", name)
				}
				checkFleetBound(t, name, p, f, rows)
			}
		}
	}
}

// checkFleetBound checks rows against the bound of p's budgets on f.
func checkFleetBound(t *testing.T, name string, p sluice.Policy, f Fleet, rows []Row) {
	t.Helper()
	period := p.PeriodMicros()
	if p.Algorithm != sluice.TokenBucket {
		perWindow := map[int64]int64{}
		for _, r := range rows {
			if r.Allowed {
				perWindow[r.TMicros/period]++
			}
		}
		for w, n := range perWindow {
			if n > p.Limit {
				t.Errorf("%s: window %d admitted %d; the bound is the limit %d", name, w, n, p.Limit)
			}
		}
		return
	}
	// Every interval [a, b] whose ends are requests' times.
	extra := min(float64(p.Limit)*float64(f.Budget.MaxAge)/float64(p.Period), float64(int64(f.Instances)*f.Budget.Size))
	for i := range rows {
		var n int64
		for j := i; j < len(rows); j++ {
			if rows[j].Allowed {
				n++
			}
			span := float64(rows[j].TMicros - rows[i].TMicros)
			if bound := float64(p.Capacity()) + float64(p.Limit)*span/float64(period) + extra; float64(n) > bound {
				t.Fatalf("%s: %d admitted from %s to %s ms; the bound is %.2f", name, n, FormatMillis(rows[i].TMicros), FormatMillis(rows[j].TMicros), bound)
			}
		}
	}
}

// Budgets are visible: on a burst the instances' budgets hold units the others cannot use, so
// the fleet admits fewer than the exact run, with the same code the gateway runs.
func TestFleetDiffersFromExact(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second}
	reqs, err := ParseTraffic("6 at once; idle 500ms; 10/s for 2s")
	if err != nil {
		t.Fatal(err)
	}
	exact, err := Simulate(p, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := SimulateFleet(p, Fleet{Instances: 3, Budget: sluice.LocalBudget{Size: 5, MaxAge: time.Second}}, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if exact.Allowed != 26 || fleet.Allowed != 24 {
		t.Errorf("allowed: exact %d, fleet %d; want 26 and 24", exact.Allowed, fleet.Allowed)
	}
}

func TestFleetErrors(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second}
	budget := sluice.LocalBudget{Size: 5, MaxAge: time.Second}
	for _, tc := range []struct {
		p    sluice.Policy
		f    Fleet
		want string
	}{
		{p, Fleet{Instances: 0, Budget: budget}, "instances 0 must be from 1 to 64"},
		{p, Fleet{Instances: 65, Budget: budget}, "instances 65 must be from 1 to 64"},
		{p, Fleet{Instances: 2, Budget: sluice.LocalBudget{Size: 11, MaxAge: time.Second}}, "local_budget.size 11 must be ≤ the policy's limit 10"},
		{sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 10, Period: time.Second}, Fleet{Instances: 2, Budget: budget}, "not supported by sliding-log"},
		{sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second}, Fleet{Instances: 2, Budget: budget}, "not supported by leaky-bucket"},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 0, Period: time.Second}, Fleet{Instances: 2, Budget: budget}, "limit"},
	} {
		_, err := NewFleetSession(tc.p, 1, tc.f)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %+v: error %v; want one saying %q", tc.p.Algorithm, tc.f, err, tc.want)
		}
		if strings.Contains(tc.want, "local_budget") && !errors.Is(err, sluice.ErrInvalidPolicy) {
			t.Errorf("%v: %v does not wrap ErrInvalidPolicy", tc.f, err)
		}
	}
}
