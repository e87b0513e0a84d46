package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// The buggy partner sends 600 a minute, the normal one 20, for a minute, against 100 a minute.
const partnersTraffic = "buggy: 600/min for 1m; normal: 20/min for 1m"

var perMinute = sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}

func runFleet(t *testing.T, p sluice.Policy, f Fleet, pattern string) (Summary, *Breakdown) {
	t.Helper()
	reqs, err := ParseClientTraffic(pattern)
	if err != nil {
		t.Fatal(err)
	}
	b := NewBreakdown(f.Instances)
	sum, err := Options{Fleet: &f}.Simulate(p, reqs, func(r Row) error { b.Add(r); return nil })
	if err != nil {
		t.Fatal(err)
	}
	return sum, b
}

func clientAllowed(b *Breakdown) map[string]int64 {
	m := map[string]int64{}
	for _, c := range b.Clients {
		m[c.Key] = c.Summary.Allowed
	}
	return m
}

// Three instances that count separately let 300 of the buggy partner's requests through where
// 100 a minute were meant, 100 each; sharing one store they let 100 through, as one instance
// would. The normal partner, under its own counter, gets all of its 20 either way.
func TestFleetSeparateVersusShared(t *testing.T) {
	for _, bal := range []Balance{RoundRobin, Random} {
		for _, tc := range []struct {
			stores      StoreMode
			buggy       int64
			perInstance int64 // the buggy partner's approvals on each instance
		}{
			{SeparateStores, 300, 100},
			{SharedStore, 100, -1},
		} {
			f := Fleet{Instances: 3, Stores: tc.stores, Balance: bal, Draw: 7}
			sum, b := runFleet(t, perMinute, f, partnersTraffic)
			got := clientAllowed(b)
			if got["buggy"] != tc.buggy || got["normal"] != 20 {
				t.Errorf("%v stores, %v: allowed buggy %d, normal %d; want %d and 20", tc.stores, bal, got["buggy"], got["normal"], tc.buggy)
			}
			if sum.Allowed != tc.buggy+20 || sum.Offered != 620 {
				t.Errorf("%v stores, %v: summary %+v; want 620 offered, %d allowed", tc.stores, bal, sum, tc.buggy+20)
			}
			var total int64
			for i, s := range b.Instances {
				total += s.Allowed
				if s.Offered == 0 {
					t.Errorf("%v stores, %v: instance %d got no requests", tc.stores, bal, i+1)
				}
			}
			if total != sum.Allowed {
				t.Errorf("%v stores, %v: the instances allowed %d in all; the summary says %d", tc.stores, bal, total, sum.Allowed)
			}
			if tc.perInstance > 0 {
				// Each instance's own counter admits the limit of what it saw.
				per := perInstanceAllowed(t, perMinute, f, "buggy")
				for i, n := range per {
					if n != tc.perInstance {
						t.Errorf("%v stores, %v: instance %d allowed buggy %d; want %d", tc.stores, bal, i+1, n, tc.perInstance)
					}
				}
			}
		}
	}
}

func perInstanceAllowed(t *testing.T, p sluice.Policy, f Fleet, key string) []int64 {
	t.Helper()
	reqs, err := ParseClientTraffic(partnersTraffic)
	if err != nil {
		t.Fatal(err)
	}
	per := make([]int64, f.Instances)
	if _, err := (Options{Fleet: &f}).Simulate(p, reqs, func(r Row) error {
		if r.Key == key && r.Allowed {
			per[r.Instance-1]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return per
}

// Random balance is drawn from Fleet.Draw: the same number deals the same way, another differently,
// and round robin deals in turn.
func TestFleetBalance(t *testing.T) {
	deal := func(f Fleet) []int {
		reqs, _ := ParseClientTraffic(partnersTraffic)
		var got []int
		if _, err := (Options{Fleet: &f}).Simulate(perMinute, reqs, func(r Row) error { got = append(got, r.Instance); return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	a, b, c := deal(Fleet{Instances: 3, Balance: Random, Draw: 1}), deal(Fleet{Instances: 3, Balance: Random, Draw: 1}), deal(Fleet{Instances: 3, Balance: Random, Draw: 2})
	if len(a) != 620 {
		t.Fatalf("%d rows", len(a))
	}
	same, turn := true, true
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("draw 1 dealt request %d to %d, then to %d", i+1, a[i], b[i])
		}
		same = same && a[i] == c[i]
	}
	if same {
		t.Error("--draw 1 and --draw 2 dealt every request alike")
	}
	for i, n := range deal(Fleet{Instances: 3, Stores: SeparateStores}) {
		turn = turn && n == i%3+1
	}
	if !turn {
		t.Error("round robin did not deal in turn")
	}
}

// In the shared store's outage each instance answers with its failure mode: open admits all,
// closed refuses all (no Retry-After), local gives each instance 1/3 of the policy on its own
// memory; before and after, the store decides.
func TestFleetOutage(t *testing.T) {
	// 5 a second for 3 minutes against 100 a minute; the store is down in the second minute.
	const traffic = "a: 5/s for 3m"
	outage := func(m sluice.FailureMode) *Outage {
		return &Outage{FromMicros: 60_000_000, ToMicros: 120_000_000, OnError: m}
	}
	for _, tc := range []struct {
		mode         sluice.FailureMode
		fallback     string
		inOutage     int64 // allowed in the second minute
		open, closed int64
		local        int64
	}{
		{sluice.FailOpen, FallbackOpen, 300, 300, 0, 0},
		{sluice.FailClosed, FallbackClosed, 0, 0, 300, 0},
		{sluice.FailLocal, FallbackLocal, 99, 0, 0, 300}, // 3 instances × floor(100/3)
	} {
		f := Fleet{Instances: 3, Outage: outage(tc.mode)}
		reqs, err := ParseClientTraffic(traffic)
		if err != nil {
			t.Fatal(err)
		}
		perMin := [3]int64{}
		sum, err := Options{Fleet: &f}.Simulate(perMinute, reqs, func(r Row) error {
			m := r.TMicros / 60_000_000
			in := m == 1
			if in != (r.Fallback != "") || in && r.Fallback != tc.fallback {
				t.Fatalf("%v: row at %s ms: fallback %q", tc.mode, FormatMillis(r.TMicros), r.Fallback)
			}
			if r.Fallback == FallbackClosed && (r.Allowed || r.RetryAfterMicros != 0) {
				t.Fatalf("%v: a fail-closed row %+v; want refused without a Retry-After", tc.mode, r)
			}
			if r.Allowed {
				perMin[m]++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if perMin != [3]int64{100, tc.inOutage, 100} {
			t.Errorf("%v: allowed per minute %v; want [100 %d 100]", tc.mode, perMin, tc.inOutage)
		}
		if sum.Open != tc.open || sum.Closed != tc.closed || sum.Local != tc.local {
			t.Errorf("%v: fallbacks open %d, closed %d, local %d; want %d, %d, %d", tc.mode, sum.Open, sum.Closed, sum.Local, tc.open, tc.closed, tc.local)
		}
	}
}

func TestFleetStoreErrors(t *testing.T) {
	for _, tc := range []struct {
		f    Fleet
		want string
	}{
		{Fleet{Instances: 2, Stores: SeparateStores, Outage: &Outage{FromMicros: 0, ToMicros: 1}}, "separate stores"},
		{Fleet{Instances: 2, Outage: &Outage{FromMicros: 5, ToMicros: 5}}, "want 0 ≤ from < to"},
		{Fleet{Instances: 2, Outage: &Outage{FromMicros: -1, ToMicros: 5}}, "want 0 ≤ from < to"},
		{Fleet{Instances: 2, Outage: &Outage{ToMicros: 5, OnError: 9}}, "unknown failure mode"},
		{Fleet{Instances: 2, Balance: 5}, "unknown balance"},
	} {
		if _, err := (Options{Fleet: &tc.f}).NewSession(perMinute, 1); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v; want one saying %q", tc.f, err, tc.want)
		}
	}
}

func TestParseClientTraffic(t *testing.T) {
	reqs, err := ParseClientTraffic("buggy: 3 at once; idle 1s; 1 at once; normal: 1/s for 2s")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range reqs {
		got = append(got, r.Key+"@"+FormatMillis(r.TMicros))
	}
	want := "buggy@0 buggy@0 buggy@0 normal@0 buggy@1000 normal@1000"
	if strings.Join(got, " ") != want {
		t.Errorf("got %s; want %s", strings.Join(got, " "), want)
	}
	// A client may be named as the default key is: alone, it is still a client's pattern.
	reqs, err = ParseClientTraffic("k: 2 at once")
	if err != nil || len(reqs) != 2 || reqs[1].Key != DefaultKey {
		t.Errorf("client k alone: %v, %v", reqs, err)
	}
	// Without names it is ParseTraffic's, key "k"; before the first name, too.
	reqs, err = ParseClientTraffic("2 at once; a: 1 at once")
	if err != nil || len(reqs) != 3 || reqs[0].Key != DefaultKey || reqs[2].Key != "a" {
		t.Errorf("unnamed then named: %v, %v", reqs, err)
	}
	for _, tc := range []struct{ pattern, want string }{
		{"a: 1 at once; a: 2 at once", `client "a" is named twice`},
		{"a: 1 at once; b: 5 per second", `traffic of client "b": traffic segment 1 "5 per second": want`},
		{"a: 600000 at once; b: 600000 at once", `client "b": the clients would make more than 1000000 requests`},
		{"a: ", "empty"},
		{"", "empty"},
	} {
		if _, err := ParseClientTraffic(tc.pattern); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v; want one saying %q", tc.pattern, err, tc.want)
		}
	}
}

// Each call to the shared store costs its latency: without budgets every request waits one
// round trip; with budgets of 10, only the request of each instance that takes one.
func TestFleetStoreLatency(t *testing.T) {
	for _, tc := range []struct {
		budget       sluice.LocalBudget
		waited       int // rows that waited for the store
		totalLatency int64
	}{
		{sluice.LocalBudget{}, 30, 30 * 2000},
		{sluice.LocalBudget{Size: 10, MaxAge: time.Minute}, 3, 3 * 2000},
	} {
		f := Fleet{Instances: 3, Budget: tc.budget, StoreLatency: 2 * time.Millisecond}
		reqs, _ := ParseClientTraffic("a: 30 at once")
		waited := 0
		sum, err := Options{Fleet: &f}.Simulate(perMinute, reqs, func(r Row) error {
			if !r.HasLatency || r.LatencyMicros != 0 && r.LatencyMicros != 2000 {
				t.Fatalf("budget %d: row %+v", tc.budget.Size, r)
			}
			if r.LatencyMicros > 0 {
				waited++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if waited != tc.waited || !sum.Latency || sum.TotalLatencyMicros != tc.totalLatency || sum.MaxLatencyMicros != 2000 || sum.Allowed != 30 {
			t.Errorf("budget %d: %d waited, summary %+v; want %d, total %d µs", tc.budget.Size, waited, sum, tc.waited, tc.totalLatency)
		}
	}
	for _, f := range []Fleet{
		{Instances: 2, Stores: SeparateStores, StoreLatency: time.Millisecond},
		{Instances: 2, StoreLatency: -time.Millisecond},
		{Instances: 2, StoreLatency: time.Nanosecond},
	} {
		if _, err := (Options{Fleet: &f}).NewSession(perMinute, 1); err == nil || !strings.Contains(err.Error(), "store latency") {
			t.Errorf("%+v: error %v; want one about the store latency", f, err)
		}
	}
}
