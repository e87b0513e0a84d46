package gateway

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

// A million distinct keys (an address flood with a spoofed source each) keep the sketch at its
// k counters per shard, and the few true heavy hitters among them are found, each with a count that is
// never under its true count and over it by at most its error, itself at most N/k.
func TestTopKBoundedAndFindsHeavyHitters(t *testing.T) {
	const k, distinct = 64, 1_000_000
	tk := newTopK(k, time.Minute)
	now := time.Unix(1_700_000_000, 0)
	heavy := []string{"ip:203.0.113.1", "ip:203.0.113.2", "ip:203.0.113.3", "ip:198.51.100.9"}
	// Each heavy key has 2% of the stream (over N/k = 1.56%); the rest are a million others.
	truth := map[string]uint64{}
	rng := rand.New(rand.NewPCG(1, 2))
	n := uint64(0)
	noise := 0
	for noise < distinct {
		var key string
		if rng.IntN(100) < 2*len(heavy) {
			key = heavy[rng.IntN(len(heavy))]
			truth[key]++
		} else {
			key = fmt.Sprintf("ip:10.%d.%d.%d", noise>>16, noise>>8&255, noise&255)
			noise++
		}
		tk.add(key, now, [2]int64{})
		n++
	}
	if s := tk.size(); s > 4*k*topKShards {
		t.Fatalf("the sketch holds %d entries after %d distinct keys, want at most %d", s, distinct, 4*k*topKShards)
	}
	top, total := tk.top(now, len(heavy))
	if total != n {
		t.Fatalf("total %d, want %d", total, n)
	}
	found := map[string]Hitter{}
	for _, h := range top {
		found[h.Key] = h
	}
	for _, key := range heavy {
		h, ok := found[key]
		if !ok {
			t.Fatalf("heavy hitter %s (%d of %d) not in the top %d: %+v", key, truth[key], n, len(heavy), top)
		}
		if h.Count < truth[key] || h.Count-h.Error > truth[key] || h.Error > n/k {
			t.Fatalf("%s: count %d ± %d, true %d, bound N/k %d", key, h.Count, h.Error, truth[key], n/k)
		}
	}
}

// Fewer keys than counters are counted exactly; a report covers the current window and the one
// before it, and forgets older ones.
func TestTopKWindows(t *testing.T) {
	tk := newTopK(4, time.Minute)
	t0 := time.Unix(1_700_000_040, 0).Truncate(time.Minute)
	for i := 0; i < 5; i++ {
		tk.add("a", t0, [2]int64{})
	}
	tk.add("b", t0, [2]int64{})
	tk.add("a", t0.Add(time.Minute), [2]int64{})
	top, total := tk.top(t0.Add(time.Minute+time.Second), 10)
	if total != 7 || len(top) != 2 || top[0] != (Hitter{Key: "a", Count: 6, seen: 6}) || top[1] != (Hitter{Key: "b", Count: 1, seen: 1}) {
		t.Fatalf("two windows: %+v (total %d), want a 6, b 1 exactly", top, total)
	}
	top, total = tk.top(t0.Add(2*time.Minute), 10) // the first window is two old: gone
	if total != 1 || len(top) != 1 || top[0].Key != "a" || top[0].Count != 1 {
		t.Fatalf("a window later: %+v (total %d), want a 1", top, total)
	}
	if top, total = tk.top(t0.Add(10*time.Minute), 10); total != 0 || len(top) != 0 {
		t.Fatalf("long after: %+v (total %d), want nothing", top, total)
	}
}

// The address table stays bounded however many addresses clients come from, and an address behind
// one past sharedMaxNames is noted as "more", not kept.
func TestSharedAddrsBounded(t *testing.T) {
	s := newSharedAddrs()
	now := time.Unix(1_700_000_000, 0)
	behind := netip.MustParseAddr("192.0.2.1")
	for i := 0; i < 3*sharedMaxAddrs; i++ {
		s.record(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), behind, false, now)
	}
	if n := s.size(); n > sharedMaxAddrs || n < sharedMaxAddrs*3/4 {
		t.Fatalf("%d addresses kept, want at most %d (and most of them: the shards are nearly even)", n, sharedMaxAddrs)
	}
	shared := netip.MustParseAddr("10.0.0.1") // among the first: in the table
	for i := 0; i < sharedMaxNames+3; i++ {
		s.record(shared, netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), i == 2, now)
	}
	got := s.shared(now)
	if len(got) != 1 || got[0].Address != "10.0.0.1" || len(got[0].Clients) != sharedMaxNames || !got[0].More ||
		len(got[0].Refused) != 1 || got[0].Refused[0] != "192.0.2.2" {
		t.Fatalf("shared: %+v", got)
	}
	if got := s.shared(now.Add(sharedTTL + time.Second)); len(got) != 0 {
		t.Fatalf("after the TTL: %+v, want none", got)
	}
}

func TestRoundUp2(t *testing.T) {
	for _, c := range [][2]int64{{1, 1}, {6, 6}, {99, 99}, {100, 100}, {101, 110}, {137, 140}, {1201, 1300}, {5000, 5000}} {
		if got := roundUp2(c[0]); got != c[1] {
			t.Errorf("roundUp2(%d) = %d, want %d", c[0], got, c[1])
		}
	}
}

// A client refused at its limit in some windows, never early, gets a suggested limit from the
// 95th percentile of its per-window demand; one early retry in the windows withdraws it (its
// refusals are then its own doing), and so does a peak under its limit.
func TestUsageRingSuggestsLimit(t *testing.T) {
	p := sluice.Policy{Name: "tight", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Second}
	t0 := time.Unix(1_700_000_000, 0)
	var u usageRing
	// 20 windows: 19 asking for 90..108 (108 the highest: 100 allowed, 8 refused), one for 300.
	for i := 0; i < 20; i++ {
		demand := int64(90 + i)
		if i == 19 {
			demand = 300
		}
		at := t0.Add(time.Duration(i) * time.Second)
		for j := int64(0); j < demand; j++ {
			ok := j < p.Limit
			u.record(p, at, 1, ok, !ok, false)
		}
	}
	now := t0.Add(20 * time.Second)
	l, ok := u.low("steady", "tight", now)
	// Nearest rank 95th of 20 windows is the 19th: 108 (the 300 is the one window over it).
	if !ok || l.Refused != 36+200 /* 101..108 refuse 1..8, 300 refuses 200 */ || l.PeakAllowed != 100 || l.PeakDemand != 300 ||
		l.P95Demand != 108 || l.SuggestedLimit != 110 || l.Active != 20 {
		t.Fatalf("low: %+v, %v", l, ok)
	}
	u.record(p, now, 1, false, true, true) // one early retry
	if l, ok := u.low("steady", "tight", now); ok {
		t.Fatalf("with an early retry: %+v, want no finding", l)
	}
	if _, ok := u.low("steady", "tight", now.Add(usageWindows*time.Second+time.Second)); ok {
		t.Fatal("long after: a finding, want none")
	}
}

// Separate counters: the memory store is warned of (it cannot see the other instances); Redis
// shares the counters, and the registry's live count is shown.
func TestDiagnosisCounting(t *testing.T) {
	d := newDiagnosis()
	now := time.Unix(1_700_000_000, 0)
	mem := d.snapshot(now, &config.Config{Store: config.Store{Type: config.StoreMemory}}, nil)
	if mem.Counting.Shared || len(mem.Findings) != 1 || mem.Findings[0].Kind != "separate_counters" || mem.Findings[0].Do == "" {
		t.Fatalf("memory: %+v %+v", mem.Counting, mem.Findings)
	}
	// With no traffic every list is [] (the page maps over them), never null.
	if b, err := json.Marshal(mem); err != nil || strings.Contains(string(b), "null") {
		t.Fatalf("an empty diagnosis in JSON: %s %v", b, err)
	}
	red := d.snapshot(now, &config.Config{Store: config.Store{Type: config.StoreRedis}}, &FleetStats{Instances: 3})
	if !red.Counting.Shared || red.Counting.Instances != 3 || len(red.Findings) != 0 {
		t.Fatalf("redis: %+v %+v", red.Counting, red.Findings)
	}
}

// A finding's durations read at their scale: 0.1 ms below a millisecond, ms below a minute,
// seconds above (a day's Retry-After to the millisecond was noise).
func TestMsDuration(t *testing.T) {
	for ms, want := range map[float64]string{0.04321: "0s", 0.4321: "400µs", 2.345: "2ms", 59999.4: "59.999s", 58058965.3: "16h7m39s"} {
		if got := msDuration(ms).String(); got != want {
			t.Errorf("msDuration(%v) = %s, want %s", ms, got, want)
		}
	}
}
