package envoys

import (
	"fmt"
	"testing"
	"time"
)

// TestBoundAcrossSetups: the RLQS bound (admitted under assignments per window ≤ L + Σ
// max_tokens) and RLS's (B + L) hold whatever the split, the latency (up to its limit), the
// report interval, the behaviours and a kill and restart, on bursts and moving demand.
func TestBoundAcrossSetups(t *testing.T) {
	traffics := []string{
		"e1: 40/s for 1m; 2/s for 2m; e2: 2/s for 1m; 40/s for 2m; e3: 20/s for 3m",
		"e1: 300 at once; idle 20s; 300 at once; idle 50s; 10/s for 1m; e2: 5/s for 3m; e3: idle 1m; 50/s for 30s; idle 1m",
		"e1: 100/s for 3m; e2: 1/s for 3m; e3: 0.5/s for 3m",
	}
	n := 0
	for ti, traffic := range traffics {
		for _, alg := range []string{"fair", "proportional"} {
			for _, setup := range []struct {
				interval, latency time.Duration
				expired           Behavior
				kill, restart     time.Duration
			}{
				{5 * time.Second, 0, Fallback, 0, 0},
				{5 * time.Second, time.Second, Reuse, 0, 0},
				{time.Second, 250 * time.Millisecond, Allow, 0, 0},
				{2 * time.Second, 100 * time.Millisecond, Deny, 70 * time.Second, 100 * time.Second},
			} {
				n++
				name := fmt.Sprintf("traffic%d/%s/%v/%v/%s/kill%v", ti, alg, setup.interval, setup.latency, setup.expired, setup.kill)
				names, _ := Names("3")
				reqs, err := Traffic(traffic, names)
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(Options{Envoys: names, Requests: reqs, Limit: 1200, Period: time.Minute, Burst: 200, ReportInterval: setup.interval,
					Latency: setup.latency, Algorithm: alg, NoAssignment: Deny, Expired: setup.expired, KillAt: setup.kill, RestartAt: setup.restart})
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !res.Held || !res.RLSHeld {
					t.Errorf("%s: %s", name, res.BoundText())
				}
				if res.RLQSCalls >= res.RLSCalls {
					t.Errorf("%s: RLQS %d calls, RLS %d", name, res.RLQSCalls, res.RLSCalls)
				}
			}
		}
	}
	if n != 24 {
		t.Fatal(n)
	}
}
