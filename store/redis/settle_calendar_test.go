package redis_test

// Settlements of calendar policies on Redis: step tables at explicit instants across real
// calendar edges (Europe/Berlin's 23-hour 2026-03-29 and 25-hour 2026-10-25, February into April
// 2026, ISO week 53 of 2026), on a real server (functions and scripts) and a real Cluster, on a
// virtual clock, every settlement and decision equal to the core's (algorithm.Settle, Decide);
// whose clock settles near a boundary (Redis's, never the instance's); an instance days off
// Redis's (asked again around Redis's time); errors; a randomized comparison with the core.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// calSettleStep is one step of a settlement table: a decision of cost at its instant, or (settle
// > 0) the settlement of step settle-1's charge (its At and cost) to actual, followed by a peek.
// allowed and remaining are the decision's, or the peek's.
type calSettleStep struct {
	at        string
	cost      int64
	settle    int
	actual    int64
	allowed   bool
	remaining int64
}

type calSettleTable struct {
	name   string
	policy sluice.Policy
	steps  []calSettleStep
}

// calSettleTables are worked out by hand (the comments); the test also checks them against the
// core, so a wrong table and a wrong store are told apart.
func calSettleTables(t testing.TB) []calSettleTable {
	berlin := mustZone(t, "Europe/Berlin")
	pol := func(name string, alg sluice.Algorithm, limit int64, c algorithm.Calendar) sluice.Policy {
		return sluice.Policy{Name: name, Algorithm: alg, Limit: limit, Calendar: c, Location: berlin}
	}
	dec := func(at string, cost int64, allowed bool, remaining int64) calSettleStep {
		return calSettleStep{at: at, cost: cost, allowed: allowed, remaining: remaining}
	}
	set := func(at string, step int, actual int64, allowed bool, remaining int64) calSettleStep {
		return calSettleStep{at: at, settle: step + 1, actual: actual, allowed: allowed, remaining: remaining}
	}
	return []calSettleTable{
		{"fixed day, Berlin, the 23-hour 2026-03-29", pol("sfd-spring", sluice.FixedWindow, 25, algorithm.Day), []calSettleStep{
			dec("2026-03-28T22:30:00Z", 5, true, 20),              // Saturday 23:30 CET
			set("2026-03-28T23:10:00Z", 0, 2, true, 25),           // Sunday 00:10: Saturday's count no longer counts: no refund
			dec("2026-03-28T23:20:00Z", 4, true, 21),              //
			set("2026-03-29T01:30:00Z", 2, 9, true, 16),           // 03:30 CEST (the clocks jumped): 5 more
			dec("2026-03-29T12:00:00Z", 6, true, 10),              //
			dec("2026-03-29T15:00:00Z", 5, true, 5),               //
			dec("2026-03-29T20:00:00Z", 5, true, 0),               //
			set("2026-03-29T21:59:59.999999Z", 6, 8, false, 0),    // the day's last µs: 3 beyond the limit
			set("2026-03-29T22:00:00Z", 4, 1, true, 25),           // Monday 00:00: the 23-hour day's charge is not refunded
			set("2026-03-29T22:00:00Z", 5, 9, true, 21),           // its extra counts in Monday
			dec("2026-03-29T22:00:00.000001Z", 21, true, 0),       //
			set("2026-03-30T21:59:59.999999Z", 10, 0, true, 25-4), // Monday's charge refunded, in Monday's last µs
			dec("2026-03-30T21:59:59.999999Z", 22, false, 25-4),   //
		}},
		{"sliding day, Berlin, the 25-hour 2026-10-25", pol("ssd-autumn", sluice.SlidingWindow, 10, algorithm.Day), []calSettleStep{
			dec("2026-10-24T12:00:00Z", 4, true, 6),        // Saturday 14:00 CEST
			dec("2026-10-24T13:00:00Z", 2, true, 4),        //
			set("2026-10-24T14:00:00Z", 0, 1, true, 7),     // 3 back from Saturday's count
			dec("2026-10-24T22:00:00Z", 3, true, 4),        // Sunday 00:00 CEST (25 hours): prev 3 at full weight
			dec("2026-10-24T23:00:00Z", 1, true, 3),        // e = 1h: prev weighs 3·24/25 → 3
			dec("2026-10-24T23:00:00Z", 0, true, 3),        // a reservation of nothing (a route that counts only some answers)
			set("2026-10-25T10:30:00Z", 1, 0, true, 5),     // Saturday's 2 back from prev (3 → 1), now weighing 1·12.5/25 → 1
			set("2026-10-25T10:30:00Z", 3, 7, true, 1),     // Sunday's 3 cost 7: cur 8
			dec("2026-10-25T22:59:59.999999Z", 1, true, 0), // Sunday's last µs: cur 9
			set("2026-10-26T03:00:00Z", 8, 0, true, 3),     // Monday 04:00 CET: Sunday's 1 back from Monday's prev (9 → 8), weighing 8·20/24 → 7
			set("2026-10-27T00:00:00Z", 4, 0, true, 10),    // Tuesday 01:00: Sunday's charge, two windows ago: nothing to give back
			set("2026-10-27T00:00:00Z", 5, 2, true, 8),     // Sunday's reservation of nothing cost 2: in Tuesday (Sunday not contiguous)
			dec("2026-10-27T00:00:00Z", 9, false, 8),       //
			dec("2026-10-27T22:59:59.999999Z", 8, true, 0), // Tuesday's last µs
			set("2026-10-27T23:00:00Z", 13, 2, true, 10-4), // Wednesday 00:00: the 8 cost 2, back from Tuesday's 10 (→ 4), Wednesday's prev at full weight
		}},
		{"sliding month, Berlin, February into April 2026", pol("ssm", sluice.SlidingWindow, 100, algorithm.Month), []calSettleStep{
			dec("2026-02-20T12:00:00Z", 60, true, 40),
			dec("2026-02-28T22:59:59Z", 30, true, 10),         // February's last second
			set("2026-03-01T00:00:00Z", 1, 50, false, 0),      // March (743 hours), e = 1h: 20 more count in March, prev 90 weighing 89.9
			set("2026-03-01T00:00:00Z", 0, 0, true, 50),       // February's 60 back from March's prev (90 → 30)
			dec("2026-03-31T21:59:59.999999Z", 80, false, 79), // March's last µs: cur 20, prev still weighs 30µs/743h → 1
			dec("2026-03-31T21:59:59.999999Z", 79, true, 0),
			set("2026-04-01T10:00:00Z", 5, 9, true, 71), // April, e = 12h of 720h: March's 79 cost 9, back from April's prev (99 → 29)
			dec("2026-04-01T10:00:00Z", 71, true, 0),
			dec("2026-04-01T10:00:00Z", 1, false, 0),
		}},
		{"fixed week, Berlin, ISO week 53 of 2026", pol("sfw-53", sluice.FixedWindow, 10, algorithm.Week), []calSettleStep{
			dec("2026-12-27T22:59:59.999999Z", 6, true, 4),      // Sunday of week 52, its last µs
			set("2026-12-27T23:00:00Z", 0, 1, true, 10),         // Monday 28 December, week 53: week 52's charge is not refunded
			dec("2026-12-31T23:00:00Z", 7, true, 3),             // 2027 began; week 53 goes on
			set("2027-01-01T12:00:00Z", 2, 2, true, 8),          //
			dec("2027-01-03T22:59:59.999999Z", 8, true, 0),      // week 53's last µs
			set("2027-01-03T22:59:59.999999Z", 4, 12, false, 0), // 4 beyond the limit
			dec("2027-01-03T23:00:00Z", 10, true, 0),            // Monday 4 January 2027: week 1
			set("2027-01-03T22:59:00Z", 6, 4, true, 6),          // the clock ran back a minute, into week 53: the recorded week 1 refunds 6
			dec("2027-01-04T00:00:00Z", 6, true, 0),
		}},
	}
}

// calSettleRun runs table tb on store st under key, on clock, beside the core: every step equal
// to the core's and to the table's numbers.
func calSettleRun(t *testing.T, name string, st *redisstore.Store, clock *sluice.ManualClock, key string, tb calSettleTable) {
	t.Helper()
	var core algorithm.State
	p := tb.policy
	var ats, costs []int64
	for i, step := range tb.steps {
		now := mustInstant(t, step.at)
		clock.Set(time.UnixMicro(now))
		ats, costs = append(ats, 0), append(costs, 0)
		var got, want sluice.Decision
		var err error
		if step.settle == 0 {
			want, _ = algorithm.Decide(&p, &core, now, step.cost)
			got, err = st.Decide(bg, key, p, step.cost)
			if got.Allowed {
				ats[i], costs[i] = got.At, step.cost
			}
		} else {
			j := step.settle - 1
			if _, err := algorithm.Settle(&p, &core, ats[j], now, costs[j], step.actual); err != nil {
				t.Fatalf("%s, %s, step %d: the core: %v", name, tb.name, i, err)
			}
			if err := st.Settle(bg, key, p, ats[j], costs[j], step.actual); err != nil {
				t.Fatalf("%s, %s, step %d: settling step %d's %d to %d: %v", name, tb.name, i, j, costs[j], step.actual, err)
			}
			want, _ = algorithm.Decide(&p, &core, now, 0)
			got, err = st.Decide(bg, key, p, 0)
		}
		if err != nil || got != want {
			t.Fatalf("%s, %s, step %d (%s):\n got %+v %v\nwant %+v (the core's)", name, tb.name, i, step.at, got, err, want)
		}
		if got.Allowed != step.allowed || got.Remaining != step.remaining {
			t.Fatalf("%s, %s, step %d (%s): allowed %v, remaining %d; the table says %v, %d", name, tb.name, i, step.at, got.Allowed, got.Remaining, step.allowed, step.remaining)
		}
	}
}

// TestCalendarSettleStepTables runs every settlement table on a server (functions and scripts)
// and a Cluster.
func TestCalendarSettleStepTables(t *testing.T) {
	for _, be := range calBackends(t) {
		for ti, tb := range calSettleTables(t) {
			key := strings.ReplaceAll(fmt.Sprintf("settle-table-%d-%s", ti, be.name), " ", "-")
			calSettleRun(t, be.name, be.store, be.clock, key, tb)
		}
	}
}

// TestCalendarSettleNow: a settlement at SettleNow is of a charge taken as made at the
// settlement's instant, on Redis's clock: a refund in the window that holds it, never more
// than it counts.
func TestCalendarSettleNow(t *testing.T) {
	srv := redistest.Start(t)
	berlin := mustZone(t, "Europe/Berlin")
	clock := sluice.NewManualClock(time.Date(2026, 3, 29, 23, 0, 0, 0, berlin))
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		p := sluice.Policy{Name: "now-" + alg.String(), Algorithm: alg, Limit: 10, Calendar: algorithm.Day, Location: berlin}
		var core algorithm.State
		for i, c := range []struct {
			at               time.Duration // after 23:00 on the 23-hour day
			reserved, actual int64
		}{{0, 0, 6}, {30 * time.Minute, 4, 1}, {59 * time.Minute, 9, 0}, {time.Hour, 0, 2}, {time.Hour + time.Second, 5, 0}} {
			clock.Set(time.Date(2026, 3, 29, 23, 0, 0, 0, berlin).Add(c.at))
			at := clock.Now().UnixMicro()
			if _, err := algorithm.Settle(&p, &core, at, at, c.reserved, c.actual); err != nil {
				t.Fatal(err)
			}
			if err := st.Settle(bg, "k", p, sluice.SettleNow, c.reserved, c.actual); err != nil {
				t.Fatalf("%v, settlement %d: %v", alg, i, err)
			}
			want, _ := algorithm.Decide(&p, &core, at, 0)
			if got, err := st.Decide(bg, "k", p, 0); err != nil || got != want {
				t.Fatalf("%v, after settlement %d (%d to %d, now): %+v %v; want %+v", alg, i, c.reserved, c.actual, got, err, want)
			}
		}
	}
}

// TestCalendarSettleRedisClockDecides: near local midnight, a settlement is of the window that
// Redis's clock (here the store's Clock, which the script takes) says, not the instance's, 3ms
// apart either way: a refund of a charge of the day before, when Redis says the day has ended,
// gives nothing back, and when Redis says it has not, gives it back, whatever the instance's
// clock says; an extra charge counts in the day Redis says. Then the instance days off Redis's:
// the windows passed do not hold Redis's time, the script writes nothing and says so, and the
// store asks again around Redis's time — two calls, one settlement, exactly the core's.
func TestCalendarSettleRedisClockDecides(t *testing.T) {
	srv := redistest.Start(t)
	berlin := mustZone(t, "Europe/Berlin")
	midnight := time.Date(2026, 10, 26, 0, 0, 0, 0, berlin) // after the 25-hour day
	redisClock := sluice.NewManualClock(midnight)
	var mu sync.Mutex
	instance := midnight
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: redisClock, NegativeCacheSize: -1})
	redisstore.SetInstanceClock(st, func() time.Time { mu.Lock(); defer mu.Unlock(); return instance })
	setClocks := func(redis, inst time.Time) {
		redisClock.Set(redis)
		mu.Lock()
		instance = inst
		mu.Unlock()
	}
	const ms = time.Millisecond
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		p := sluice.Policy{Name: "settle-midnight-" + alg.String(), Algorithm: alg, Limit: 10, Calendar: algorithm.Day, Location: berlin}
		apart := 0 // the cases in which the instance's clock would have settled otherwise
		for _, c := range []struct {
			key              string
			redis, inst      time.Duration // from midnight, at the settlement
			reserved, actual int64
		}{
			{"refund-after", 3 * ms, -3 * ms, 4, 0},
			{"refund-before", -3 * ms, 3 * ms, 4, 0},
			{"extra-after", 3 * ms, -3 * ms, 4, 7},
			{"extra-before", -3 * ms, 3 * ms, 4, 7},
			{"refund-days-behind", -3 * ms, -96 * time.Hour, 4, 1},
			{"refund-days-ahead", -3 * ms, 5 * 24 * time.Hour, 4, 1},
			{"extra-days-ahead", 3 * ms, 5 * 24 * time.Hour, 4, 9},
		} {
			var core algorithm.State
			spent := midnight.Add(-10 * ms)
			setClocks(spent, spent)
			d, err := st.Decide(bg, c.key, p, c.reserved)
			if err != nil || !d.Allowed || d.At != spent.UnixMicro() {
				t.Fatalf("%v, %s: the charge: %+v %v", alg, c.key, d, err)
			}
			algorithm.Decide(&p, &core, d.At, c.reserved)
			// The core at the instance's time too, to count the cases that tell the clocks apart.
			wrong := core
			now, inst := midnight.Add(c.redis), midnight.Add(c.inst)
			algorithm.Settle(&p, &core, d.At, now.UnixMicro(), c.reserved, c.actual)
			algorithm.Settle(&p, &wrong, d.At, inst.UnixMicro(), c.reserved, c.actual)
			setClocks(now, inst)
			calls := st.Stats().Calls
			if err := st.Settle(bg, c.key, p, d.At, c.reserved, c.actual); err != nil {
				t.Fatalf("%v, %s: %v", alg, c.key, err)
			}
			wantCalls := uint64(1)
			if c.inst <= -time.Hour || c.inst >= time.Hour {
				wantCalls = 2 // the windows around the instance's clock, then around Redis's time
			}
			if got := st.Stats().Calls - calls; got != wantCalls {
				t.Fatalf("%v, %s: %d script calls, want %d", alg, c.key, got, wantCalls)
			}
			// Peeks at Redis's now and, the clock run back, in the day before midnight.
			differs := false
			for _, at := range []time.Time{now, midnight.Add(-ms)} {
				redisClock.Set(at)
				want, _ := algorithm.Decide(&p, &core, at.UnixMicro(), 0)
				if w, _ := algorithm.Decide(&p, &wrong, at.UnixMicro(), 0); w != want {
					differs = true
				}
				if got, err := st.Decide(bg, c.key, p, 0); err != nil || got != want {
					t.Fatalf("%v, %s (settled with Redis at midnight%+v, the instance at midnight%+v), a peek at %v: %+v %v; want %+v (Redis's window)",
						alg, c.key, c.redis, c.inst, at, got, err, want)
				}
			}
			if differs && c.inst > -time.Hour && c.inst < time.Hour {
				apart++
			}
		}
		if apart < 2 {
			t.Fatalf("%v: only %d cases tell Redis's clock from the instance's", alg, apart)
		}
	}
}

// TestCalendarSettleOnRedisTime: with no test clock, a calendar decision's At is Redis's TIME
// and its settlement runs on Redis's TIME too: a refund in the month still running.
func TestCalendarSettleOnRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, NegativeCacheSize: -1})
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		p := sluice.Policy{Name: "year-" + alg.String(), Algorithm: alg, Limit: 1000, Calendar: algorithm.Year}
		d, err := st.Decide(bg, "c", p, 400)
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		if err := st.Settle(bg, "c", p, d.At, 400, 150); err != nil {
			t.Fatal(err)
		}
		pk, err := st.Decide(bg, "c", p, 0)
		if _, end := p.Calendar.Window(nil, d.At); redisTime(t, srv) < end && (err != nil || pk.Remaining != 850) {
			// (unless the year ended meanwhile, on New Year's Eve at midnight UTC)
			t.Fatalf("%v: remaining %d (%v) after settling 400 to 150, want 850", alg, pk.Remaining, err)
		}
		if err := st.Settle(bg, "c", p, d.At, 0, 1000); err != nil {
			t.Fatal(err)
		}
		if pk, _ := st.Decide(bg, "c", p, 1); pk.Allowed {
			t.Fatalf("%v: after 1,000 more than reserved: %+v, want refused", alg, pk)
		}
	}
}

// TestCalendarSettleErrors: a calendar policy the core refuses is refused before Redis; a clock
// run back past a recorded window by more than the windows passed (five months, for a month) is
// ErrStoreUnavailable about the calendar, after asking once more, and changes nothing; an
// instant beyond the calendar's range is an error naming it.
func TestCalendarSettleErrors(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Date(2026, 6, 15, 0, 0, 0, 0, time.UTC))
	st := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})
	p := sluice.Policy{Name: "e", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: algorithm.Month}
	calls := st.Stats().Calls
	for _, bad := range []sluice.Policy{
		{Name: "e", Algorithm: sluice.TokenBucket, Limit: 3, Calendar: algorithm.Month},
		{Name: "e", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: algorithm.Month, Period: time.Hour},
	} {
		if err := st.Settle(bg, "k", bad, 0, 1, 0); !errors.Is(err, sluice.ErrInvalidPolicy) {
			t.Errorf("%+v: %v, want ErrInvalidPolicy", bad, err)
		}
	}
	if st.Stats().Calls != calls {
		t.Fatal("an invalid policy reached Redis")
	}
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		p := p
		p.Algorithm, p.Name = alg, "back-"+alg.String()
		clock.Set(time.Date(2026, 6, 15, 0, 0, 0, 0, time.UTC))
		d, err := st.Decide(bg, "back", p, 2)
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		state := mustDo(t, srv, "GET", stateKey("back", p.Name))
		clock.Set(time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC))
		for _, actual := range []int64{0, 3} {
			calls := st.Stats().Calls
			err := st.Settle(bg, "back", p, d.At, 2, actual)
			if !errors.Is(err, sluice.ErrStoreUnavailable) || !strings.Contains(err.Error(), "calendar") {
				t.Fatalf("%v: settling to %d with the clock five months back: %v; want ErrStoreUnavailable about the calendar", alg, actual, err)
			}
			if got := st.Stats().Calls - calls; got != 2 {
				t.Fatalf("%v: %d calls, want 2 (the second around Redis's time)", alg, got)
			}
			if got := mustDo(t, srv, "GET", stateKey("back", p.Name)); got != state {
				t.Fatalf("%v: a failed settlement changed the state %q to %q", alg, state, got)
			}
		}
		// A month back is within the windows passed: the recorded June window refunds, as in the core.
		clock.Set(time.Date(2026, 5, 15, 0, 0, 0, 0, time.UTC))
		if err := st.Settle(bg, "back", p, d.At, 2, 1); err != nil {
			t.Fatal(err)
		}
		clock.Set(time.Date(2026, 6, 16, 0, 0, 0, 0, time.UTC))
		if pk, err := st.Decide(bg, "back", p, 0); err != nil || pk.Remaining != 2 {
			t.Fatalf("%v: remaining %d (%v) after refunding 1 of June's 2, want 2", alg, pk.Remaining, err)
		}
	}
	clock.Set(time.UnixMicro(1 << 60))
	if err := st.Settle(bg, "k", p, sluice.SettleNow, 0, 1); err == nil || !strings.Contains(err.Error(), "2^60") {
		t.Fatalf("at 2^60 µs: %v; want an error naming the range", err)
	}
}

// TestCalendarSettleRandomized: random traces of decisions and settlements (costs up to the
// limit, real costs from nothing to twice the estimate, steps aimed at windows' edges, the clock
// sometimes back by up to an hour, the instance's clock sometimes days or a millisecond off
// Redis's) on a server and a Cluster, every settlement and decision the core's.
func TestCalendarSettleRandomized(t *testing.T) {
	backends := calBackends(t)
	rng := rand.New(rand.NewPCG(7, 2026))
	steps := 120
	if testing.Short() {
		steps = 40
	}
	for bi, be := range backends {
		if bi == 1 {
			continue // the scripts settle exactly as the functions: the step tables show it
		}
		for _, zone := range []string{"UTC", "Europe/Berlin", "America/Santiago", "Australia/Lord_Howe"} {
			loc := mustZone(t, zone)
			for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
				for _, cal := range []algorithm.Calendar{algorithm.Day, algorithm.Week, algorithm.Month, algorithm.Year} {
					limit := []int64{1, 3, 10, 1000}[rng.IntN(4)]
					p := sluice.Policy{Name: fmt.Sprintf("rs-%v-%v", alg, cal), Algorithm: alg, Limit: limit, Calendar: cal, Location: loc}
					name := fmt.Sprintf("%s, %s, %v, %v, limit %d", be.name, zone, alg, cal, limit)
					keys := []string{"rs-" + be.name + zone + "-a", "rs-" + be.name + zone + "-b"}
					core := map[string]*algorithm.State{keys[0]: {}, keys[1]: {}}
					type charge struct {
						key      string
						at, cost int64
					}
					var pending []charge
					now := time.Date(2024+rng.IntN(6), time.Month(1+rng.IntN(12)), 1+rng.IntN(28), rng.IntN(24), 0, 0, 0, loc).UnixMicro()
					skew := int64(0)
					redisstore.SetInstanceClock(be.store, func() time.Time { return be.clock.Now().Add(time.Duration(skew) * time.Microsecond) })
					for i := range steps {
						now = calRandomStep(rng, &p, now)
						switch r := rng.IntN(20); {
						case r == 0:
							skew = int64(rng.IntN(10)-5) * 24 * int64(time.Hour/time.Microsecond)
						case r < 4:
							skew = int64(rng.IntN(2000) - 1000)
						default:
							skew = 0
						}
						be.clock.Set(time.UnixMicro(now))
						if len(pending) > 0 && rng.IntN(2) == 0 {
							j := rng.IntN(len(pending))
							c := pending[j]
							pending = append(pending[:j], pending[j+1:]...)
							actual := []int64{0, c.cost / 2, c.cost - 1, c.cost + 1, 2 * c.cost, rng.Int64N(2*c.cost + 1)}[rng.IntN(6)]
							actual = max(0, actual)
							if _, err := algorithm.Settle(&p, core[c.key], c.at, now, c.cost, actual); err != nil {
								t.Fatal(err)
							}
							if err := be.store.Settle(bg, c.key, p, c.at, c.cost, actual); err != nil {
								t.Fatalf("%s, step %d at %v (instance %+dµs): settling %+v to %d: %v", name, i, time.UnixMicro(now).In(loc), skew, c, actual, err)
							}
							want, _ := algorithm.Decide(&p, core[c.key], now, 0)
							if got, err := be.store.Decide(bg, c.key, p, 0); err != nil || got != want {
								t.Fatalf("%s, step %d at %v (instance %+dµs): after settling %+v to %d:\n got %+v %v\nwant %+v",
									name, i, time.UnixMicro(now).In(loc), skew, c, actual, got, err, want)
							}
							continue
						}
						k := keys[rng.IntN(2)]
						cost := min(rng.Int64N(limit/2+2), limit)
						want, _ := algorithm.Decide(&p, core[k], now, cost)
						got, err := be.store.Decide(bg, k, p, cost)
						if err != nil || got != want {
							t.Fatalf("%s, step %d at %v (instance %+dµs), %s cost %d:\n got %+v %v\nwant %+v",
								name, i, time.UnixMicro(now).In(loc), skew, k, cost, got, err, want)
						}
						if got.Allowed && cost > 0 {
							pending = append(pending, charge{k, got.At, cost})
						}
					}
				}
			}
		}
	}
}
