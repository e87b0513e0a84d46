package redis_test

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// heldCounts is what an instance's heartbeats carry (set it before a beat; the mutex keeps
// -race honest).
type heldCounts struct {
	mu sync.Mutex
	c  []redis.FleetCount
}

func (h *heldCounts) set(c ...redis.FleetCount) { h.mu.Lock(); h.c = c; h.mu.Unlock() }
func (h *heldCounts) get() []redis.FleetCount {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]redis.FleetCount(nil), h.c...)
}

// countsFleet returns instance id's entry in the registry of st, carrying h at each heartbeat.
func countsFleet(t *testing.T, st *redis.Store, id string, h *heldCounts) *redis.Fleet {
	t.Helper()
	f, err := st.Fleet(redis.FleetOptions{ID: id, Counts: h.get})
	if err != nil {
		t.Fatalf("Fleet(%q): %v", id, err)
	}
	t.Cleanup(f.Close)
	return f
}

// countsOf returns, by instance id, the counts of v's instances.
func countsOf(v redis.FleetView) map[string][]redis.FleetCount {
	out := map[string][]redis.FleetCount{}
	for _, in := range v.Instances {
		out[in.ID] = in.Counts
	}
	return out
}

func partner(window, cur, prev int64) redis.FleetCount {
	return redis.FleetCount{Client: "partner", Policy: "per-hour", Period: time.Hour, Window: window, Current: cur, Previous: prev, Allowed: 100}
}

// TestFleetCountsRoundTrip: three instances' heartbeats carry their approvals of a client (30,
// 20 and 10 in one window) into one hash beside the registry, and every heartbeat reads all of
// them back, exactly, so that any instance knows each one's share. The hash is under the prefix
// (the ACL's pattern), in the registry's slot, expires with it, and a heartbeat carrying no
// approvals removes the instance's field; Leave removes it too.
func TestFleetCountsRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	var held [3]heldCounts
	var fleets []*redis.Fleet
	for i, id := range []string{"gw-a", "gw-b", "gw-c"} {
		fleets = append(fleets, countsFleet(t, fleetStore(t, srv, redis.Options{}), id, &held[i]))
	}
	for i, n := range []int64{30, 20, 10} {
		held[i].set(partner(490_000, n, 0), redis.FleetCount{Client: "anonymous", Policy: "anon", Period: time.Second, Window: 1_764_000_000, Current: n / 10, Allowed: 5})
		beat(t, fleets[i])
	}
	beat(t, fleets[0])
	got := countsOf(fleets[0].View())
	for i, id := range []string{"gw-a", "gw-b", "gw-c"} {
		n := []int64{30, 20, 10}[i]
		want := []redis.FleetCount{partner(490_000, n, 0), {Client: "anonymous", Policy: "anon", Period: time.Second, Window: 1_764_000_000, Current: n / 10, Allowed: 5}}
		if !reflect.DeepEqual(got[id], want) {
			t.Errorf("%s's counts as gw-a read them: %+v; want %+v", id, got[id], want)
		}
	}
	key := "rate-limit:{rate-limit:instances}:shares"
	if k := redis.SharesKey(redis.DefaultPrefix); k != key {
		t.Fatalf("the counts' key is %q; want %q", k, key)
	}
	if n := mustInt(t, srv, "HLEN", key); n != 3 {
		t.Errorf("HLEN %s = %d; want 3 (one field per instance)", key, n)
	}
	if ttl := mustInt(t, srv, "PTTL", key); ttl <= 0 || ttl > int64(redis.DefaultFleetTTL/time.Millisecond) {
		t.Errorf("PTTL of the counts = %d ms; want in (0, %v]", ttl, redis.DefaultFleetTTL)
	}
	if v := mustDo(t, srv, "HGET", key, "gw-c"); v != "v1 0\npartner per-hour 3600000000 490000 10 0 100\nanonymous anon 1000000 1764000000 1 0 5" {
		t.Errorf("gw-c's field: %q", v)
	}

	held[2].set() // nothing approved any more: the field goes
	beat(t, fleets[2])
	if r := mustDo(t, srv, "HEXISTS", key, "gw-c"); r != "0" {
		t.Errorf("gw-c's field after a heartbeat without counts: HEXISTS %s", r)
	}
	if c := countsOf(fleets[2].View()); c["gw-c"] != nil || len(c["gw-a"]) != 2 {
		t.Errorf("gw-c's view after its heartbeat without counts: %+v", c)
	}
	fleets[1].Close()
	if r := mustDo(t, srv, "HEXISTS", key, "gw-b"); r != "0" {
		t.Errorf("gw-b's field after it left: HEXISTS %s", r)
	}
	fleets[0].Close()
	fleets[2].Close()
	if n := mustInt(t, srv, "EXISTS", key, "rate-limit:instances"); n != 0 {
		t.Errorf("%d of the registry's keys are still in Redis after the last instance left", n)
	}
}

// TestFleetCountsExpiry, on a virtual clock: an instance not heard from for a TTL takes its
// counts with it at the next heartbeat of any other (not a microsecond before); 1500 dead ones
// at once too (more than one HDEL batch); and the hash expires with the registry.
func TestFleetCountsExpiry(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	opts := redis.Options{Clock: clock}
	var ha, hb heldCounts
	ha.set(partner(1, 5, 0))
	hb.set(partner(1, 7, 0))
	a := countsFleet(t, fleetStore(t, srv, opts), "gw-a", &ha)
	b := countsFleet(t, fleetStore(t, srv, opts), "gw-b", &hb)
	beat(t, b)
	beat(t, a)
	key := redis.SharesKey(redis.DefaultPrefix)
	clock.Advance(redis.DefaultFleetTTL - time.Microsecond)
	beat(t, a)
	if c := countsOf(a.View()); len(c["gw-b"]) != 1 || c["gw-b"][0].Current != 7 {
		t.Fatalf("a microsecond before gw-b's TTL ends: %+v; want gw-b's 7", c)
	}
	clock.Advance(time.Microsecond)
	beat(t, a)
	if r := mustDo(t, srv, "HEXISTS", key, "gw-b"); r != "0" {
		t.Errorf("gw-b, not heard from for a TTL, still has its counts in Redis")
	}
	if c := countsOf(a.View()); len(c) != 1 {
		t.Errorf("after gw-b's TTL: %+v; want gw-a's counts alone", c)
	}

	st := fleetStore(t, srv, opts)
	var hd heldCounts
	hd.set(partner(1, 1, 0))
	for i := range 1500 {
		f, err := st.Fleet(redis.FleetOptions{ID: fmt.Sprintf("dead-%04d", i), Counts: hd.get})
		if err != nil {
			t.Fatal(err)
		}
		beat(t, f)
	}
	if n := mustInt(t, srv, "HLEN", key); n != 1501 {
		t.Fatalf("HLEN with 1500 more: %d", n)
	}
	clock.Advance(redis.DefaultFleetTTL)
	beat(t, a)
	if n := mustInt(t, srv, "HLEN", key); n != 1 {
		t.Errorf("a TTL after 1500 died: HLEN %d; want 1 (gw-a's)", n)
	}
	// (On a virtual clock the keys' TTL has the store's slack added: compare the two keys.)
	// (The registry read first: the counts' TTL, set by the same script, read after it is no more.)
	if reg, ttl := mustInt(t, srv, "PTTL", "rate-limit:instances"), mustInt(t, srv, "PTTL", key); ttl <= 0 || ttl > reg {
		t.Errorf("PTTL of the counts = %d ms; want in (0, the registry's %d]", ttl, reg)
	}
}

// TestFleetCountsCaps: a heartbeat carries at most MaxFleetCounts counts, those with the most
// approvals (then by name), and says how many it left out; counts with nothing approved are not
// carried, and a name that cannot be carried (a space, a control byte, too long) is dropped and
// counted, never sent.
func TestFleetCountsCaps(t *testing.T) {
	srv := redistest.Start(t)
	var h heldCounts
	var cs []redis.FleetCount
	for i := range 100 {
		cs = append(cs, redis.FleetCount{Client: fmt.Sprintf("c%03d", i), Policy: "p", Period: time.Minute, Window: 7, Current: int64(i + 1)})
	}
	cs = append(cs,
		redis.FleetCount{Client: "idle", Policy: "p", Period: time.Minute, Window: 7},
		redis.FleetCount{Client: "bad name", Policy: "p", Period: time.Minute, Current: 1000},
		redis.FleetCount{Client: "ok", Policy: "bad\npolicy", Period: time.Minute, Current: 1000},
		redis.FleetCount{Client: strings.Repeat("x", redis.MaxFleetID+1), Policy: "p", Period: time.Minute, Current: 1000},
		redis.FleetCount{Client: "zero-period", Policy: "p", Current: 1000})
	h.set(cs...)
	f := countsFleet(t, fleetStore(t, srv, redis.Options{}), "gw-cap", &h)
	beat(t, f)
	v := f.View()
	if len(v.Instances) != 1 {
		t.Fatalf("view: %+v", v)
	}
	in := v.Instances[0]
	if len(in.Counts) != redis.MaxFleetCounts || in.Dropped != 100-redis.MaxFleetCounts+4 {
		t.Fatalf("%d counts carried, %d dropped; want %d carried, %d dropped", len(in.Counts), in.Dropped, redis.MaxFleetCounts, 100-redis.MaxFleetCounts+4)
	}
	if first, last := in.Counts[0], in.Counts[len(in.Counts)-1]; first.Client != "c099" || first.Current != 100 || last.Client != "c036" {
		t.Errorf("carried from %+v to %+v; want the most approved first, c099 to c036", first, last)
	}
	raw := mustDo(t, srv, "HGET", redis.SharesKey(redis.DefaultPrefix), "gw-cap")
	for _, bad := range []string{"bad", "idle", "xxxx", "zero-period"} {
		if strings.Contains(raw, bad) {
			t.Errorf("the counts in Redis carry %q: %q", bad, raw)
		}
	}
}

// TestFleetCountsKey: the counts' hash is under the prefix and in the registry's slot, whether
// the prefix has a hash tag of its own or not; a prefix whose registry no such name shares a
// slot with carries no counts, and the registry still counts.
func TestFleetCountsKey(t *testing.T) {
	for prefix, want := range map[string]string{
		"rate-limit:":    "rate-limit:{rate-limit:instances}:shares",
		"pre{fix}:":      "pre{fix}:instances:shares",
		"{app}rl:":       "{app}rl:instances:shares",
		"odd}:":          "",
		"a{}b:":          "", // (an empty tag is none: the whole name)
		"team-7:limits:": "team-7:limits:{team-7:limits:instances}:shares",
	} {
		got := redis.SharesKey(prefix)
		if got != want {
			t.Errorf("prefix %q: counts at %q; want %q", prefix, got, want)
		}
		if got != "" && (redis.Slot(got) != redis.Slot(prefix+"instances") || !strings.HasPrefix(got, prefix)) {
			t.Errorf("prefix %q: %q is not under the prefix in the registry's slot", prefix, got)
		}
	}
	srv := redistest.Start(t)
	var h heldCounts
	h.set(partner(1, 1, 0))
	f := countsFleet(t, fleetStore(t, srv, redis.Options{Prefix: "odd}:"}), "gw-odd", &h)
	beat(t, f)
	if v := f.View(); v.Count != 1 || v.Instances[0].Counts != nil {
		t.Errorf("under prefix odd}: %+v; want the registry without counts", v)
	}
}

// TestFleetCountsCluster: on a Redis Cluster the counts' hash is in the registry's slot (one
// script, no CROSSSLOT): instances connected through different nodes read each other's counts.
func TestFleetCountsCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	var ha, hb heldCounts
	ha.set(partner(9, 30, 4))
	hb.set(partner(9, 20, 0))
	a, b := countsFleet(t, nodeStore(t, addrs[0]), "gw-a", &ha), countsFleet(t, nodeStore(t, addrs[2]), "gw-b", &hb)
	beat(t, a)
	beat(t, b)
	beat(t, a)
	c := countsOf(a.View())
	if !reflect.DeepEqual(c["gw-a"], []redis.FleetCount{partner(9, 30, 4)}) || !reflect.DeepEqual(c["gw-b"], []redis.FleetCount{partner(9, 20, 0)}) {
		t.Fatalf("on the cluster: %+v", c)
	}
	reg, shares := "rate-limit:instances", redis.SharesKey(redis.DefaultPrefix)
	slotA, err1 := cl.Servers[0].Do("CLUSTER", "KEYSLOT", reg)
	slotB, err2 := cl.Servers[0].Do("CLUSTER", "KEYSLOT", shares)
	if err1 != nil || err2 != nil || slotA != slotB || slotA != fmt.Sprint(redis.Slot(reg)) {
		t.Errorf("CLUSTER KEYSLOT: registry %s, counts %s (%v %v); want one slot, %d", slotA, slotB, err1, err2, redis.Slot(reg))
	}
}
