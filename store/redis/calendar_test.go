package redis_test

// Calendar policies on Redis: step tables at explicit instants across real calendar edges
// (Europe/Berlin's 23-hour 2026-03-29 and 25-hour 2026-10-25, the leap day 2028-02-29, the end of
// December, ISO week 53 of 2026), on a real server (functions and scripts) and a real Cluster,
// through Decide, DecideAll (one slot) and DecideAll across slots, on a virtual clock (the script's
// time is the test's); a randomized comparison with a reference model; and whose clock decides
// near a boundary: the script's (Redis's), never the instance's.
//
// The reference (calRef) is written from the definitions, independently of the store: the window
// of an instant is algorithm.Calendar.Window's; the fixed window counts per window; the sliding
// window weighs the previous window by the current one's length,
//
//	approve iff prev·(len - e) + (cur + cost)·len ≤ limit·len,   e = now - start,
//
// RetryAfter exact (possibly into the next window, of another length), ResetAfter to the local
// boundary, Remaining = limit - cur - ceil(prev·(len - e)/len) ≥ 0; in big integers.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// calState is the reference's state of one key: the core's.
type calState = algorithm.State

// calRef decides a request of cost at now (µs) under calendar policy p on state s, as the core
// does (algorithm.DecideInto, which the scripts mirror); it changes s only on an approval of a
// positive cost.
func calRef(p *sluice.Policy, s *calState, now, cost int64) sluice.Decision {
	var d sluice.Decision
	if err := algorithm.DecideInto(p, s, now, cost, &d); err != nil {
		panic(fmt.Sprintf("the core refused a valid calendar decision: %v", err))
	}
	return d
}

// sameAt reports whether got is want, the instant compared only for an approval (a settlement
// takes an approval's instant; a refusal charged nothing to settle).
func sameAt(got, want sluice.Decision) bool {
	if !want.Allowed {
		got.At, want.At = 0, 0
	}
	return got == want
}

// noAt is d without its instant, for tables that give none.
func noAt(d sluice.Decision) sluice.Decision {
	d.At = 0
	return d
}

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

// calStep is one request of a step table: its instant (RFC 3339, explicit), its cost, and the
// decision wanted.
type calStep struct {
	at        string
	cost      int64
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
}

type calTable struct {
	name   string
	policy sluice.Policy
	steps  []calStep
}

func calTables(t testing.TB) []calTable {
	berlin := mustZone(t, "Europe/Berlin")
	day, week, month, year := algorithm.Day, algorithm.Week, algorithm.Month, algorithm.Year
	pol := func(name string, alg sluice.Algorithm, limit int64, c algorithm.Calendar, loc *time.Location) sluice.Policy {
		return sluice.Policy{Name: name, Algorithm: alg, Limit: limit, Calendar: c, Location: loc}
	}
	const us = time.Microsecond
	return []calTable{
		{"fixed day, Berlin, the 23-hour 2026-03-29", pol("fd-spring", sluice.FixedWindow, 3, day, berlin), []calStep{
			{"2026-03-28T22:59:59.999Z", 1, true, 2, 0, time.Millisecond},       // 23:59:59.999 CET, Saturday
			{"2026-03-28T23:00:00Z", 1, true, 2, 0, 23 * time.Hour},             // 00:00 CET: a day of 23 hours
			{"2026-03-29T00:59:59Z", 1, true, 1, 0, 21*time.Hour + time.Second}, // 01:59:59 CET
			{"2026-03-29T01:00:00Z", 1, true, 0, 0, 21 * time.Hour},             // 03:00 CEST: the clocks jumped
			{"2026-03-29T01:30:00Z", 1, false, 0, 20*time.Hour + 30*time.Minute, 20*time.Hour + 30*time.Minute},
			{"2026-03-29T21:59:59.999999Z", 1, false, 0, us, us},    // 23:59:59.999999 CEST
			{"2026-03-29T22:00:00Z", 3, true, 0, 0, 24 * time.Hour}, // Monday 00:00 CEST
		}},
		{"fixed day, Berlin, the 25-hour 2026-10-25", pol("fd-autumn", sluice.FixedWindow, 2, day, berlin), []calStep{
			{"2026-10-24T21:59:59.999999Z", 2, true, 0, 0, us},
			{"2026-10-24T22:00:00Z", 1, true, 1, 0, 25 * time.Hour},                                             // 00:00 CEST: 25 hours
			{"2026-10-25T00:30:00Z", 1, true, 0, 0, 22*time.Hour + 30*time.Minute},                              // 02:30 CEST, the first
			{"2026-10-25T01:30:00Z", 1, false, 0, 21*time.Hour + 30*time.Minute, 21*time.Hour + 30*time.Minute}, // 02:30 CET, the second
			{"2026-10-25T22:59:59.999999Z", 1, false, 0, us, us},
			{"2026-10-25T23:00:00Z", 1, true, 1, 0, 24 * time.Hour}, // Monday 00:00 CET
		}},
		{"sliding day, Berlin, into and through the 23-hour day", pol("sd-spring", sluice.SlidingWindow, 10, day, berlin), []calStep{
			{"2026-03-28T11:00:00Z", 10, true, 0, 0, 35 * time.Hour}, // the count lasts until the 23-hour day ends
			// In Saturday's window the request cannot fit; in Sunday's (23 hours), weighted 10·(23h - e)/23h,
			// it fits once 10·(23h - e) + 23h ≤ 230h: e = 2h18m, 8h18m from now.
			{"2026-03-28T17:00:00Z", 1, false, 0, 8*time.Hour + 18*time.Minute, 29 * time.Hour},
			{"2026-03-29T01:17:59.999999Z", 1, false, 0, us, 20*time.Hour + 42*time.Minute + us},
			{"2026-03-29T01:18:00Z", 1, true, 0, 0, 44*time.Hour + 42*time.Minute},
			{"2026-03-29T12:30:00Z", 2, true, 2, 0, 33*time.Hour + 30*time.Minute},
			// Monday (24 hours): prev 3 at full weight; 8 fits when 3·(24h - e) ≤ 2·24h: e = 8h.
			{"2026-03-29T22:00:00Z", 8, false, 7, 8 * time.Hour, 24 * time.Hour},
			{"2026-03-30T06:00:00Z", 8, true, 0, 0, 40 * time.Hour},
		}},
		{"sliding day, Berlin, into and through the 25-hour day", pol("sd-autumn", sluice.SlidingWindow, 10, day, berlin), []calStep{
			{"2026-10-24T10:00:00Z", 8, true, 2, 0, 37 * time.Hour},
			// Sunday (25 hours), e = 0: 8·25h + 3·25h > 250h; fits at e = 25h - 7·25h/8 = 3h7m30s.
			{"2026-10-24T22:00:00Z", 3, false, 2, 3*time.Hour + 7*time.Minute + 30*time.Second, 25 * time.Hour},
			{"2026-10-24T22:00:00Z", 1, true, 1, 0, 49 * time.Hour},
			{"2026-10-25T01:10:00Z", 2, true, 0, 0, 45*time.Hour + 50*time.Minute}, // 02:10 CET, the second
			{"2026-10-25T01:10:00Z", 1, false, 0, 3*time.Hour + 5*time.Minute, 45*time.Hour + 50*time.Minute},
			{"2026-10-25T23:00:00Z", 8, false, 7, 8 * time.Hour, 24 * time.Hour}, // Monday, 24 hours
		}},
		{"fixed month, UTC, a leap February", pol("fm-leap", sluice.FixedWindow, 5, month, nil), []calStep{
			{"2028-02-01T00:00:00Z", 5, true, 0, 0, 29 * 24 * time.Hour},
			{"2028-02-28T23:59:59Z", 1, false, 0, 24*time.Hour + time.Second, 24*time.Hour + time.Second},
			{"2028-02-29T12:00:00Z", 1, false, 0, 12 * time.Hour, 12 * time.Hour},
			{"2028-02-29T23:59:59.999999Z", 1, false, 0, us, us},
			{"2028-03-01T00:00:00Z", 1, true, 4, 0, 31 * 24 * time.Hour},
		}},
		{"fixed day and year, UTC, the leap day", pol("fy-leap", sluice.FixedWindow, 1, year, nil), []calStep{
			{"2028-02-29T00:00:00Z", 1, true, 0, 0, 307 * 24 * time.Hour}, // 2028 has 366 days
			{"2028-12-31T23:59:59.999999Z", 1, false, 0, us, us},
			{"2029-01-01T00:00:00Z", 1, true, 0, 0, 365 * 24 * time.Hour},
		}},
		{"sliding month, Berlin, out of a leap February", pol("sm-leap", sluice.SlidingWindow, 10, month, berlin), []calStep{
			{"2028-02-29T12:00:00Z", 10, true, 0, 0, 754 * time.Hour}, // until March ends (743 hours: DST on the 26th)
			// Not in February; in March (743h), prev 10 weighted: 5 fits at e = 743h/2 = 371h30m.
			{"2028-02-29T22:00:00Z", 5, false, 0, 372*time.Hour + 30*time.Minute, 744 * time.Hour},
			{"2028-03-16T10:29:59.999999Z", 5, false, 4, us, 371*time.Hour + 30*time.Minute + us},
			{"2028-03-16T10:30:00Z", 5, true, 0, 0, 1091*time.Hour + 30*time.Minute},
		}},
		{"fixed week, Berlin, ISO week 53 of 2026", pol("fw-53", sluice.FixedWindow, 2, week, berlin), []calStep{
			{"2026-12-27T22:59:59.999999Z", 2, true, 0, 0, us},                    // Sunday of week 52
			{"2026-12-27T23:00:00Z", 1, true, 1, 0, 7 * 24 * time.Hour},           // Monday 28 December: week 53
			{"2026-12-31T22:59:59.999999Z", 1, true, 0, 0, 72*time.Hour + us},     // New Year's Eve, 23:59:59.999999
			{"2026-12-31T23:00:00Z", 1, false, 0, 72 * time.Hour, 72 * time.Hour}, // 2027 began; week 53 did not end
			{"2027-01-03T23:00:00Z", 2, true, 0, 0, 7 * 24 * time.Hour},           // Monday 4 January 2027: week 1
		}},
		{"fixed year, Berlin, the end of December", pol("fy-dec", sluice.FixedWindow, 1, year, berlin), []calStep{
			{"2026-12-31T22:59:59.999999Z", 1, true, 0, 0, us},
			{"2026-12-31T23:00:00Z", 1, true, 0, 0, 365 * 24 * time.Hour},
			{"2027-06-01T00:00:00Z", 1, false, 0, 5135 * time.Hour, 5135 * time.Hour},
		}},
		{"sliding week, UTC, out of week 53", pol("sw-53", sluice.SlidingWindow, 7, week, nil), []calStep{
			{"2026-12-31T00:00:00Z", 7, true, 0, 0, 264 * time.Hour},
			{"2027-01-04T00:00:00Z", 1, false, 0, 24 * time.Hour, 168 * time.Hour},
			{"2027-01-05T00:00:00Z", 1, true, 0, 0, 312 * time.Hour},
		}},
	}
}

// TestCalendarReference checks the reference against the step tables: the tables are worked out
// by hand, so this tells a wrong table from a wrong reference.
func TestCalendarReference(t *testing.T) {
	for _, tb := range calTables(t) {
		var s calState
		for i, st := range tb.steps {
			got := calRef(&tb.policy, &s, mustInstant(t, st.at), st.cost)
			if want := st.decision(tb.policy.Limit); noAt(got) != want {
				t.Errorf("%s, step %d (%s, cost %d): reference %+v, table %+v", tb.name, i, st.at, st.cost, got, want)
			}
		}
	}
}

func (st calStep) decision(limit int64) sluice.Decision {
	return sluice.Decision{Allowed: st.allowed, Limit: limit, Remaining: st.remaining, RetryAfter: st.retry, ResetAfter: st.reset}
}

func mustInstant(t testing.TB, s string) int64 {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at.UnixMicro()
}

// calBackend is a store under test and how to decide on it.
type calBackend struct {
	name    string
	store   *redisstore.Store
	clock   *sluice.ManualClock
	cluster *redistest.Cluster
}

// calBackends starts a real server and a real Cluster, and returns stores on them on virtual
// clocks: the server's through functions and through scripts, the cluster's through functions.
func calBackends(t *testing.T) []calBackend {
	srv := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	var out []calBackend
	for _, b := range []struct {
		name    string
		opts    redisstore.Options
		cluster *redistest.Cluster
	}{
		{"server, functions", redisstore.Options{Addrs: []string{srv.Addr}}, nil},
		{"server, scripts", redisstore.ScriptsOnly(redisstore.Options{Addrs: []string{srv.Addr}}), nil},
		{"cluster", redisstore.Options{Addrs: cluster.Addrs()}, cluster},
	} {
		clock := sluice.NewManualClock(time.Unix(0, 0))
		b.opts.Clock, b.opts.NegativeCacheSize, b.opts.Timeout = clock, -1, 5*time.Second
		out = append(out, calBackend{name: b.name, store: newStore(t, b.opts), clock: clock, cluster: b.cluster})
	}
	if redisstore.UsesFunctions(out[1].store) || !redisstore.UsesFunctions(out[0].store) {
		t.Fatal("the stores do not call what their names say")
	}
	return out
}

// otherSlotKey returns a key whose hash slot on cluster differs from key's.
func otherSlotKey(t *testing.T, cluster *redistest.Cluster, key string) string {
	t.Helper()
	slotOf := func(k string) string { return mustDo(t, cluster.Servers[0], "CLUSTER", "KEYSLOT", k) }
	for i := 0; ; i++ {
		if k := fmt.Sprintf("%s-other-%d", key, i); slotOf(k) != slotOf(key) {
			return k
		}
	}
}

// TestCalendarStepTables runs every table, step by step at its instants, on a server (functions
// and scripts) and a Cluster: through Decide, through DecideAll beside a limit that never refuses
// (the multi script), and on the Cluster with that limit in another slot (the check phase, then
// the commits).
func TestCalendarStepTables(t *testing.T) {
	roomy := sluice.Policy{Name: "roomy", Algorithm: sluice.TokenBucket, Limit: 1 << 40, Period: time.Second}
	for _, be := range calBackends(t) {
		for _, mode := range []string{"Decide", "DecideAll", "DecideAll across slots"} {
			if mode == "DecideAll across slots" && be.cluster == nil {
				continue
			}
			for ti, tb := range calTables(t) {
				key := strings.ReplaceAll(fmt.Sprintf("table-%d-%s-%s", ti, be.name, mode), " ", "-")
				other := key
				if be.cluster != nil && mode == "DecideAll across slots" {
					other = otherSlotKey(t, be.cluster, key)
				}
				for i, st := range tb.steps {
					be.clock.Set(time.UnixMicro(mustInstant(t, st.at)))
					var d sluice.Decision
					var err error
					if mode == "Decide" {
						d, err = be.store.Decide(bg, key, tb.policy, st.cost)
					} else {
						out := make([]sluice.Decision, 2)
						limits := []sluice.Limit{{Policy: tb.policy, Cost: st.cost}, {Key: other, Policy: roomy, Cost: st.cost}}
						var ok bool
						ok, err = be.store.DecideAll(bg, key, limits, out)
						d = out[0]
						if err == nil && ok != st.allowed {
							t.Fatalf("%s, %s, %s, step %d: DecideAll %v, want %v", be.name, mode, tb.name, i, ok, st.allowed)
						}
					}
					if want := st.decision(tb.policy.Limit); err != nil || noAt(d) != want {
						t.Fatalf("%s, %s, %s, step %d (%s, cost %d):\n got %+v %v\nwant %+v", be.name, mode, tb.name, i, st.at, st.cost, d, err, want)
					}
				}
			}
		}
	}
}

// TestCalendarStateFormat: a calendar state is the usual string at …:v2, its stamp naming the
// calendar and the zone in place of the period, and its window the window's start in µs; its TTL
// is the decision's ResetAfter (plus the virtual clock's slack).
func TestCalendarStateFormat(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Date(2026, 3, 29, 12, 0, 0, 0, mustZone(t, "Europe/Berlin")))
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})
	berlin := mustZone(t, "Europe/Berlin")
	start := time.Date(2026, 3, 29, 0, 0, 0, 0, berlin).UnixMicro()
	for _, c := range []struct {
		p    sluice.Policy
		want string
	}{
		{sluice.Policy{Name: "f", Algorithm: sluice.FixedWindow, Limit: 9, Calendar: algorithm.Day, Location: berlin},
			fmt.Sprintf("1 9 day@Europe/Berlin %d 2", start)},
		{sluice.Policy{Name: "s", Algorithm: sluice.SlidingWindow, Limit: 9, Calendar: algorithm.Day, Location: berlin},
			fmt.Sprintf("3 9 day@Europe/Berlin %d 2 0", start)},
	} {
		d, err := s.Decide(bg, "fmt", c.p, 2)
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		if got := mustDo(t, srv, "GET", stateKey("fmt", c.p.Name)); got != c.want {
			t.Fatalf("state %q, want %q", got, c.want)
		}
		pttl := mustInt(t, srv, "PTTL", stateKey("fmt", c.p.Name))
		if want := (time.Hour + d.ResetAfter).Milliseconds(); pttl > want || pttl < want-1000 {
			t.Fatalf("PTTL %dms, want about %dms (ResetAfter %v + an hour of slack)", pttl, want, d.ResetAfter)
		}
	}
	// A policy of another zone (or calendar) does not read this state: it starts afresh.
	utc := sluice.Policy{Name: "f", Algorithm: sluice.FixedWindow, Limit: 9, Calendar: algorithm.Day}
	if d, err := s.Decide(bg, "fmt", utc, 0); err != nil || d.Remaining != 9 {
		t.Fatalf("the same name in UTC: %+v %v; want a fresh window (Remaining 9)", d, err)
	}
}

// TestCalendarRedisClockDecides: near local midnight, the window is the one the script's clock
// (Redis's) says, not the instance's. The store's Clock gives the script its time (Redis's, in
// this test), and the instance's own clock — around which it passes the windows — is set apart
// from it by a few milliseconds either way, and by days (then the store asks again around the
// time Redis's reply names). MONITOR shows what was sent: the six boundaries around the
// instance's clock, the script's time apart.
func TestCalendarRedisClockDecides(t *testing.T) {
	srv := redistest.Start(t)
	berlin := mustZone(t, "Europe/Berlin")
	midnight := time.Date(2026, 10, 26, 0, 0, 0, 0, berlin) // after the 25-hour day
	redisClock := sluice.NewManualClock(midnight)
	instance := midnight
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: redisClock, NegativeCacheSize: -1})
	var mu sync.Mutex
	redisstore.SetInstanceClock(s, func() time.Time { mu.Lock(); defer mu.Unlock(); return instance })
	setClocks := func(redis, inst time.Time) {
		redisClock.Set(redis)
		mu.Lock()
		instance = inst
		mu.Unlock()
	}
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
		p := sluice.Policy{Name: "midnight-" + alg.String(), Algorithm: alg, Limit: 2, Calendar: algorithm.Day, Location: berlin}
		const ms = time.Millisecond
		spend := func(key string, at time.Time) {
			t.Helper()
			setClocks(at, at)
			if d, err := s.Decide(bg, key, p, 2); err != nil || !d.Allowed {
				t.Fatalf("%v: spending the day at %v: %+v %v", alg, at, d, err)
			}
		}
		// Redis 3ms after midnight, the instance 3ms before: a new day, by Redis's clock.
		spend("ahead", midnight.Add(-10*ms))
		setClocks(midnight.Add(3*ms), midnight.Add(-3*ms))
		d, err := s.Decide(bg, "ahead", p, 1)
		want := sluice.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 24*time.Hour - 3*ms}
		if alg == sluice.SlidingWindow {
			// Yesterday's 2 still weigh (24h - 3ms)/24h: the 1 does not fit until e = 12h.
			want = sluice.Decision{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: 12*time.Hour - 3*ms, ResetAfter: 24*time.Hour - 3*ms}
		}
		if err != nil || noAt(d) != want {
			t.Fatalf("%v, Redis 3ms after midnight, the instance 3ms before: %+v %v; want %+v (Redis's window)", alg, d, err, want)
		}
		// The reverse: Redis 3ms before midnight, the instance 3ms after: still the old day, spent.
		spend("behind", midnight.Add(-10*ms))
		setClocks(midnight.Add(-3*ms), midnight.Add(3*ms))
		d, err = s.Decide(bg, "behind", p, 1)
		want = sluice.Decision{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: 3 * ms, ResetAfter: 3 * ms}
		if alg == sluice.SlidingWindow {
			want = sluice.Decision{Allowed: false, Limit: 2, Remaining: 0, RetryAfter: 3*ms + 12*time.Hour, ResetAfter: 3*ms + 24*time.Hour}
		}
		if err != nil || noAt(d) != want {
			t.Fatalf("%v, Redis 3ms before midnight, the instance 3ms after: %+v %v; want %+v (Redis's window)", alg, d, err, want)
		}
		// Through DecideAll too (the multi script), both ways.
		for _, c := range []struct {
			key         string
			redis, inst time.Duration
			allowed     bool
		}{{"all-ahead", 3 * ms, -3 * ms, alg == sluice.FixedWindow}, {"all-behind", -3 * ms, 3 * ms, false}} {
			spend(c.key, midnight.Add(-10*ms))
			setClocks(midnight.Add(c.redis), midnight.Add(c.inst))
			out := make([]sluice.Decision, 2)
			limits := []sluice.Limit{{Policy: p, Cost: 1}, {Key: c.key + "-2", Policy: p, Cost: 1}}
			ok, err := s.DecideAll(bg, c.key, limits, out)
			if err != nil || ok != c.allowed || out[0].Allowed != c.allowed || !out[1].Allowed {
				t.Fatalf("%v, DecideAll, Redis at midnight%+v, the instance at midnight%+v: %v %v %+v", alg, c.redis, c.inst, ok, err, out)
			}
		}
	}

	// Days apart: the windows passed around the instance's clock do not hold Redis's time; the
	// script says so, writes nothing, and the store asks again around Redis's time: the decision
	// is Redis's window's, exactly.
	p := sluice.Policy{Name: "skewed", Algorithm: sluice.FixedWindow, Limit: 5, Calendar: algorithm.Day, Location: berlin}
	mon := startMonitor(t, srv)
	for i, skew := range []time.Duration{-72 * time.Hour, 5 * 24 * time.Hour} {
		at := midnight.Add(7 * time.Hour)
		setClocks(at, at.Add(skew))
		d, err := s.Decide(bg, fmt.Sprintf("skew-%d", i), p, 1)
		if want := (sluice.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 17 * time.Hour}); err != nil || noAt(d) != want {
			t.Fatalf("the instance %v off Redis: %+v %v; want %+v", skew, d, err, want)
		}
		out := make([]sluice.Decision, 2)
		ok, err := s.DecideAll(bg, fmt.Sprintf("skew-%d", i), []sluice.Limit{{Policy: p, Cost: 1}, {Key: "skew-x", Policy: p, Cost: 1}}, out)
		if want := (sluice.Decision{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 17 * time.Hour}); err != nil || !ok || noAt(out[0]) != want {
			t.Fatalf("DecideAll, the instance %v off Redis: %v %+v %v; want %+v", skew, ok, out, err, want)
		}
	}
	mon.sync(t, srv)
	// What was sent: the period argument is the calendar, then six boundaries around the
	// instance's clock (windows -2..+2 and the end of +2), and now is the script's clock.
	var periods []string
	for _, l := range mon.snapshot() {
		if l.Source != "lua" && (l.Args[0] == "FCALL" || l.Args[0] == "EVALSHA" || l.Args[0] == "EVAL") && len(l.Args) == 3+2+8 {
			periods = append(periods, l.Args[3+2+2])
		}
	}
	at := midnight.Add(7 * time.Hour)
	around := func(t0 time.Time) string {
		var b []string
		for d := -2; d <= 3; d++ {
			b = append(b, strconv.FormatInt(time.Date(t0.Year(), t0.Month(), t0.Day()+d, 0, 0, 0, 0, berlin).UnixMicro(), 10))
		}
		return "day@Europe/Berlin " + strings.Join(b, " ")
	}
	want := []string{around(at.Add(-72 * time.Hour)), around(at), around(at.Add(5 * 24 * time.Hour)), around(at)}
	if fmt.Sprint(periods) != fmt.Sprint(want) {
		t.Fatalf("single calls' period arguments:\n%q\nwant (around the instance's clock, then around Redis's time):\n%q", periods, want)
	}
}

// TestCalendarRealRedisTime: on Redis's own TIME (no Clock), an instance whose clock is two
// seconds off Redis's either way. A zone whose local midnight falls a second or two from now
// (a fixed offset) makes the boundary real: a request after midnight by Redis's clock counts in
// the new day though the instance's clock says before it, and one before midnight by Redis's
// clock counts in the old day though the instance's says after.
func TestCalendarRealRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	for _, skew := range []time.Duration{-2 * time.Second, 2 * time.Second} {
		s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, NegativeCacheSize: -1})
		redisstore.SetInstanceClock(s, func() time.Time { return time.Now().Add(skew) })
		now := redisTime(t, srv)
		// Local midnight at the next whole second 1.5 to 2.5 s from Redis's now.
		m := (now/1_000_000 + 2) * 1_000_000
		off := int(-(m / 1_000_000) % 86400)
		zone := time.FixedZone(fmt.Sprintf("midnight%+d", off), off)
		if lt := time.UnixMicro(m).In(zone); lt.Hour() != 0 || lt.Minute() != 0 || lt.Second() != 0 {
			t.Fatalf("zone %v puts %v at local %v, not midnight", zone, time.UnixMicro(m).UTC(), lt)
		}
		p := sluice.Policy{Name: "real-midnight", Algorithm: sluice.FixedWindow, Limit: 2, Calendar: algorithm.Day, Location: zone}
		key := fmt.Sprintf("real-%v", skew)
		t0 := redisTime(t, srv)
		d, err := s.Decide(bg, key, p, 2)
		if t1 := redisTime(t, srv); err != nil || !d.Allowed || t1 >= m {
			t.Fatalf("spending the old day (Redis %d..%d, midnight %d): %+v %v", t0, t1, m, d, err)
		}
		if skew < 0 {
			// Wait until Redis is past midnight while the instance is still before it.
			if !pollUntil(time.Now().Add(5*time.Second), func() bool { return redisTime(t, srv) >= m }) {
				t.Fatal("Redis's clock did not reach the zone's midnight")
			}
			t0 = redisTime(t, srv)
			d, err = s.Decide(bg, key, p, 1)
			t1 := redisTime(t, srv)
			if time.Now().Add(skew).UnixMicro() >= m {
				t.Fatal("the instance's clock passed midnight too: the test was too slow")
			}
			day := int64(24 * time.Hour / time.Microsecond)
			if got := d.ResetAfter.Microseconds(); err != nil || !d.Allowed || d.Remaining != 1 || got < m+day-t1 || got > m+day-t0 {
				t.Fatalf("after midnight by Redis (%d..%d), before it by the instance: %+v %v; want allowed in the new day", t0, t1, d, err)
			}
		} else {
			// Wait until the instance is past midnight while Redis is still before it.
			if !pollUntil(time.Now().Add(5*time.Second), func() bool { return time.Now().Add(skew).UnixMicro() >= m }) {
				t.Fatal("the instance's clock did not reach the zone's midnight")
			}
			t0 = redisTime(t, srv)
			d, err = s.Decide(bg, key, p, 1)
			t1 := redisTime(t, srv)
			if t1 >= m {
				t.Fatal("Redis's clock passed midnight too: the test was too slow")
			}
			if got := d.RetryAfter.Microseconds(); err != nil || d.Allowed || got < m-t1 || got > m-t0 {
				t.Fatalf("before midnight by Redis (%d..%d), after it by the instance: %+v %v; want refused until Redis's midnight %d", t0, t1, d, err, m)
			}
		}
	}
}

// TestCalendarNegativeCache: a refusal of a calendar policy is remembered until the exact local
// boundary, and not a microsecond longer.
func TestCalendarNegativeCache(t *testing.T) {
	srv := redistest.Start(t)
	berlin := mustZone(t, "Europe/Berlin")
	midnight := time.Date(2026, 3, 30, 0, 0, 0, 0, berlin) // the end of the 23-hour day
	clock := sluice.NewManualClock(midnight.Add(-time.Hour))
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock})
	p := sluice.Policy{Name: "cached", Algorithm: sluice.FixedWindow, Limit: 1, Calendar: algorithm.Day, Location: berlin}
	if d, err := s.Decide(bg, "k", p, 1); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if d, err := s.Decide(bg, "k", p, 1); err != nil || d.Allowed || d.Cached() || d.RetryAfter != time.Hour {
		t.Fatalf("refused by Redis: %+v %v; want RetryAfter 1h", d, err)
	}
	calls := s.Stats().Calls
	clock.Set(midnight.Add(-time.Microsecond))
	if d, err := s.Decide(bg, "k", p, 1); err != nil || d.Allowed || !d.Cached() || d.RetryAfter != time.Microsecond {
		t.Fatalf("1µs before midnight: %+v %v; want the cached refusal, RetryAfter 1µs", d, err)
	}
	if s.Stats().Calls != calls {
		t.Fatal("the cached refusal went to Redis")
	}
	clock.Set(midnight)
	if d, err := s.Decide(bg, "k", p, 1); err != nil || !d.Allowed || d.Cached() || d.ResetAfter != 24*time.Hour {
		t.Fatalf("at midnight: %+v %v; want allowed by Redis, ResetAfter 24h", d, err)
	}
	// A reload to another zone under the same name is another policy: the cache does not answer it.
	if d, err := s.Decide(bg, "k", p, 1); err != nil || d.Allowed {
		t.Fatal(d, err)
	}
	utc := p
	utc.Location = time.UTC
	if d, err := s.Decide(bg, "k", utc, 1); err != nil || d.Cached() {
		t.Fatalf("another zone: %+v %v; want Redis's decision", d, err)
	}
}

// TestCalendarBatches: many goroutines deciding calendar keys at once — batched into batch.lua
// calls — get exactly each key's limit at an instant a microsecond before local midnight, and
// again exactly at midnight; the instance's clock a day behind Redis's makes every batched
// decision miss its windows first and be asked again around Redis's time.
func TestCalendarBatches(t *testing.T) {
	srv := redistest.Start(t)
	berlin := mustZone(t, "Europe/Berlin")
	midnight := time.Date(2026, 10, 25, 0, 0, 0, 0, berlin)
	clock := sluice.NewManualClock(midnight.Add(-time.Microsecond))
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1, Timeout: 5 * time.Second})
	const keys, limit, goroutines, each = 4, 30, 24, 10
	for round, c := range []struct {
		at   time.Time
		skew time.Duration
	}{{midnight.Add(-time.Microsecond), 0}, {midnight, 0}, {midnight.Add(time.Hour), -3 * 24 * time.Hour}} {
		clock.Set(c.at)
		redisstore.SetInstanceClock(s, func() time.Time { return c.at.Add(c.skew) })
		for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
			p := sluice.Policy{Name: "batched-" + alg.String(), Algorithm: alg, Limit: limit, Calendar: algorithm.Day, Location: berlin}
			var mu sync.Mutex
			approved := map[string]int{}
			before := s.Stats().Calls
			var wg sync.WaitGroup
			start := make(chan struct{})
			for g := range goroutines {
				wg.Go(func() {
					<-start
					for i := range each {
						key := batchKey(round, (g+i)%keys)
						d, err := s.Decide(bg, key, p, 1)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							mu.Lock()
							approved[key]++
							mu.Unlock()
						}
					}
				})
			}
			close(start)
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			calls := s.Stats().Calls - before
			for k := range keys {
				key := batchKey(round, k)
				want := limit // round 0: a fresh day; round 1: the next day; round 2: fresh keys
				if alg == sluice.SlidingWindow && round == 1 {
					want = 0 // at e = 0, the previous day's 30 weigh fully
				}
				if approved[key] != want {
					t.Fatalf("round %d, %v: %s got %d approvals, want exactly %d", round, alg, key, approved[key], want)
				}
			}
			t.Logf("round %d, %v: %d decisions in %d script calls", round, alg, goroutines*each, calls)
			if c.skew == 0 && calls >= goroutines*each {
				t.Fatalf("round %d: %d decisions took %d script calls: nothing was batched", round, goroutines*each, calls)
			}
		}
	}
}

// batchKey is key k of TestCalendarBatches's round: rounds 0 and 1 share keys (1 is the next day
// of 0), round 2 has its own.
func batchKey(round, k int) string {
	if round == 2 {
		return fmt.Sprintf("batch-skewed-%d", k)
	}
	return fmt.Sprintf("batch-%d", k)
}

// TestCalendarErrors: bad calendar input is the caller's error, naming the field, before Redis;
// a script that meets a window it cannot place answers an error, not a decision (the scripts'
// own checks, called directly, are in TestCalendarScriptArgs).
func TestCalendarErrors(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, Clock: clock, NegativeCacheSize: -1})
	p := sluice.Policy{Name: "e", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: algorithm.Month}
	for _, c := range []struct {
		p    sluice.Policy
		cost int64
		is   error
		says string
	}{
		{p, 4, algorithm.ErrCostExceedsLimit, "exceeds the limit 3"},
		{p, -1, algorithm.ErrInvalidCost, "cost -1"},
		{sluice.Policy{Name: "e", Algorithm: sluice.TokenBucket, Limit: 3, Calendar: algorithm.Month}, 1, sluice.ErrInvalidPolicy, "calendar"},
		{sluice.Policy{Name: "e", Algorithm: sluice.FixedWindow, Limit: 3, Calendar: algorithm.Month, Period: time.Hour}, 1, sluice.ErrInvalidPolicy, "period"},
	} {
		d, err := s.Decide(bg, "k", c.p, c.cost)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) || d.Allowed {
			t.Errorf("%+v cost %d: %+v %v; want an error wrapping %v saying %q", c.p, c.cost, d, err, c.is, c.says)
		}
		out := make([]sluice.Decision, 2)
		ok, err := s.DecideAll(bg, "k", []sluice.Limit{{Policy: c.p, Cost: c.cost}, {Key: "k2", Policy: p, Cost: 1}}, out)
		if ok || !errors.Is(err, c.is) {
			t.Errorf("DecideAll %+v cost %d: %v %v; want an error wrapping %v", c.p, c.cost, ok, err, c.is)
		}
	}
	if n := mustInt(t, srv, "DBSIZE"); n != 0 {
		t.Fatalf("bad input wrote %d keys", n)
	}
	// Far from the epoch, exactly as near it (the boundaries beyond 2^53 µs are the scripts' big
	// ints); beyond the core's range, an error, not a wrong window.
	for fi, at := range []time.Time{time.Date(30000, 2, 29, 23, 59, 59, 999999000, time.UTC), time.Date(-20000, 12, 31, 23, 0, 0, 0, time.UTC)} {
		for _, pol := range []sluice.Policy{p, {Name: "far-s", Algorithm: sluice.SlidingWindow, Limit: 3, Calendar: algorithm.Week, Location: mustZone(t, "Europe/Berlin")}} {
			var ref calState
			for i, step := range []time.Duration{0, time.Microsecond, 0, 0, 0, 3 * 24 * time.Hour, 40 * 24 * time.Hour} {
				at = at.Add(step)
				clock.Set(at)
				want := calRef(&pol, &ref, at.UnixMicro(), 1)
				if d, err := s.Decide(bg, fmt.Sprintf("far-%d-%s", fi, pol.Name), pol, 1); err != nil || !sameAt(d, want) {
					t.Fatalf("%v, step %d at %v: %+v %v; want %+v", pol.Name, i, at, d, err, want)
				}
			}
		}
	}
	clock.Set(time.UnixMicro(1 << 60))
	if d, err := s.Decide(bg, "k", p, 1); err == nil || d.Allowed || !strings.Contains(err.Error(), "2^60") {
		t.Fatalf("at 2^60 µs: %+v %v; want an error naming the range", d, err)
	}
	// A clock that ran back by more than the windows passed, past a recorded window: the script
	// cannot say where that window ends, and answers an error (the failure mode decides), not a
	// decision in the wrong window.
	clock.Set(time.Date(2026, 6, 15, 0, 0, 0, 0, time.UTC))
	if d, err := s.Decide(bg, "back", p, 1); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	clock.Set(time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC))
	d, err := s.Decide(bg, "back", p, 1)
	if !errors.Is(err, sluice.ErrStoreUnavailable) || !strings.Contains(err.Error(), "calendar") || d.Allowed {
		t.Fatalf("the clock five months back: %+v %v; want ErrStoreUnavailable about the calendar", d, err)
	}
	// Two months back is within the windows passed: the recorded window holds, as in the core.
	clock.Set(time.Date(2026, 4, 15, 0, 0, 0, 0, time.UTC))
	if d, err := s.Decide(bg, "back", p, 1); err != nil || !d.Allowed || d.Remaining != 1 {
		t.Fatalf("the clock two months back: %+v %v; want the recorded June window (Remaining 1)", d, err)
	}
}

// calZones are the zones of the randomized test: every kind of clock change.
var calZones = []string{"UTC", "Europe/Berlin", "America/Santiago", "Australia/Lord_Howe", "Asia/Kathmandu", "America/St_Johns", "Pacific/Apia"}

// TestCalendarRandomized decides random traces on a server and on a Cluster and compares every
// decision with the reference: costs up to the limit, steps of microseconds to months aimed at
// windows' edges, the clock sometimes running back a little, the instance's clock sometimes days
// off Redis's; single decisions and pairs through DecideAll (all or nothing).
func TestCalendarRandomized(t *testing.T) {
	backends := calBackends(t)
	rng := rand.New(rand.NewPCG(13, 2026))
	steps := 250
	if testing.Short() {
		steps = 60
	}
	for bi, be := range backends {
		if bi == 1 {
			continue // the scripts decide exactly as the functions: the step tables show it
		}
		for _, zone := range calZones {
			loc := mustZone(t, zone)
			for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow} {
				for _, cal := range []algorithm.Calendar{algorithm.Day, algorithm.Week, algorithm.Month, algorithm.Year} {
					limit := []int64{1, 3, 10, 1000}[rng.IntN(4)]
					p := sluice.Policy{Name: fmt.Sprintf("r-%v-%v", alg, cal), Algorithm: alg, Limit: limit, Calendar: cal, Location: loc}
					name := fmt.Sprintf("%s, %s, %v, %v, limit %d", be.name, zone, alg, cal, limit)
					keys := []string{"r-" + be.name + zone + "-a", "r-" + be.name + zone + "-b"}
					refs := map[string]*calState{keys[0]: {}, keys[1]: {}}
					now := time.Date(2024+rng.IntN(6), time.Month(1+rng.IntN(12)), 1+rng.IntN(28), rng.IntN(24), 0, 0, 0, loc).UnixMicro()
					skew := int64(0)
					redisstore.SetInstanceClock(be.store, func() time.Time { return be.clock.Now().Add(time.Duration(skew) * time.Microsecond) })
					for i := range steps {
						now = calRandomStep(rng, &p, now)
						switch r := rng.IntN(20); {
						case r == 0:
							skew = int64(rng.IntN(10)-5) * 24 * int64(time.Hour/time.Microsecond) // days off
						case r < 4:
							skew = int64(rng.IntN(2000) - 1000) // a millisecond either way
						default:
							skew = 0
						}
						be.clock.Set(time.UnixMicro(now))
						cost := rng.Int64N(limit/2 + 2)
						if cost > limit {
							cost = limit
						}
						if rng.IntN(4) == 0 {
							a, b := *refs[keys[0]], *refs[keys[1]]
							da, db := calRef(&p, &a, now, cost), calRef(&p, &b, now, 1)
							if da.Allowed && db.Allowed {
								*refs[keys[0]], *refs[keys[1]] = a, b
							}
							out := make([]sluice.Decision, 2)
							ok, err := be.store.DecideAll(bg, keys[0], []sluice.Limit{{Policy: p, Cost: cost}, {Key: keys[1], Policy: p, Cost: 1}}, out)
							if err != nil || ok != (da.Allowed && db.Allowed) || !sameAt(out[0], da) || !sameAt(out[1], db) {
								t.Fatalf("%s, step %d at %v (instance %+dµs), DecideAll cost %d, 1:\n got %v %+v %v\nwant %+v %+v",
									name, i, time.UnixMicro(now).In(loc), skew, cost, ok, out, err, da, db)
							}
							continue
						}
						k := keys[rng.IntN(2)]
						want := calRef(&p, refs[k], now, cost)
						got, err := be.store.Decide(bg, k, p, cost)
						if err != nil || !sameAt(got, want) {
							t.Fatalf("%s, step %d at %v (instance %+dµs), %s cost %d:\n got %+v %v\nwant %+v",
								name, i, time.UnixMicro(now).In(loc), skew, k, cost, got, err, want)
						}
					}
				}
			}
		}
	}
}

// calRandomStep moves now: mostly forward, by anything from a microsecond to a few windows, often
// to within microseconds of a window's edge; sometimes back by up to an hour (never back before
// the window before the current one, whose end the script is still passed).
func calRandomStep(rng *rand.Rand, p *sluice.Policy, now int64) int64 {
	start, end := p.Calendar.Window(p.Location, now)
	switch r := rng.IntN(10); {
	case r < 3: // near the end of this window
		return end + rng.Int64N(2001) - 1000
	case r < 5: // near the start of this one
		return max(now, start+rng.Int64N(1000))
	case r < 6: // back a little
		return now - rng.Int64N(int64(time.Hour/time.Microsecond))
	case r < 8: // within the window
		return now + rng.Int64N(max(1, (end-now)/2+1))
	default: // a window or two on
		return now + rng.Int64N(2*(end-start)+1)
	}
}

// TestCalendarReplicasAck: with replicas_ack a calendar approval is confirmed by WAIT like any
// other (the calendar scripts on the dedicated connection), a refusal is not, and the replica
// holds the state — also after a miss of the windows passed and the second call around Redis's
// time.
func TestCalendarReplicasAck(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	berlin := mustZone(t, "Europe/Berlin")
	clock := sluice.NewManualClock(time.Date(2026, 3, 29, 1, 30, 0, 0, berlin))
	for _, maxBatch := range []int{1, 0} {
		s := newStore(t, redisstore.Options{Addrs: []string{g.Primary.Addr}, ReplicasAck: 1, ReplicasAckTimeout: time.Second,
			MaxBatch: maxBatch, Clock: clock, NegativeCacheSize: -1})
		p := sluice.Policy{Name: fmt.Sprintf("acked-%d", maxBatch), Algorithm: sluice.SlidingWindow, Limit: 2, Calendar: algorithm.Day, Location: berlin}
		for i, skew := range []time.Duration{0, 3 * 24 * time.Hour} {
			redisstore.SetInstanceClock(s, func() time.Time { return clock.Now().Add(skew) })
			key := fmt.Sprintf("acked-%d", i)
			waits := cmdstat(t, g.Primary, "wait", "calls")
			// 01:30 CET on the 23-hour day: 21h30m of it left, and the count lasts through Monday.
			want := sluice.Decision{Allowed: true, Limit: 2, Remaining: 0, ResetAfter: 21*time.Hour + 30*time.Minute + 24*time.Hour}
			if d, err := s.Decide(bg, key, p, 2); err != nil || noAt(d) != want {
				t.Fatalf("MaxBatch %d, instance %v off: %+v %v; want %+v", maxBatch, skew, d, err, want)
			}
			if got := cmdstat(t, g.Primary, "wait", "calls"); got != waits+1 {
				t.Fatalf("MaxBatch %d: %d WAITs for one approval", maxBatch, got-waits)
			}
			if d, err := s.Decide(bg, key, p, 1); err != nil || d.Allowed {
				t.Fatalf("MaxBatch %d: %+v %v; want refused", maxBatch, d, err)
			}
			if got := cmdstat(t, g.Primary, "wait", "calls"); got != waits+1 {
				t.Fatal("a refusal was confirmed by WAIT: it wrote nothing")
			}
			if got := mustDo(t, g.Replicas[0], "GET", stateKey(key, p.Name)); !strings.HasPrefix(got, "3 2 day@Europe/Berlin ") {
				t.Fatalf("the replica holds %q", got)
			}
		}
	}
}
