package redis_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestFleetHistory: two instances add their counts to the fleet's slots and a third reads the
// sums back, each slot by its number; a slot no one added to is left out. Each slot is one key
// under the prefix, in the registry's slot, named by its number only, that lives a little over
// an hour; another fleet on the same Redis has slots of its own. Reading more than an hour of
// slots at once is refused.
func TestFleetHistory(t *testing.T) {
	srv := redistest.Start(t)
	opts := redis.Options{Prefix: "hist-test:"}
	a := openFleet(t, fleetStore(t, srv, opts), "gw-a")
	b := openFleet(t, fleetStore(t, srv, opts), "gw-b")
	reader := openFleet(t, fleetStore(t, srv, opts), "gw-r")
	const n = 180_000_000
	adds := []struct {
		f      *redis.Fleet
		slot   int64
		counts map[string]int64
	}{
		{a, n, map[string]int64{"allowed": 10, "refused": 3, "instances": 1, "r:partner-a": 3}},
		{b, n, map[string]int64{"allowed": 7, "refused": 5, "instances": 1, "r:partner-a": 1, "r:partner-b": 4}},
		{a, n + 2, map[string]int64{"allowed": 1 << 40, "instances": 1}},
	}
	for _, add := range adds {
		if err := add.f.AddHistory(bg, add.slot, add.counts); err != nil {
			t.Fatalf("%s: AddHistory(%d): %v", add.f.ID(), add.slot, err)
		}
	}
	got, err := reader.History(bg, n-1, n+3)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]map[string]int64{
		n:     {"allowed": 17, "refused": 8, "instances": 2, "r:partner-a": 4, "r:partner-b": 4},
		n + 2: {"allowed": 1 << 40, "instances": 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the fleet's slots: %v, want %v", got, want)
	}
	// An add sent again (its answer lost, or retried after an outage) counts once: each instance's
	// counts are set, not added to.
	for range 3 {
		if err := adds[0].f.AddHistory(bg, adds[0].slot, adds[0].counts); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := reader.History(bg, n-1, n+3); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after a's add of slot n sent three times more: %v (%v), want %v", got, err, want)
	}
	key := "hist-test:{hist-test:instances}:history:180000000"
	if ttl := mustInt(t, srv, "PTTL", key); ttl <= int64(time.Hour/time.Millisecond) || ttl > int64(redis.HistoryTTL/time.Millisecond) {
		t.Errorf("PTTL of %s = %d ms; want a little over an hour (at most %v)", key, ttl, redis.HistoryTTL)
	}
	keys := mustDo(t, srv, "KEYS", "*history*")
	if strings.Count(keys, "history") != 2 || strings.Contains(keys, "partner") {
		t.Errorf("the history's keys: %q; want two, named by their slot only", keys)
	}

	other, err := fleetStore(t, srv, opts).Fleet(redis.FleetOptions{Name: "llm", ID: "gw-llm"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.AddHistory(bg, n, map[string]int64{"allowed": 1}); err != nil {
		t.Fatal(err)
	}
	if got, err := other.History(bg, n, n); err != nil || got[n]["allowed"] != 1 {
		t.Fatalf("fleet llm's slot: %v %v; want its own count, 1", got, err)
	}
	if got, err := reader.History(bg, n, n); err != nil || got[n]["allowed"] != 17 {
		t.Fatalf("the default fleet's slot after llm's add: %v %v; want 17", got, err)
	}
	if _, err := reader.History(bg, n, n+redis.MaxHistorySlots); err == nil || !strings.Contains(err.Error(), "at most 360") {
		t.Fatalf("reading 361 slots: %v; want an error naming the bound", err)
	}
}

// TestFleetHistoryCluster: on a Redis Cluster an hour's slots are read in one call (they share
// the registry's slot): instances connected through different nodes add to the same slots.
func TestFleetHistoryCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	a, b := openFleet(t, nodeStore(t, addrs[0]), "gw-a"), openFleet(t, nodeStore(t, addrs[2]), "gw-b")
	const n = 180_000_000
	for i := int64(0); i < redis.MaxHistorySlots; i++ {
		for _, f := range []*redis.Fleet{a, b} {
			if err := f.AddHistory(bg, n+i, map[string]int64{"allowed": i, "instances": 1}); err != nil {
				t.Fatalf("%s: AddHistory(%d) on the cluster: %v", f.ID(), n+i, err)
			}
		}
	}
	got, err := openFleet(t, nodeStore(t, addrs[1]), "gw-r").History(bg, n, n+redis.MaxHistorySlots-1)
	if err != nil {
		t.Fatalf("an hour of slots on the cluster: %v", err)
	}
	if len(got) != redis.MaxHistorySlots {
		t.Fatalf("%d slots read, want %d", len(got), redis.MaxHistorySlots)
	}
	for i := int64(0); i < redis.MaxHistorySlots; i++ {
		if s := got[n+i]; s["allowed"] != 2*i || s["instances"] != 2 {
			t.Fatalf("slot %d on the cluster: %v; want allowed %d from 2 instances", i, s, 2*i)
		}
	}
}
