package redis_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// fleetStore is openStore with a timeout of 5 s unless opts sets one: the registry's tests wait for
// heartbeats, not for a tight timeout, which a busy machine may miss (connecting included).
func fleetStore(t *testing.T, srv *redistest.Server, opts redis.Options) *redis.Store {
	t.Helper()
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	return openStore(t, srv, opts)
}

// nodeStore is a store connected through one node of a Redis Cluster (it finds the others).
func nodeStore(t *testing.T, addr string) *redis.Store {
	t.Helper()
	s, err := redis.New(redis.Options{Addrs: []string{addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// openFleet returns instance id's entry in the registry of st, closed when the test ends.
func openFleet(t *testing.T, st *redis.Store, id string) *redis.Fleet {
	t.Helper()
	f, err := st.Fleet(redis.FleetOptions{ID: id})
	if err != nil {
		t.Fatalf("Fleet(%q): %v", id, err)
	}
	t.Cleanup(f.Close)
	return f
}

func beat(t *testing.T, f *redis.Fleet) {
	t.Helper()
	if err := f.Beat(bg); err != nil {
		t.Fatalf("%s: Beat: %v", f.ID(), err)
	}
}

// beatAgain is beat on a Redis just restarted: the store's connections find it gone and are
// made again, so the first heartbeats may fail.
func beatAgain(t *testing.T, f *redis.Fleet) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for err := f.Beat(bg); err != nil; err = f.Beat(bg) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: no heartbeat reached the restarted Redis in 5 s: %v", f.ID(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ids(v redis.FleetView) string {
	var s []string
	for _, in := range v.Instances {
		s = append(s, in.ID)
	}
	return strings.Join(s, " ")
}

// TestFleetRegisterCount: three instances (three stores, as three processes would have) on one
// Redis register; each heartbeat answers the live count and lists the instances, the most
// recently heard from first, with when Redis last heard from them. The registry is one sorted set
// under the store's prefix, with a TTL; before any heartbeat an instance counts itself alone.
func TestFleetRegisterCount(t *testing.T) {
	srv := redistest.Start(t)
	var fleets []*redis.Fleet
	for _, id := range []string{"gw-a", "gw-b", "gw-c"} {
		fleets = append(fleets, openFleet(t, fleetStore(t, srv, redis.Options{Prefix: "fleet-test:"}), id))
	}
	if n := fleets[0].Size(); n != 1 {
		t.Fatalf("Size before any heartbeat = %d; want 1", n)
	}
	if v := fleets[0].View(); v.Count != 0 || !v.At.IsZero() || v.Self != "gw-a" {
		t.Fatalf("View before any heartbeat = %+v; want Self gw-a, no count", v)
	}
	before := redisTime(t, srv)
	for i, f := range fleets {
		beat(t, f)
		if n := f.Size(); n != i+1 {
			t.Errorf("%s after its first heartbeat: Size %d; want %d", f.ID(), n, i+1)
		}
	}
	beat(t, fleets[0])
	v := fleets[0].View()
	if v.Count != 3 || fleets[0].Size() != 3 || ids(v) != "gw-a gw-c gw-b" || v.Err != "" {
		t.Fatalf("gw-a's view: %+v (ids %q); want 3 live, gw-a gw-c gw-b", v, ids(v))
	}
	after := redisTime(t, srv)
	for _, in := range append(v.Instances, redis.FleetInstance{ID: "(at)", LastSeen: v.At}) {
		if us := in.LastSeen.UnixMicro(); us < before || us > after {
			t.Errorf("%s last seen at %d µs; want Redis's clock, within [%d, %d]", in.ID, us, before, after)
		}
	}
	if got := mustInt(t, srv, "ZCARD", "fleet-test:instances"); got != 3 {
		t.Errorf("ZCARD fleet-test:instances = %d; want 3", got)
	}
	if ttl := mustInt(t, srv, "PTTL", "fleet-test:instances"); ttl <= 0 || ttl > int64(redis.DefaultFleetTTL/time.Millisecond) {
		t.Errorf("PTTL of the registry = %d ms; want in (0, %v]", ttl, redis.DefaultFleetTTL)
	}
}

// TestFleetExpiry, on a virtual clock: an instance not heard from for a TTL is removed by the
// next heartbeat of any other (not a microsecond before), and so is every dead one, however many
// — the registry is bounded by the live instances; a heartbeat lists at most FleetListed of them
// but counts them all.
func TestFleetExpiry(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	opts := redis.Options{Clock: clock}
	a := openFleet(t, fleetStore(t, srv, opts), "gw-a")
	b := openFleet(t, fleetStore(t, srv, opts), "gw-b")
	beat(t, a)
	beat(t, b)
	clock.Advance(redis.DefaultFleetTTL - time.Microsecond)
	beat(t, a)
	if n := a.Size(); n != 2 {
		t.Fatalf("a microsecond before gw-b's TTL ends: %d live; want 2", n)
	}
	clock.Advance(time.Microsecond)
	beat(t, a)
	if v := a.View(); v.Count != 1 || ids(v) != "gw-a" {
		t.Fatalf("gw-b not heard from for a TTL: %+v; want gw-a alone", v)
	}
	if r := mustDo(t, srv, "ZSCORE", "rate-limit:instances", "gw-b"); r != "" {
		t.Errorf("gw-b's member is still in the registry (score %q)", r)
	}

	// 200 instances that heartbeat once and die.
	st := fleetStore(t, srv, opts)
	for i := range 200 {
		f, err := st.Fleet(redis.FleetOptions{ID: fmt.Sprintf("dead-%03d", i)})
		if err != nil {
			t.Fatal(err)
		}
		beat(t, f)
		clock.Advance(time.Millisecond)
	}
	beat(t, a)
	if v := a.View(); v.Count != 201 || len(v.Instances) != redis.FleetListed || v.Instances[0].ID != "gw-a" || v.Instances[1].ID != "dead-199" {
		t.Fatalf("with 200 more: count %d, %d listed (first %q); want 201 counted, %d listed, gw-a then dead-199",
			v.Count, len(v.Instances), ids(v)[:20], redis.FleetListed)
	}
	clock.Advance(redis.DefaultFleetTTL / 2) // (gw-a heartbeats meanwhile: else it is gone too, and the registry begins anew)
	beat(t, a)
	clock.Advance(redis.DefaultFleetTTL / 2)
	beat(t, a)
	if n, card := a.Size(), mustInt(t, srv, "ZCARD", "rate-limit:instances"); n != 1 || card != 1 {
		t.Errorf("a TTL after they died: Size %d, ZCARD %d; want 1 and 1", n, card)
	}
}

// TestFleetLeave: an instance that closes its entry leaves the registry at once; the others
// count one fewer at their next heartbeat, not a TTL later. The last one to leave leaves no key.
func TestFleetLeave(t *testing.T) {
	srv := redistest.Start(t)
	st := fleetStore(t, srv, redis.Options{})
	a, b := openFleet(t, st, "gw-a"), openFleet(t, st, "gw-b")
	beat(t, a)
	beat(t, b)
	b.Close()
	beat(t, a)
	if v := a.View(); v.Count != 1 || ids(v) != "gw-a" {
		t.Fatalf("after gw-b left: %+v; want gw-a alone", v)
	}
	a.Close()
	if n := mustInt(t, srv, "EXISTS", "rate-limit:instances"); n != 0 {
		t.Errorf("the registry is still in Redis after the last instance left")
	}
}

// TestFleetRedisDown: while Redis does not answer, heartbeats fail with ErrStoreUnavailable and
// the last live count seen stays (the fallback's share), the view saying why.
func TestFleetRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	st := fleetStore(t, srv, redis.Options{})
	a := openFleet(t, st, "gw-a")
	beat(t, openFleet(t, st, "gw-b"))
	beat(t, a)
	srv.Kill()
	err := a.Beat(bg)
	if !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("Beat with Redis killed: %v; want ErrStoreUnavailable", err)
	}
	if v := a.View(); a.Size() != 2 || v.Count != 2 || v.Err == "" {
		t.Errorf("with Redis killed: Size %d, view %+v; want the last count, 2, and the error", a.Size(), v)
	}
}

// TestFleetGuardShare: a limiter failing to local with WithFleetFallback decides, while Redis is
// down, on 1/n of its policy, n the fleet's size its instance last saw: exactly 10 of a fixed
// window of 31 with three instances, then (Redis back, one instance gone, and a TTL later, when
// the registry is whole again) exactly 15 with two.
func TestFleetGuardShare(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	opts := redis.Options{Clock: clock}
	st := fleetStore(t, srv, opts)
	a := openFleet(t, st, "gw-a")
	others := []*redis.Fleet{openFleet(t, fleetStore(t, srv, opts), "gw-b"), openFleet(t, fleetStore(t, srv, opts), "gw-c")}
	// The local store runs on a frozen clock: its window cannot roll over while approvals are counted.
	local := memory.New(memory.WithClock(sluice.NewManualClock(time.Unix(1_700_000_000, 0))))
	lim, err := sluice.NewLimiter(st, sluice.Policy{Name: "fleet-share", Algorithm: sluice.FixedWindow, Limit: 31, Period: time.Hour},
		sluice.WithFleetFallback(local, a.Size))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sluice.NewLimiter(st, sluice.Policy{Name: "x", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second},
		sluice.WithFleetFallback(nil, a.Size)); err == nil || !strings.Contains(err.Error(), "WithFleetFallback") {
		t.Errorf("WithFleetFallback without a local store: %v; want an error naming it", err)
	}
	approvals := func(key string, wantLimit int64) int {
		t.Helper()
		n := 0
		for range 40 {
			d, err := lim.Allow(bg, key)
			if err != nil || d.Fallback != sluice.FallbackLocal || d.Limit != wantLimit {
				t.Fatalf("%s with Redis down: %+v %v; want a local decision of limit %d", key, d, err, wantLimit)
			}
			if d.Allowed {
				n++
			}
		}
		return n
	}
	for _, f := range others {
		beat(t, f)
	}
	beat(t, a)
	if d, err := lim.Allow(bg, "up"); err != nil || d.Fallback != sluice.NoFallback || d.Limit != 31 {
		t.Fatalf("with Redis up: %+v %v; want Redis's decision of the whole policy", d, err)
	}
	srv.Kill()
	if n := approvals("three", 10); n != 10 {
		t.Errorf("three instances: %d of 40 approved locally; want floor(31/3) = 10", n)
	}
	srv.Restart()
	others[1].Close() // (leaving a Redis that no longer has it: nothing to remove)
	beatAgain(t, others[0])
	beatAgain(t, a)
	if v := a.View(); a.Size() != 3 || v.Count != 2 || v.Size != 3 {
		t.Fatalf("just after the restart, with gw-c gone: size %d, view %+v; want 2 live, the size still 3 (the registry is not whole yet)", a.Size(), v)
	}
	for range 2 { // a TTL on: the registry is whole, every live instance has heartbeat
		clock.Advance(redis.DefaultFleetTTL / 2)
		beatAgain(t, others[0]) // (the stores' other connections find the restart too)
		beatAgain(t, a)
	}
	if n := a.Size(); n != 2 {
		t.Fatalf("a TTL after the restart, with gw-c gone: size %d; want 2", n)
	}
	srv.Kill()
	if n := approvals("two", 15); n != 15 {
		t.Errorf("two instances: %d of 40 approved locally; want floor(31/2) = 15", n)
	}
}

// TestFleetACL: the ACL user of ACLRules can heartbeat with counts and leave (the script's
// sorted-set and hash commands are granted), under the default prefix only.
func TestFleetACL(t *testing.T) {
	srv := redistest.Start(t)
	if out, err := srv.Do(append([]string{"ACL", "SETUSER", "sluice", "on", ">s3cret"}, strings.Fields(redis.ACLRules)...)...); err != nil {
		t.Fatalf("ACL SETUSER: %v %s", err, out)
	}
	st := fleetStore(t, srv, redis.Options{Username: "sluice", Password: "s3cret"})
	var h heldCounts
	h.set(partner(1, 3, 0))
	f := countsFleet(t, st, "gw-acl", &h)
	beat(t, f)
	if f.Size() != 1 {
		t.Fatalf("Size %d as the ACL user; want 1", f.Size())
	}
	if c := countsOf(f.View()); len(c["gw-acl"]) != 1 || c["gw-acl"][0].Current != 3 {
		t.Fatalf("the ACL user's counts read back: %+v; want its 3", c)
	}
	h.set()
	beat(t, f) // (HDEL)
	h.set(partner(1, 3, 0))
	beat(t, f)
	f.Close()
	if n := mustInt(t, srv, "EXISTS", "rate-limit:instances", redis.SharesKey(redis.DefaultPrefix)); n != 0 {
		t.Errorf("the ACL user's leave did not remove the registry and its counts")
	}
	other := openFleet(t, fleetStore(t, srv, redis.Options{Username: "sluice", Password: "s3cret", Prefix: "elsewhere:"}), "gw-acl")
	if err := other.Beat(bg); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("a heartbeat under a prefix the ACL does not grant: %v; want NOPERM", err)
	}
}

// TestFleetStart: Start heartbeats at once and then every interval, in the background, until
// Close, which removes the instance.
func TestFleetStart(t *testing.T) {
	srv := redistest.Start(t)
	st := fleetStore(t, srv, redis.Options{})
	f, err := st.Fleet(redis.FleetOptions{ID: "gw-bg", Interval: 20 * time.Millisecond, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Start()
	var last time.Time
	deadline := time.Now().Add(10 * time.Second)
	for beats := 0; beats < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("Start: %d heartbeats in 10 s at an interval of 20 ms (view %+v)", beats, f.View())
		}
		if v := f.View(); v.At.After(last) {
			beats, last = beats+1, v.At
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.Close()
	if r := mustDo(t, srv, "ZSCORE", "rate-limit:instances", "gw-bg"); r != "" {
		t.Errorf("after Close, gw-bg is still registered (score %q)", r)
	}
}

// TestFleetOptions: an id that is not printable ASCII, or too long, and a TTL not above the
// interval are refused, naming what is wrong; the default id names the host and the process.
func TestFleetOptions(t *testing.T) {
	srv := redistest.Start(t)
	st := fleetStore(t, srv, redis.Options{})
	for _, c := range []struct {
		opts redis.FleetOptions
		want string
	}{
		{redis.FleetOptions{ID: "gw a"}, `instance id "gw a": byte 2`},
		{redis.FleetOptions{ID: "gw\n"}, "not printable ASCII"},
		{redis.FleetOptions{ID: strings.Repeat("x", redis.MaxFleetID+1)}, "instance id of 129 bytes; at most 128"},
		{redis.FleetOptions{Interval: time.Second, TTL: time.Second}, "TTL 1s must be more than the heartbeat interval 1s"},
		{redis.FleetOptions{Interval: -time.Second}, "must be more than the heartbeat interval -1s"},
	} {
		if _, err := st.Fleet(c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Fleet(%+v): %v; want an error saying %q", c.opts, err, c.want)
		}
	}
	f, err := st.Fleet(redis.FleetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if id := f.ID(); !strings.HasPrefix(id, host+"-"+strconv.Itoa(os.Getpid())+"-") || len(id) != len(host)+len(strconv.Itoa(os.Getpid()))+10 {
		t.Errorf("default id %q; want %s-%d-<8 hex digits>", id, host, os.Getpid())
	}
	g, _ := st.Fleet(redis.FleetOptions{})
	if g.ID() == f.ID() {
		t.Errorf("two default ids are both %q", f.ID())
	}
}

// TestFleetCluster: on a Redis Cluster the registry is one key, in one slot: instances connected
// through different nodes count each other.
func TestFleetCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	a, b := openFleet(t, nodeStore(t, addrs[0]), "gw-a"), openFleet(t, nodeStore(t, addrs[2]), "gw-b")
	beat(t, a)
	beat(t, b)
	beat(t, a)
	if v := a.View(); v.Count != 2 || ids(v) != "gw-a gw-b" {
		t.Fatalf("on the cluster: %+v; want gw-a and gw-b", v)
	}
}

// TestFleetShareAfterRestart: two instances failing to local with the fleet's share; Redis is
// killed, restarted empty, and killed again before the second instance heartbeats twice into the
// new registry. The first to heartbeat into it sees itself alone; were that its size, it would
// take all of a limit of 100 and the other half: 150. Its size shrinks only once the registry is
// whole (kept a TTL by this Redis), so the two admit at most 100 in every outage. Later, a
// registry kept a TTL that the other never joined counts one: the share grows then (virtual clock).
func TestFleetShareAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	opts := redis.Options{Clock: clock}
	policy := sluice.Policy{Name: "restart-share", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}
	type instance struct {
		fleet *redis.Fleet
		lim   *sluice.Limiter
	}
	var insts []instance
	for _, id := range []string{"gw-a", "gw-b"} {
		st := fleetStore(t, srv, opts)
		f := openFleet(t, st, id)
		// The local store runs on a frozen clock: its window cannot roll over while approvals are counted.
		local := memory.New(memory.WithClock(sluice.NewManualClock(time.Unix(1_700_000_000, 0))))
		lim, err := sluice.NewLimiter(st, policy, sluice.WithFleetFallback(local, f.Size))
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, instance{f, lim})
	}
	a, b := insts[0], insts[1]
	admitted := func(key string) (total int) {
		t.Helper()
		for _, in := range insts {
			for range 150 {
				d, err := in.lim.Allow(bg, key)
				if err != nil || d.Fallback != sluice.FallbackLocal {
					t.Fatalf("%s with Redis down: %+v %v; want a local decision", in.fleet.ID(), d, err)
				}
				if d.Allowed {
					total++
				}
			}
		}
		return total
	}
	beat(t, a.fleet)
	beat(t, b.fleet)
	beat(t, a.fleet)
	srv.Kill()
	if n := admitted("first-outage"); n != 100 {
		t.Errorf("the first outage: %d admitted by the two instances; want 100 (50 each)", n)
	}

	srv.Restart() // empty
	beatAgain(t, a.fleet)
	beatAgain(t, b.fleet)
	if v := a.fleet.View(); v.Count != 1 || a.fleet.Size() != 2 {
		t.Errorf("gw-a, first into the new registry: view %+v, size %d; want 1 live, the size still 2", v, a.fleet.Size())
	}
	srv.Kill()
	if n := admitted("second-outage"); n > 100 {
		t.Errorf("the outage after a restart: %d admitted by the two instances; want at most the limit, 100", n)
	}

	// Redis back, empty again, and gw-b never comes back: a TTL on, the registry that gw-a kept
	// heartbeating into is whole, and counts gw-a alone.
	srv.Restart()
	beatAgain(t, a.fleet)
	for range 2 {
		if a.fleet.Size() != 2 {
			t.Fatalf("gw-a alone in a registry younger than a TTL: size %d; want 2", a.fleet.Size())
		}
		clock.Advance(redis.DefaultFleetTTL / 2)
		beatAgain(t, a.fleet) // (the store's other connections find the restart too)
	}
	if v := a.fleet.View(); a.fleet.Size() != 1 || v.Size != 1 || v.Count != 1 || v.Since.IsZero() {
		t.Errorf("gw-a a TTL into the registry without gw-b: size %d, view %+v; want 1", a.fleet.Size(), v)
	}
}
