package regions

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/sim"
)

// moving is 1.5 times a limit of 6000 a minute, 70/20/10 among eu, us and ap for 2m, then
// 10/20/70 for 3m: it moves at a window's start (a fixed window's use made before the move counts
// until its window ends, and holds the allotments until then: docs/design.md, "Convergence").
const moving = "eu: 105/s for 2m; 15/s for 3m; us: 30/s for 5m; ap: 15/s for 2m; 105/s for 3m"

func run(t *testing.T, o Options, traffic string) *Result {
	t.Helper()
	reqs, err := sim.ParseClientTraffic(traffic)
	if err != nil {
		t.Fatal(err)
	}
	o.Requests = reqs
	if o.Policy.Limit == 0 {
		o.Policy = sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 6000, Period: time.Minute}
	}
	if o.Regions == nil {
		o.Regions = []string{"eu", "us", "ap"}
	}
	res, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// rowsAt returns the rows of the interval that starts at t, by region.
func rowsAt(res *Result, t int64) map[string]Row {
	m := map[string]Row{}
	for _, r := range res.Rows {
		if r.StartMicros == t {
			m[r.Region] = r
		}
	}
	return m
}

// TestRegionsFollowDemand: demand of 1.5 L moving 70/20/10 → 10/20/70 at a window's start, with a latency of
// 50-150 ms each way to the ledger, both ledger algorithms: once every region has reported its
// new demand, each region's allotment is its share of it (allot.Split of the wants raised to the
// floor) within two refresh intervals; no window admits more than L, and the windows in a steady
// demand use at least 95% of it.
func TestRegionsFollowDemand(t *testing.T) {
	for _, alg := range []string{"fair", "proportional"} {
		t.Run(alg, func(t *testing.T) {
			res := run(t, Options{Refresh: 5 * time.Second, LatencyMin: 50 * time.Millisecond, LatencyMax: 150 * time.Millisecond,
				Floor: 0.05, Algorithm: alg, Draw: 3}, moving)
			I := res.RefreshMicros
			per := map[string]int64{"eu": 900, "us": 1800, "ap": 6300} // per minute, after the move
			a := allot.Fair
			if alg == "proportional" {
				a = allot.Proportional
			}
			want := allot.Split(a, res.Limit, []int64{per["eu"], per["us"], per["ap"]})
			share := map[string]int64{"eu": want[0], "us": want[1], "ap": want[2]}
			move := (2 * time.Minute).Microseconds()
			// The interval at whose end every region has reported its demand after the move (a
			// want is measured over four refreshes: docs/design.md).
			measured := int64(-1)
			for t0 := move; t0 < move+6*I && measured < 0; t0 += I {
				all := true
				for name, r := range rowsAt(res, t0) {
					all = all && r.Want >= per[name]*98/100 && r.Want <= per[name]*102/100
				}
				if all {
					measured = t0
				}
			}
			if measured < 0 {
				t.Fatalf("the regions' reports do not show the new demand by %s: %+v", sim.FormatDuration(move+6*I), rowsAt(res, move+5*I))
			}
			for t0 := measured + 2*I; t0 < move+3*time.Minute.Microseconds(); t0 += I {
				for name, r := range rowsAt(res, t0) {
					if d := r.Allotment - share[name]; d < -res.Limit/100 || d > res.Limit/100 {
						t.Fatalf("demand measured by %s; at %s %s enforces %d; want its share %d (of %v) within 1%% of L",
							sim.FormatDuration(measured+I), sim.FormatDuration(t0+I), name, r.Allotment, share[name], want)
					}
				}
			}
			if !res.Held {
				t.Fatalf("the bound does not hold: %s", res.BoundText())
			}
			for _, w := range res.Windows {
				if w.Bound != res.Limit {
					t.Errorf("window %s: bound %d; want L = %d (no partition)", sim.FormatDuration(w.StartMicros), w.Bound, res.Limit)
				}
				// Steady demand: the second minute (past the new ledger's learning), the fourth and the fifth.
				if s := w.StartMicros / time.Minute.Microseconds(); (s == 1 || s >= 3) && w.Admitted < res.Limit*95/100 {
					t.Errorf("window %s admitted %d of %d", sim.FormatDuration(w.StartMicros), w.Admitted, res.Limit)
				}
			}
		})
	}
}

// TestRegionsPartitionFlush: demand of 1.5 L, evenly; eu cut off from the ledger for three
// minutes (its lease and the hold end in it), then the ledger flushed:
// eu keeps its lease, then runs on the safe share while cut off; after the flush every region's
// grant comes from a learning ledger; the worldwide bound holds in every window, L with S = F, and
// L + k·(S − F) with a safe share above the floor (which the windows of the partition do use).
func TestRegionsPartitionFlush(t *testing.T) {
	for _, safe := range []float64{0, 0.2} {
		o := Options{Refresh: 5 * time.Second, LatencyMin: 20 * time.Millisecond, LatencyMax: 200 * time.Millisecond, Floor: 0.05, SafeShare: safe, Draw: 9,
			Partitions: []Partition{{Region: "eu", From: 90 * time.Second, To: 270 * time.Second}}, Flushes: []time.Duration{5 * time.Minute}}
		res := run(t, o, "eu: 50/s for 7m; us: 50/s for 7m; ap: 50/s for 7m")
		if !res.Held {
			t.Fatalf("safe share %g: the bound does not hold: %s", safe, res.BoundText())
		}
		var cutSafe, learning, failed bool
		for _, r := range res.Rows {
			cutSafe = cutSafe || r.Region == "eu" && r.Cut && r.Safe && r.Allotment == res.Safe
			learning = learning || r.StartMicros > (5*time.Minute).Microseconds() && r.Learning
		}
		failed = res.Failed > 0
		if !cutSafe || !learning || !failed {
			t.Errorf("safe share %g: eu on the safe share while cut off %v, learning after the flush %v, refreshes failed %v", safe, cutSafe, learning, failed)
		}
		extra := max(0, res.Safe-res.Floor)
		if safe > 0 && extra != 900 {
			t.Errorf("S − F = %d; want 1200 − 300", extra)
		}
		over := false
		for _, w := range res.Windows {
			if w.Bound != res.Limit+int64(w.Cut)*extra {
				t.Errorf("window %s: bound %d with %d cut off", sim.FormatDuration(w.StartMicros), w.Bound, w.Cut)
			}
			over = over || w.Admitted > res.Limit
		}
		if over != (safe > 0) {
			t.Errorf("safe share %g: some window above L: %v; want it only with S > F", safe, over)
		}
		want := "≤ L + k·max(0, S − F) = 6000 + k·max(0, 300 − 300) = 6000 + k·0: held in all 7 windows"
		if safe > 0 {
			want = "≤ L + k·max(0, S − F) = 6000 + k·max(0, 1200 − 300) = 6000 + k·900: held in all 7 windows"
		}
		if !strings.Contains(res.BoundText(), want) {
			t.Errorf("the bound says %q; want %q", res.BoundText(), want)
		}
	}
}

// TestRegionsDeterministic: the same options and Draw give the same output, byte for byte.
func TestRegionsDeterministic(t *testing.T) {
	o := Options{LatencyMin: 10 * time.Millisecond, LatencyMax: 900 * time.Millisecond, Floor: 0.1, Draw: 42,
		Partitions: []Partition{{Region: "us", From: time.Minute, To: 90 * time.Second}}, Flushes: []time.Duration{2 * time.Minute}}
	var outs []string
	for range 3 {
		b, err := json.Marshal(run(t, o, moving))
		if err != nil {
			t.Fatal(err)
		}
		var tb strings.Builder
		if err := run(t, o, moving).WriteTable(&tb); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, string(b)+tb.String())
	}
	if outs[0] != outs[1] || outs[1] != outs[2] {
		t.Fatal("three runs with the same Draw differ")
	}
}

func TestRegionsBadOptions(t *testing.T) {
	p := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}
	reqs := []sim.Request{{TMicros: 0, Key: "eu", Cost: 1}}
	for _, c := range []struct {
		o   Options
		err string
	}{
		{Options{Policy: p, Regions: []string{"us"}, Requests: reqs}, `names "eu", which is not one of the regions`},
		{Options{Policy: p, Regions: []string{"eu", "eu"}}, "named twice"},
		{Options{Policy: p, Regions: []string{"e u"}}, "region name"},
		{Options{Policy: p, Regions: []string{"eu"}, Partitions: []Partition{{Region: "us", To: time.Second}}}, `partition of "us"`},
		{Options{Policy: p, Regions: []string{"eu"}, Partitions: []Partition{{Region: "eu", From: time.Second}}}, "to after from"},
		{Options{Policy: p, Regions: []string{"eu"}, LatencyMax: 2 * time.Second}, "at most a quarter"},
		{Options{Policy: p, Regions: []string{"eu"}, Lease: time.Second}, "lease 1s"},
		{Options{Policy: p, Regions: []string{"eu", "us"}, Floor: 0.6}, "floor 0.6"},
		{Options{Policy: p, Regions: []string{"eu"}, Algorithm: "random"}, "ledger algorithm"},
		{Options{Policy: sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 100, Period: time.Minute}, Regions: []string{"eu"}}, "sliding-log"},
		{Options{Policy: p}, "0 regions"},
		{Options{Policy: p, Regions: []string{"eu"}, Refresh: time.Millisecond, Duration: 10 * time.Minute}, "600000 refresh intervals of 1ms"},
		{Options{Policy: sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Millisecond}, Regions: []string{"eu"}, Duration: 10 * time.Minute}, "600000 windows of 1ms"},
	} {
		if _, err := Run(c.o); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%+v: %v; want an error with %q", c.o, err, c.err)
		}
	}
}

// TestRegionsAlgorithms: a sliding window and a token bucket, demand of 1.5 L moving, eu cut off
// for two minutes with a safe share above the floor: each window within its bound (a bucket's:
// its capacity + L, plus k·(S − F)), and the allotments follow the move.
func TestRegionsAlgorithms(t *testing.T) {
	for _, p := range []sluice.Policy{
		{Algorithm: sluice.SlidingWindow, Limit: 6000, Period: time.Minute},
		{Algorithm: sluice.TokenBucket, Limit: 6000, Period: time.Minute, Burst: 600},
	} {
		o := Options{Policy: p, LatencyMin: 50 * time.Millisecond, LatencyMax: 150 * time.Millisecond, Floor: 0.05, SafeShare: 0.1, Draw: 5,
			Partitions: []Partition{{Region: "eu", From: 3 * time.Minute, To: 5 * time.Minute}}}
		res := run(t, o, moving)
		if !res.Held {
			t.Errorf("%v: %s", p.Algorithm, res.BoundText())
		}
		base := res.Limit
		if p.Algorithm == sluice.TokenBucket {
			base += 600
		}
		for _, w := range res.Windows {
			if w.Bound != base+int64(w.Cut)*300 {
				t.Errorf("%v: window %s: bound %d, %d cut off", p.Algorithm, sim.FormatDuration(w.StartMicros), w.Bound, w.Cut)
			}
		}
		before, after := rowsAt(res, (100 * time.Second).Microseconds())["ap"], rowsAt(res, (170 * time.Second).Microseconds())["ap"]
		if before.Allotment > 1000 || after.Allotment < 3000 {
			t.Errorf("%v: ap's allotment %d at 1m40s, %d at 2m50s; want it to follow its demand", p.Algorithm, before.Allotment, after.Allotment)
		}
	}
}
