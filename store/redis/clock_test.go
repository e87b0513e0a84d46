package redis_test

// Whose clock decides. Go cannot run a store on a skewed system clock, and the test process and
// Redis share this machine's clock, so agreement alone would not tell "the script read Redis
// TIME" from "the store sent time.Now()". These tests therefore check the causes as well as the
// consequences:
//
//   - what the store sends: MONITOR shows every script call's `now` argument — empty for a store
//     without Options.Clock, so no local clock can reach a decision, and the store's clock's µs
//     when it has one;
//   - what the script reads: every decision of a store without a Clock runs Redis's TIME exactly
//     once (MONITOR's `[0 lua] "TIME"` lines, and INFO commandstats), and one with a Clock never;
//   - what comes of it: two instances interleaving on one key see one window — Remaining goes
//     down by one per request across both, and every ResetAfter/RetryAfter lies between the two
//     readings of Redis TIME taken around the request; and instances given clocks ten minutes
//     apart (Options.Clock) get exactly the windows of their own clocks, down to the µs.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// hashKey is the store's documented key of key under policy: prefix + "{" + key + "}:" + policy,
// the name of the old format's hash and the stem of the state's keys (stateKey, and + ":log").
func hashKey(key, policy string) string { return redis.DefaultPrefix + "{" + key + "}:" + policy }

// stateKey is the key of the state string of key under policy (every algorithm's but the sliding log's).
func stateKey(key, policy string) string { return hashKey(key, policy) + ":v2" }

// scriptCall is a decision script call seen by MONITOR: its first key, its `now` argument and
// its deadline.
type scriptCall struct {
	Key, Now, Deadline string
	Multi              bool
}

// scriptCalls returns the EVAL/EVALSHA/FCALL calls that clients (not scripts) made, the number of TIME
// commands that scripts ran, and the number that clients ran (the test's own, and the stores'
// readings of Redis's clock for deadlines).
func scriptCalls(t *testing.T, lines []monitorLine) (calls []scriptCall, luaTime, clientTime int) {
	t.Helper()
	for _, l := range lines {
		if l.Source == "lua" {
			if l.Args[0] == "TIME" {
				luaTime++
			}
			continue
		}
		if l.Args[0] == "TIME" {
			clientTime++
		}
		if l.Args[0] != "EVAL" && l.Args[0] != "EVALSHA" && l.Args[0] != "FCALL" { // (FCALL function numkeys …: as EVALSHA sha1 numkeys …)
			continue
		}
		numkeys, err := strconv.Atoi(l.Args[2])
		if err != nil || len(l.Args) < 3+numkeys+2 || numkeys < 2 {
			t.Fatalf("unexpected script call %q", l.Args)
		}
		keys, argv := l.Args[3:3+numkeys], l.Args[3+numkeys:]
		// single.lua: 8 arguments, now is ARGV[6], the deadline ARGV[8]; multi.lua: n, now,
		// slack, then 5 per limit, then the deadline.
		if len(argv) == 8 {
			calls = append(calls, scriptCall{Key: keys[0], Now: argv[5], Deadline: argv[7]})
		} else {
			calls = append(calls, scriptCall{Key: keys[0], Now: argv[1], Deadline: argv[len(argv)-1], Multi: true})
		}
	}
	return calls, luaTime, clientTime
}

// markTime returns INFO commandstats' count of TIME calls and an ECHO for MONITOR to show, run in
// one transaction: the count is that of the TIME calls MONITOR shows before the mark.
func markTime(t *testing.T, srv *redistest.Server, name string) (int64, string) {
	t.Helper()
	mark := fmt.Sprintf("mark-%s-%d", name, time.Now().UnixNano())
	r, err := srv.Tx([]string{"ECHO", mark}, []string{"INFO", "commandstats"})
	if err != nil || len(r) != 2 || r[0] != mark {
		t.Fatalf("ECHO and INFO in one transaction: %q %v", r, err)
	}
	for _, line := range strings.Split(r[1], "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_time:calls="); ok {
			v, _, _ = strings.Cut(v, ",")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO commandstats: %q", line)
			}
			return n, mark
		}
	}
	return 0, mark // no TIME since the server started
}

// between returns the lines after the ECHO of mark from and before that of mark to.
func between(t *testing.T, lines []monitorLine, from, to string) []monitorLine {
	t.Helper()
	i := slices.IndexFunc(lines, func(l monitorLine) bool { return len(l.Args) == 2 && l.Args[0] == "ECHO" && l.Args[1] == from })
	j := slices.IndexFunc(lines, func(l monitorLine) bool { return len(l.Args) == 2 && l.Args[0] == "ECHO" && l.Args[1] == to })
	if i < 0 || j < i {
		t.Fatalf("MONITOR did not show the marks %s and %s in order (%d, %d)", from, to, i, j)
	}
	return lines[i+1 : j]
}

// awaitWindowStart polls Redis's clock until it is in the first quarter of a window of period
// µs, so that what follows fits in one window; it returns Redis's time then.
func awaitWindowStart(t *testing.T, redisNow func() int64, period int64) int64 {
	t.Helper()
	var now int64
	if !pollUntil(time.Now().Add(time.Duration(2*period)*time.Microsecond), func() bool {
		now = redisNow()
		return now%period < period/4
	}) {
		t.Fatalf("Redis's clock never reached the start of a %dµs window", period)
	}
	return now
}

// TestClockFromRedis: two instances without a Clock, interleaving requests on one fixed-window
// key, decide on Redis's clock — one window between them, placed where Redis TIME puts it — and
// send no time of their own.
func TestClockFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	stores := []*redis.Store{
		openStore(t, srv, redis.Options{NegativeCacheSize: -1}), // every refusal reaches Redis too
		openStore(t, srv, redis.Options{NegativeCacheSize: -1}),
	}
	p := sluice.Policy{Name: "clock", Algorithm: sluice.FixedWindow, Limit: 6, Period: time.Second}
	period := p.PeriodMicros()
	mon := startMonitor(t, srv)
	// The stores read Redis's clock on their own too, at any moment: INFO's count and MONITOR's
	// lines are compared between two marks, each taken in one transaction with nothing between.
	startCount, startMark := markTime(t, srv, "start")
	timeCalls, decisions := 0, 0 // TIME commands of the test itself; scripts run by the stores
	now := func() int64 { timeCalls++; return redisTime(t, srv) }
	// within checks that a duration the store reported is the time from Redis's clock, read
	// between t0 and t1, to the end µs.
	within := func(what string, got time.Duration, end, t0, t1 int64) {
		t.Helper()
		if us := got.Microseconds(); us < end-t1 || us > end-t0 {
			t.Fatalf("%s = %dµs; Redis TIME around the request puts the window's end %d..%dµs away", what, us, end-t1, end-t0)
		}
	}

	var key string
	var w int64 // the window, by Redis's clock
	for attempt := 0; ; attempt++ {
		if attempt == 3 {
			t.Fatal("could not fit the sequence in one window three times")
		}
		w = awaitWindowStart(t, now, period) / period
		key = fmt.Sprintf("interleaved-%d", attempt)
		rolled := false
		for i := int64(0); i < p.Limit && !rolled; i++ {
			st := stores[i%2]
			t0 := now()
			d, err := st.Decide(bg, key, p, 1)
			decisions++
			t1 := now()
			if t0/period != w || t1/period != w {
				rolled = true // the window ended mid-sequence: try again on a fresh key
				break
			}
			if err != nil || !d.Allowed || d.Remaining != p.Limit-1-i {
				t.Fatalf("request %d, on store %d: %+v %v; want approved with Remaining %d (one window shared by both stores)",
					i, i%2, d, err, p.Limit-1-i)
			}
			within(fmt.Sprintf("request %d's ResetAfter", i), d.ResetAfter, (w+1)*period, t0, t1)
		}
		if rolled {
			continue
		}
		for i, st := range stores {
			t0 := now()
			d, err := st.Decide(bg, key, p, 1)
			decisions++
			t1 := now()
			if t1/period != w {
				rolled = true
				break
			}
			if err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("store %d, with the window spent: %+v %v; want refused", i, d, err)
			}
			within(fmt.Sprintf("store %d's RetryAfter", i), d.RetryAfter, (w+1)*period, t0, t1)
			within(fmt.Sprintf("store %d's ResetAfter", i), d.ResetAfter, (w+1)*period, t0, t1)
		}
		if !rolled {
			break
		}
	}

	// When Redis's clock enters the next window, and not before, both stores have quota again.
	if !pollUntil(time.Now().Add(3*time.Second), func() bool { return now() >= (w+1)*period }) {
		t.Fatal("Redis's clock did not reach the next window within 3s")
	}
	for i, st := range stores {
		d, err := st.Decide(bg, key, p, 1)
		decisions++
		if err != nil || !d.Allowed || d.Remaining != p.Limit-1-int64(i) {
			t.Fatalf("store %d in Redis's next window: %+v %v; want approved, Remaining %d", i, d, err, p.Limit-1-int64(i))
		}
	}
	// DecideAll, too, leaves the time to Redis.
	limits := []sluice.Limit{{Policy: p, Cost: 1}, {Policy: sluice.Policy{Name: "clock-log", Algorithm: sluice.SlidingLog, Limit: 2, Period: time.Second}, Cost: 1}}
	for i, st := range stores {
		out := make([]sluice.Decision, 2)
		if ok, err := st.DecideAll(bg, "all", limits, out); err != nil || !ok {
			t.Fatalf("store %d: DecideAll: %v %v %+v", i, ok, err, out)
		}
		decisions++
	}

	endCount, endMark := markTime(t, srv, "end")
	mon.sync(t, srv)
	calls, luaTime, clientTime := scriptCalls(t, between(t, mon.snapshot(), startMark, endMark))
	if len(calls) < decisions {
		t.Fatalf("MONITOR saw %d script calls for %d decisions", len(calls), decisions)
	}
	for _, c := range calls {
		if c.Now != "" {
			t.Fatalf("a store without a Clock sent now = %q for %s (multi %v); it must send none, so that Redis's TIME decides", c.Now, c.Key, c.Multi)
		}
		if _, err := strconv.ParseInt(c.Deadline, 10, 64); err != nil {
			t.Fatalf("a store without a Clock sent deadline %q for %s (multi %v); want Redis µs", c.Deadline, c.Key, c.Multi)
		}
	}
	if luaTime != decisions {
		t.Fatalf("the scripts ran TIME %d times for %d decisions; want once each", luaTime, decisions)
	}
	// The stores read Redis's clock themselves too (about once a second each, for deadlines):
	// those are not decisions' — they come from clients, not scripts.
	if clientTime < timeCalls {
		t.Fatalf("MONITOR saw %d TIME calls from clients; the test alone made %d", clientTime, timeCalls)
	}
	if n := endCount - startCount; n != int64(luaTime+clientTime) {
		t.Fatalf("INFO commandstats counts %d TIME calls; MONITOR saw %d by the scripts (one per decision) and %d by clients", n, luaTime, clientTime)
	}
	t.Logf("%d decisions by 2 stores, each read Redis TIME once and sent no time", decisions)
}

// TestClockOption: Options.Clock is honoured, exactly. Three instances, one 5 minutes ahead of
// Redis, one 5 minutes behind (virtual clocks) and one without a Clock, each on its own key of a
// fixed window of 2s: each gets the window of its own clock to the µs, each sees quota come back
// when its own clock moves (and only then), the virtual-clock ones send their clock's µs and never
// make a script read TIME, and their keys outlive their virtual windows in Redis's real time.
//
// Nothing waits on the machine being idle: the stores' timeout is long (a deadline of 50 ms on
// Redis's clock passes on a busy machine), and the instance on Redis's clock, whose requests must
// fall in one real window of 2 s, starts over on a fresh key in the next window if they do not.
func TestClockOption(t *testing.T) {
	srv := redistest.Start(t)
	p := sluice.Policy{Name: "skew", Algorithm: sluice.FixedWindow, Limit: 3, Period: 2 * time.Second}
	period := p.PeriodMicros()
	start := awaitWindowStart(t, func() int64 { return redisTime(t, srv) }, period)
	w := start / period
	base := w * period // where Redis's current window began
	const fiveMin = int64(5 * 60 * 1_000_000)
	type instance struct {
		name      string
		clock     *sluice.ManualClock // nil: Redis TIME
		store     *redis.Store
		key       string
		resetWant int64 // µs; for a virtual clock, exactly
	}
	ahead := sluice.NewManualClock(time.UnixMicro(base + fiveMin + 250_000))    // 250ms into its window
	behind := sluice.NewManualClock(time.UnixMicro(base - fiveMin + 1_500_000)) // 1.5s into its window
	insts := []*instance{
		{name: "ahead", clock: ahead, key: "ahead", resetWant: 1_750_000},
		{name: "behind", clock: behind, key: "behind", resetWant: 500_000},
		{name: "redis", key: "redis"},
	}
	for _, in := range insts {
		opts := redis.Options{NegativeCacheSize: -1, Timeout: 10 * time.Second}
		if in.clock != nil {
			opts.Clock = in.clock
		}
		in.store = openStore(t, srv, opts)
	}
	// Load the script first (a peek writes nothing), so that no call below meets NOSCRIPT.
	if _, err := insts[2].store.Decide(bg, "warm-up", p, 0); err != nil {
		t.Fatal(err)
	}
	mon := startMonitor(t, srv)

	redisKeys := map[string]bool{} // the Redis-clock instance's keys, one per attempt
	for _, in := range insts {
	attempt:
		for try := 0; ; try++ {
			if in.clock == nil {
				// On Redis's clock: all in one real window, or again on a fresh key in the next.
				if try > 0 {
					start = awaitWindowStart(t, func() int64 { return redisTime(t, srv) }, period)
					w = start / period
				}
				in.key = "redis-" + strconv.Itoa(try)
				redisKeys[stateKey(in.key, p.Name)] = true
			}
			for i := int64(0); i <= p.Limit; i++ {
				t0 := redisTime(t, srv)
				d, err := in.store.Decide(bg, in.key, p, 1)
				t1 := redisTime(t, srv)
				if in.clock == nil && (t0/period != w || t1/period != w) {
					if try == 10 {
						t.Fatalf("redis: in 10 attempts, %d requests never fell in one window of %v", p.Limit+1, p.Period)
					}
					continue attempt // Redis's window rolled meanwhile (a busy machine)
				}
				if err != nil || d.Allowed != (i < p.Limit) {
					t.Fatalf("%s, request %d: %+v %v", in.name, i, d, err)
				}
				got := d.ResetAfter.Microseconds()
				if in.clock != nil {
					if got != in.resetWant {
						t.Fatalf("%s, request %d: ResetAfter %dµs; its clock (%v) is %dµs before its window's end",
							in.name, i, got, in.clock.Now().UTC(), in.resetWant)
					}
					if !d.Allowed && d.RetryAfter.Microseconds() != in.resetWant {
						t.Fatalf("%s: RetryAfter %v, want %dµs", in.name, d.RetryAfter, in.resetWant)
					}
				} else if end := (w + 1) * period; got < end-t1 || got > end-t0 {
					t.Fatalf("redis, request %d: ResetAfter %dµs, want %d..%dµs (Redis TIME's window; test started at %d)",
						i, got, end-t1, end-t0, start)
				}
			}
			break
		}
	}

	// The virtual clocks move to their windows' ends, Redis's does not (we are early in its
	// window): quota comes back exactly for the instances whose own clock passed the end.
	behind.Advance(500*time.Millisecond - time.Microsecond)
	if d, err := insts[1].store.Decide(bg, "behind", p, 1); err != nil || d.Allowed || d.RetryAfter != time.Microsecond {
		t.Fatalf("behind, 1µs before its window's end: %+v %v; want refused, RetryAfter 1µs", d, err)
	}
	behind.Advance(time.Microsecond)
	ahead.Advance(1750 * time.Millisecond)
	for _, in := range insts[:2] {
		if d, err := in.store.Decide(bg, in.key, p, 1); err != nil || !d.Allowed || d.Remaining != p.Limit-1 || d.ResetAfter != p.Period {
			t.Fatalf("%s, at its next window: %+v %v; want approved, Remaining %d, ResetAfter %v", in.name, d, err, p.Limit-1, p.Period)
		}
	}
	if d, err := insts[2].store.Decide(bg, insts[2].key, p, 1); err != nil || d.Allowed {
		if redisTime(t, srv)/period == w {
			t.Fatalf("redis: still in Redis's window %d, but %+v %v; want refused", w, d, err)
		}
	}

	// TTLs: in Redis's real time, a virtual-clock key must outlive its virtual window (Redis does
	// not run on the virtual clock), so it gets an hour of slack; a real one lasts its window.
	for _, in := range insts {
		pttl := mustInt(t, srv, "PTTL", stateKey(in.key, p.Name))
		if in.clock != nil && (pttl < int64(time.Hour/time.Millisecond) || pttl > int64((time.Hour+p.Period)/time.Millisecond)) {
			t.Fatalf("%s: PTTL %dms; want an hour of slack plus at most the period", in.name, pttl)
		}
		if in.clock == nil && pttl == -2 && redisTime(t, srv)/period != w {
			continue // expired with its window, which a busy machine saw end
		}
		if in.clock == nil && (pttl <= 0 || pttl > int64(p.Period/time.Millisecond)) {
			t.Fatalf("%s: PTTL %dms; want 1..%d", in.name, pttl, p.Period/time.Millisecond)
		}
	}

	// What each sent: its own clock's µs, or nothing; and only Redis-time decisions read TIME.
	mon.sync(t, srv)
	calls, luaTime, _ := scriptCalls(t, mon.snapshot())
	sent := map[string][]string{}
	for _, c := range calls {
		sent[c.Key] = append(sent[c.Key], c.Now)
		if !redisKeys[c.Key] && c.Deadline != "" {
			t.Fatalf("a store with a Clock sent deadline %q for %s; want none (its clock is not Redis's)", c.Deadline, c.Key)
		}
	}
	aheadStart := strconv.FormatInt(base+fiveMin+250_000, 10)
	behindStart := strconv.FormatInt(base-fiveMin+1_500_000, 10)
	for _, in := range insts {
		nows := sent[stateKey(in.key, p.Name)]
		if len(nows) < int(p.Limit)+2 {
			t.Fatalf("%s: MONITOR saw %d script calls, want at least %d", in.name, len(nows), p.Limit+2)
		}
		for i, n := range nows {
			switch in.name {
			case "redis":
				if n != "" {
					t.Fatalf("the instance without a Clock sent now = %q", n)
				}
			case "ahead", "behind":
				want := aheadStart
				if in.name == "behind" {
					want = behindStart
				}
				if i == len(nows)-1 { // the request after the advance
					want = strconv.FormatInt(in.clock.Now().UnixMicro(), 10)
				}
				if in.name == "behind" && i == len(nows)-2 {
					want = strconv.FormatInt(in.clock.Now().UnixMicro()-1, 10)
				}
				if n != want {
					t.Fatalf("%s's call %d sent now = %q, want %s (its clock's µs)", in.name, i, n, want)
				}
			}
		}
	}
	want := 0
	for k := range redisKeys {
		want += len(sent[k])
	}
	if luaTime != want {
		t.Fatalf("scripts ran TIME %d times; want %d, once per decision of the instance without a Clock and never for the others", luaTime, want)
	}
}
