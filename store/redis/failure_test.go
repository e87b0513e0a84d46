package redis_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
)

// Phases of TestFailure, as the load goroutines see them.
const (
	phaseUp         int32 = iota // Redis serving
	phaseHung                    // CLIENT PAUSE ALL: Redis up but answering nothing
	phaseRecovering              // the pause ending or ended
	phaseKilling                 // Kill in progress
	phaseDown                    // Kill returned: nothing listens on the port
	phaseRestarting              // Restart in progress
	phaseBack                    // Restart returned
	numPhases
)

var phaseNames = [numPhases]string{"up", "hung", "recovering", "killing", "down", "restarting", "back"}

// Kinds of limiter under load.
const (
	kindClosed = iota
	kindOpen
	kindLocal
)

var kindNames = [3]string{"fail-closed", "fail-open", "local"}

// loadTally is one load goroutine's record.
type loadTally struct {
	calls    [numPhases]int           // by the phase a call started in
	ok       [numPhases]int           // decided by Redis (NoFallback, no error)
	slow     [numPhases]int           // took at least half the store timeout
	maxDur   [numPhases]time.Duration // the longest call that started in the phase
	hotLocal struct{ approved, refused int }
	problems []string
}

func (tl *loadTally) problem(format string, args ...any) {
	if len(tl.problems) < 10 {
		tl.problems = append(tl.problems, fmt.Sprintf(format, args...))
	}
}

// TestFailure runs 32 goroutines deciding in a loop on three limiters of one Redis store — one
// per failure mode — while the server hangs (CLIENT PAUSE), comes back, is killed, and is
// restarted on the same port with an empty dataset and script cache. It checks:
//
//	(a) no call takes longer than the store's SlowTimeout plus 150ms, whatever the server does
//	    (a call waits Timeout, but the one watching a silence waits SlowTimeout: life.go);
//	(b) each failure mode does what it says while Redis cannot answer: fail-closed returns an
//	    error wrapping ErrStoreUnavailable and a refusal; fail-open approves with FallbackOpen;
//	    local decides on its in-process share (exactly 5 of a fixed window of 10 for one key);
//	(c) the breakers open (StoreAvailable false), so that most calls return at once instead of
//	    waiting for the timeout and the store is asked only by the few probes; nothing panics;
//	(d) after a hang, and after a restart, decisions go back to Redis within a second, and after
//	    the restart the function library, gone from the server, is loaded again transparently
//	    (FCALL meets Function not found, FUNCTION LOAD) and decides correctly;
//	(e) no goroutine outlives the stores (TestMain runs goleak).
func TestFailure(t *testing.T) {
	srv := redistest.Start(t)
	const (
		timeout     = 50 * time.Millisecond
		slowTimeout = 200 * time.Millisecond // (the hang below is 600ms: the breakers open within it)
		slack       = 150 * time.Millisecond
		workers     = 32
	)
	st := openStore(t, srv, redis.Options{Timeout: timeout, SlowTimeout: slowTimeout})
	policy := func(name string) sluice.Policy {
		return sluice.Policy{Name: name, Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Hour}
	}
	var limiters [3]*sluice.Limiter
	var err error
	if limiters[kindClosed], err = sluice.NewLimiter(st, policy("closed")); err != nil {
		t.Fatal(err)
	}
	if limiters[kindOpen], err = sluice.NewLimiter(st, policy("open"), sluice.WithFailureMode(sluice.FailOpen)); err != nil {
		t.Fatal(err)
	}
	// The local store runs on a frozen clock, so that its hour-long fixed window cannot roll over
	// while the test counts its approvals.
	localClock := sluice.NewManualClock(time.Unix(1_700_000_000, 0))
	if limiters[kindLocal], err = sluice.NewLimiter(st, policy("local"),
		sluice.WithLocalFallback(memory.New(memory.WithClock(localClock)), 0.5)); err != nil {
		t.Fatal(err)
	}
	available := func(want bool) func() bool {
		return func() bool {
			for _, l := range limiters {
				if l.StoreAvailable() != want {
					return false
				}
			}
			return true
		}
	}

	var (
		phase      atomic.Int32
		hot        atomic.Bool // local goroutines also hammer the key "hot" (only while Redis is down)
		stop       = make(chan struct{})
		wg         sync.WaitGroup
		tallies    [workers]loadTally
		panicsSeen atomic.Int32
	)
	for g := range workers {
		tl, kind, lim := &tallies[g], g%3, limiters[g%3]
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					panicsSeen.Add(1)
					tl.problem("panic: %v", r)
				}
			}()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key, isHot := fmt.Sprintf("w%d-%d", g, i), false // a fresh key: never refused, never cached
				if kind == kindLocal && i%2 == 0 && hot.Load() {
					key, isHot = "hot", true
				}
				ph := phase.Load()
				t0 := time.Now()
				d, err := lim.Allow(bg, key)
				dur := time.Since(t0)
				steady := phase.Load() == ph // the whole call within one phase
				tl.calls[ph]++
				tl.maxDur[ph] = max(tl.maxDur[ph], dur)
				if dur >= timeout/2 {
					tl.slow[ph]++
				}
				byRedis := err == nil && d.Fallback == sluice.NoFallback
				if byRedis {
					tl.ok[ph]++
					if !d.Allowed || d.Remaining != 9 {
						tl.problem("%s, %s: a fresh key's first decision by Redis: %+v", kindNames[kind], phaseNames[ph], d)
					}
				}
				// What each mode may answer, ever.
				switch kind {
				case kindClosed:
					if err != nil && (!errors.Is(err, sluice.ErrStoreUnavailable) || d.Allowed || d.Fallback != sluice.NoFallback) {
						tl.problem("fail-closed, %s: %+v %v; want a refusal and an error wrapping ErrStoreUnavailable", phaseNames[ph], d, err)
					}
				case kindOpen:
					if err != nil || (d.Fallback != sluice.NoFallback && (d.Fallback != sluice.FallbackOpen || !d.Allowed || d.Remaining != 9)) {
						tl.problem("fail-open, %s: %+v %v; want Redis's decision or an approval with FallbackOpen", phaseNames[ph], d, err)
					}
				case kindLocal:
					if err != nil || (d.Fallback != sluice.NoFallback && d.Fallback != sluice.FallbackLocal) {
						tl.problem("local, %s: %+v %v; want Redis's decision or FallbackLocal", phaseNames[ph], d, err)
					}
					if isHot && d.Fallback == sluice.FallbackLocal {
						if d.Allowed {
							tl.hotLocal.approved++
						} else {
							tl.hotLocal.refused++
							if d.RetryAfter <= 0 || d.Limit != 5 {
								tl.problem("local, hot key: refusal %+v; want RetryAfter > 0 and the local share's limit 5", d)
							}
						}
					}
				}
				// While Redis certainly cannot answer, nothing may come from it.
				if steady && (ph == phaseHung || ph == phaseDown) && byRedis {
					tl.problem("%s, %s: %+v: decided by Redis while it could not answer", kindNames[kind], phaseNames[ph], d)
				}
				time.Sleep(500 * time.Microsecond) // a paced load: the two cores stay available for Redis and the scheduler
			}
		})
	}
	// Stopping the load waits for the calls in flight; one that never returns fails (a) here
	// rather than hanging the test.
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("(a) a decision has been blocked for more than 5s (store timeout %v)", timeout)
		}
	})
	t.Cleanup(stopLoad)

	// Up: Redis decides.
	if !pollUntil(time.Now().Add(2*time.Second), func() bool {
		d, err := limiters[kindClosed].Allow(bg, "probe-up")
		return err == nil && d.Fallback == sluice.NoFallback
	}) {
		t.Fatal("Redis did not decide while up")
	}
	time.Sleep(100 * time.Millisecond) // let the load run against a healthy Redis

	// Hung: for 600ms Redis accepts commands and answers none. Calls time out; the breakers open.
	const pause = 600 * time.Millisecond
	mustDo(t, srv, "CLIENT", "PAUSE", fmt.Sprint(pause.Milliseconds()), "ALL")
	paused := time.Now()
	phase.Store(phaseHung)
	if !pollUntil(paused.Add(pause-150*time.Millisecond), available(false)) {
		t.Fatal("(c) the breakers did not all open while Redis hung")
	}
	hungOpen := time.Since(paused)
	time.Sleep(time.Until(paused.Add(pause - 100*time.Millisecond)))
	phase.Store(phaseRecovering)
	if !pollUntil(paused.Add(pause+time.Second), available(true)) {
		t.Fatal("(d) the breakers did not close within a second of Redis answering again")
	}
	hungBack := time.Since(paused) - pause

	// Down: the server is killed; the local limiters also hammer one key.
	phase.Store(phaseKilling)
	srv.Kill()
	phase.Store(phaseDown)
	downAt, statsDown := time.Now(), st.Stats()
	hot.Store(true)
	if !pollUntil(downAt.Add(500*time.Millisecond), available(false)) {
		t.Fatal("(c) the breakers did not all open with Redis down")
	}
	downOpen := time.Since(downAt)
	time.Sleep(time.Until(downAt.Add(700 * time.Millisecond)))
	hot.Store(false)
	statsUp := st.Stats()
	downFor := time.Since(downAt)
	phase.Store(phaseRestarting)

	// Back: the same port, an empty dataset and script cache.
	srv.Restart()
	phase.Store(phaseBack)
	restarted := time.Now()
	var recovered time.Duration
	for i, l := range limiters {
		key := fmt.Sprintf("back-%d", i)
		if !pollUntil(restarted.Add(time.Second), func() bool {
			d, err := l.Allow(bg, key)
			return err == nil && d.Fallback == sluice.NoFallback
		}) {
			t.Fatalf("(d) %s: decisions did not go back to Redis within 1s of the restart", kindNames[i])
		}
		recovered = max(recovered, time.Since(restarted))
	}
	// The library was loaded again: every decision on a fresh key is exact, single and multi.
	for i := int64(0); i <= 10; i++ {
		d, err := limiters[kindClosed].Allow(bg, "after-restart")
		if err != nil || d.Fallback != sluice.NoFallback || d.Allowed != (i < 10) || d.Remaining != max(0, 9-i) {
			t.Fatalf("(d) after the restart, request %d on a fresh key: %+v %v; want Redis's exact count", i, d, err)
		}
	}
	out := make([]sluice.Decision, 2)
	limits := []sluice.Limit{{Policy: policy("multi-a"), Cost: 3}, {Policy: sluice.Policy{Name: "multi-b", Algorithm: sluice.TokenBucket, Limit: 4, Period: time.Hour}, Cost: 4}}
	if ok, err := st.DecideAll(bg, "after-restart", limits, out); err != nil || !ok || out[0].Remaining != 7 || out[1].Remaining != 0 {
		t.Fatalf("(d) after the restart, DecideAll on a fresh key: %v %v %+v", ok, err, out)
	}
	if n := cmdstat(t, srv, "fcall", "failed_calls"); n < 1 {
		t.Fatalf("(d) the restarted server refused no FCALL (Function not found): %d; the test did not exercise the reload", n)
	}
	if n := cmdstat(t, srv, "function|load", "calls"); n < 1 {
		t.Fatalf("(d) the restarted server ran %d FUNCTION LOADs; want the library loaded again", n)
	}

	time.Sleep(100 * time.Millisecond) // a little load on the restarted server
	stopLoad()

	var all loadTally
	for g := range tallies {
		tl := &tallies[g]
		for _, p := range tl.problems {
			t.Errorf("worker %d: %s", g, p)
		}
		for ph := range numPhases {
			all.calls[ph] += tl.calls[ph]
			all.ok[ph] += tl.ok[ph]
			all.slow[ph] += tl.slow[ph]
			all.maxDur[ph] = max(all.maxDur[ph], tl.maxDur[ph])
		}
		all.hotLocal.approved += tl.hotLocal.approved
		all.hotLocal.refused += tl.hotLocal.refused
	}
	if n := panicsSeen.Load(); n > 0 {
		t.Errorf("(c) %d load goroutines panicked", n)
	}
	for ph := range numPhases {
		t.Logf("%-10s %6d calls, %6d decided by Redis, %5d took ≥ %v, longest %v",
			phaseNames[ph], all.calls[ph], all.ok[ph], all.slow[ph], timeout/2, all.maxDur[ph].Round(time.Microsecond))
		if all.maxDur[ph] >= slowTimeout+slack {
			t.Errorf("(a) a call started while %s took %v; want < slow timeout %v + %v", phaseNames[ph], all.maxDur[ph], slowTimeout, slack)
		}
	}
	t.Logf("breakers open %v after the hang began, closed %v after it ended; open %v after the kill; decisions back %v after the restart",
		hungOpen.Round(time.Millisecond), hungBack.Round(time.Millisecond), downOpen.Round(time.Millisecond), recovered.Round(time.Millisecond))
	if all.ok[phaseUp] == 0 || all.ok[phaseBack] == 0 {
		t.Errorf("Redis decided %d calls before the failures and %d after the restart; want some of each", all.ok[phaseUp], all.ok[phaseBack])
	}
	// (c) While hung, a call without the breaker would wait the whole timeout; with it, only
	// the calls in flight when it opened and the probes do.
	if h := all.calls[phaseHung]; h < 1000 || all.slow[phaseHung]*10 > h {
		t.Errorf("(c) while Redis hung, %d of %d calls took ≥ %v; want a tenth at most, and at least 1000 calls", all.slow[phaseHung], h, timeout/2)
	}
	// (c) While down, the store was asked only by the calls in flight when the breakers opened
	// and by one probe per breaker per cooldown.
	asked := statsUp.Calls - statsDown.Calls
	bound := uint64(workers + 3*(int(downFor/sluice.DefaultBreakerCooldown)+2))
	t.Logf("down %v: %d limiter calls, %d reached the store (bound %d)", downFor.Round(time.Millisecond), all.calls[phaseDown], asked, bound)
	if asked > bound || all.calls[phaseDown] < 1000 {
		t.Errorf("(c) while Redis was down the store was asked %d times for %d limiter calls; want at most %d", asked, all.calls[phaseDown], bound)
	}
	// (b) local: the in-process share of a fixed window of 10 is 5, exactly, for the hot key.
	if all.hotLocal.approved != 5 || all.hotLocal.refused == 0 {
		t.Errorf("(b) local fallback approved %d (refused %d) on one key while Redis was down; want exactly 5 (10 × 0.5) and refusals after", all.hotLocal.approved, all.hotLocal.refused)
	}
}

// TestNewUnreachable: a store can be created while nothing listens on Redis's address — a program
// must start, and limit, during a Redis outage. New returns at once with a store whose decisions
// fail with ErrStoreUnavailable (so a Limiter's failure mode applies: fail-open approves with
// FallbackOpen); once a redis-server answers on the address, the store connects by itself and
// decisions go to Redis. Close works at any time, also while the store is still connecting, and
// twice; options that retrying cannot mend (a malformed address) still fail New at once.
func TestNewUnreachable(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	t0 := time.Now()
	s, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with Redis down: %v; want a store that connects when Redis answers", err)
	}
	defer s.Close()
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("New on a dead address took %v", d)
	}
	p := sluice.Policy{Name: "down-at-start", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Hour}
	if d, err := s.Decide(bg, "c", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || d.Allowed {
		t.Fatalf("Decide with Redis down: %+v %v; want a refusal and ErrStoreUnavailable", d, err)
	}
	out := make([]sluice.Decision, 2)
	limits := []sluice.Limit{{Policy: p, Cost: 1}, {Policy: sluice.Policy{Name: "b", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour}, Cost: 1}}
	if ok, err := s.DecideAll(bg, "c", limits, out); ok || !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("DecideAll with Redis down: %v %v; want ErrStoreUnavailable", ok, err)
	}
	if err := s.Ping(bg); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("Ping with Redis down: %v; want ErrStoreUnavailable", err)
	}
	open, err := sluice.NewLimiter(s, p, sluice.WithFailureMode(sluice.FailOpen))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := open.Allow(bg, "c"); err != nil || !d.Allowed || d.Fallback != sluice.FallbackOpen {
		t.Fatalf("fail-open limiter with Redis down since New: %+v %v; want allowed with FallbackOpen", d, err)
	}

	// A second store on the dead address, closed while it is still connecting: Close returns
	// promptly; and again.
	other, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	other.Close()
	other.Close()
	if d := time.Since(t1); d > time.Second {
		t.Fatalf("Close while connecting took %v", d)
	}
	if _, err := other.Decide(bg, "c", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("Decide on a closed store: %v", err)
	}
	var none *redis.Store
	none.Close() // a failed New's nil store: `defer rs.Close()` before checking err must not panic

	// Redis comes up on the address: the store connects, and decisions go to it.
	srv.Restart()
	var d sluice.Decision
	if !pollUntil(time.Now().Add(10*time.Second), func() bool {
		d, err = s.Decide(bg, "c", p, 1)
		return err == nil
	}) {
		t.Fatalf("10s after Redis came up, Decide still fails: %v", err)
	}
	if !d.Allowed || d.Remaining != p.Limit-1 {
		t.Fatalf("the first decision on Redis: %+v; want approved, Remaining %d", d, p.Limit-1)
	}
	if keys := mustDo(t, srv, "KEYS", "*{c}*"); !strings.Contains(keys, "rate-limit:{c}:down-at-start") {
		t.Fatalf("keys in Redis after the decision: %q", keys)
	}
	if ok, err := s.DecideAll(bg, "c", limits, out); err != nil || !ok || out[0].Remaining != p.Limit-2 || out[1].Remaining != 4 {
		t.Fatalf("DecideAll once connected: %v %v %+v", ok, err, out)
	}
	if err := s.Ping(bg); err != nil {
		t.Fatalf("Ping once connected: %v", err)
	}
	if !pollUntil(time.Now().Add(5*time.Second), func() bool { // the breaker's next probe
		d, err = open.Allow(bg, "c")
		return err == nil && d.Fallback == sluice.NoFallback
	}) {
		t.Fatalf("the fail-open limiter does not decide on Redis once it answers: %+v %v", d, err)
	}
	if d.Remaining != p.Limit-3 {
		t.Fatalf("the limiter's decision on Redis: %+v; want Remaining %d", d, p.Limit-3)
	}

	// What retrying cannot mend is an error at once.
	for _, bad := range []redis.Options{
		{Addrs: []string{"127.0.0.1"}},
		{Addrs: []string{srv.Addr, "127.0.0.1:http"}},
		{Addrs: []string{"127.0.0.1:70000"}},
		{URL: "redis://127.0.0.1:0"},
	} {
		t0 := time.Now()
		s, err := redis.New(bad)
		if err == nil {
			s.Close()
			t.Errorf("New(%+v): no error", bad)
			continue
		}
		if time.Since(t0) > 100*time.Millisecond || (!strings.Contains(err.Error(), "Addrs[") && !strings.Contains(err.Error(), "URL")) {
			t.Errorf("New(%+v): %v after %v; want at once an error naming the field", bad, err, time.Since(t0))
		}
	}
}

// Negative cache.
//
// TestNegativeCacheVirtualClock: 10,000 requests on real Redis, on a virtual clock that moves
// 500µs between requests, checked one by one against the pure core (package algorithm): the cache
// never refuses what Redis would approve, and its refusals' RetryAfter is never longer than the
// true wait. A client of cost 1 on a fixed window spent in every window (the cache must answer
// nine tenths of its refusals at least), and one on a token bucket whose cost changes now and
// then among 1..5 (a cached refusal of one cost must not answer a smaller cost that fits).
func TestNegativeCacheVirtualClock(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name    string
		p       sluice.Policy
		maxCost int64 // costs 1..maxCost, changing with probability 1/20 per request
	}{
		{"fixed-window", sluice.Policy{Name: "nc-fw", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}, 1},
		{"token-bucket-changing-costs", sluice.Policy{Name: "nc-tb", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 5}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))
			st := openStore(t, srv, redis.Options{Clock: clock})
			var ref algorithm.State
			rng := rand.New(rand.NewPCG(1, 2))
			const requests = 10_000
			approved, cachedRefusals := 0, 0
			cost := int64(1)
			for i := range requests {
				if rng.IntN(20) == 0 {
					cost = 1 + rng.Int64N(tc.maxCost)
				}
				now := clock.Now().UnixMicro()
				want, err := algorithm.Decide(&tc.p, &ref, now, cost)
				if err != nil {
					t.Fatal(err)
				}
				before := st.Stats()
				d, err := st.Decide(bg, "client", tc.p, cost)
				if err != nil {
					t.Fatal(err)
				}
				cached := st.Stats().CacheHits > before.CacheHits
				if d.Allowed != want.Allowed {
					t.Fatalf("request %d (cost %d, cached %v): %+v; Redis/the core decides %+v", i, cost, cached, d, want)
				}
				if cached {
					// A refusal, whose wait is at most the true one: the client retries no later
					// than it may. (Its Remaining is the one Redis reported when it refused: other
					// traffic and time may have changed it since.)
					cachedRefusals++
					if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > want.RetryAfter {
						t.Fatalf("request %d (cost %d): cached %+v; the true decision is %+v", i, cost, d, want)
					}
				} else if d != want {
					t.Fatalf("request %d (cost %d): Redis decided %+v, the core %+v", i, cost, d, want)
				}
				if d.Allowed {
					approved++
				}
				clock.Advance(500 * time.Microsecond)
			}
			s := st.Stats()
			if s.Calls+s.CacheHits != requests || s.CacheHits != uint64(cachedRefusals) {
				t.Fatalf("stats %+v for %d requests, %d answered from the cache", s, requests, cachedRefusals)
			}
			refused := requests - approved
			t.Logf("%d requests over %v of virtual time: %d approved, %d refused, %d of them from the cache; %d calls to Redis (%.1f%% of requests saved)",
				requests, time.Duration(requests)*500*time.Microsecond, approved, refused, s.CacheHits, s.Calls, 100*float64(s.CacheHits)/requests)
			if tc.maxCost == 1 && s.CacheHits*10 < uint64(refused)*9 {
				t.Fatalf("the cache answered %d of %d refusals; want nine tenths at least", s.CacheHits, refused)
			}
		})
	}
}

// TestNegativeCacheRealTime: on Redis's own clock, 8 goroutines hammer a spent fixed window
// (10,000 requests): Redis is asked a handful of times, every answer is a refusal whose RetryAfter
// is positive and no longer than the true wait, and once the window rolls over the client is
// approved again, at once (the cache does not outlast the refusal).
func TestNegativeCacheRealTime(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{})
	p := sluice.Policy{Name: "nc-real", Algorithm: sluice.FixedWindow, Limit: 5, Period: 300 * time.Millisecond}
	// Start early in a window, so that the hammering fits in it.
	awaitWindowStart(t, func() int64 { return redisTime(t, srv) }, p.PeriodMicros())
	for i := range p.Limit {
		if d, err := st.Decide(bg, "client", p, 1); err != nil || !d.Allowed {
			t.Fatalf("request %d: %+v %v", i, d, err)
		}
	}
	sent := time.Now()
	first, err := st.Decide(bg, "client", p, 1)
	received := time.Now()
	if err != nil || first.Allowed || first.RetryAfter <= 0 {
		t.Fatalf("the window spent: %+v %v; want a refusal", first, err)
	}
	// Redis decided between sent and received; the window ends RetryAfter after that.
	endLatest := received.Add(first.RetryAfter)
	base := st.Stats()

	// 8 goroutines × 1250 requests, each stopping early should the window come near its end (the
	// earliest it can end is sent + RetryAfter): every request made is certainly refused.
	const goroutines, perG = 8, 1250
	stopBy := sent.Add(first.RetryAfter - 5*time.Millisecond)
	var (
		wg   sync.WaitGroup
		made atomic.Int64
		errs = make(chan string, goroutines)
	)
	for range goroutines {
		wg.Go(func() {
			for range perG {
				t0 := time.Now()
				if t0.After(stopBy) {
					return
				}
				d, err := st.Decide(bg, "client", p, 1)
				made.Add(1)
				if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > endLatest.Sub(t0) {
					errs <- fmt.Sprintf("%+v %v at %v after the first refusal; the window ends at most %v after the request", d, err, t0.Sub(sent), endLatest.Sub(t0))
					return
				}
			}
		})
	}
	wg.Wait()
	hammered := time.Since(sent)
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	s := st.Stats()
	n, calls, hits := uint64(made.Load()), s.Calls-base.Calls, s.CacheHits-base.CacheHits
	t.Logf("%d requests by %d goroutines in %v on a spent window: %d calls to Redis, %d answered from the cache (%.2f%% saved)",
		n, goroutines, hammered.Round(time.Millisecond), calls, hits, 100*float64(hits)/float64(n))
	if n < goroutines*perG/2 || calls+hits != n || calls > n/100 {
		t.Fatalf("%d calls to Redis and %d cache hits for %d requests; want at most 1%% calls, and at least %d requests", calls, hits, n, goroutines*perG/2)
	}

	// The window rolls over: the client is approved as soon as it ends, not when a cache says so.
	var approvedAt time.Time
	if !pollUntil(endLatest.Add(200*time.Millisecond), func() bool {
		d, err := st.Decide(bg, "client", p, 1)
		if err != nil {
			t.Fatal(err)
		}
		approvedAt = time.Now()
		return d.Allowed
	}) {
		t.Fatalf("still refused 200ms after the window ended (%v after the first refusal)", time.Since(sent))
	}
	if early := sent.Add(first.RetryAfter).Sub(approvedAt); early > time.Millisecond {
		t.Fatalf("approved %v before the window's end", early)
	}
}

// TestNegativeCacheMatchesRedis: with no other traffic on the key, a refusal answered from the
// cache must be the refusal Redis gives at that instant, field by field — the cache is documented
// as exact, and every store is to decide alike. The truth comes from a second store without a
// cache on the same key at the same virtual instant (a refusal writes nothing, so asking changes
// nothing). RetryAfter and ResetAfter both count down from the refusal the cache remembers.
func TestNegativeCacheMatchesRedis(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.UnixMicro(1_800_000_000_000_000))
	cached := openStore(t, srv, redis.Options{Clock: clock})
	truth := openStore(t, srv, redis.Options{Clock: clock, NegativeCacheSize: -1})
	for _, p := range []sluice.Policy{
		{Name: "m-fw", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Second},
		{Name: "m-sl", Algorithm: sluice.SlidingLog, Limit: 3, Period: time.Second},
		{Name: "m-sw", Algorithm: sluice.SlidingWindow, Limit: 3, Period: time.Second},
		{Name: "m-tb", Algorithm: sluice.TokenBucket, Limit: 3, Period: time.Second, Burst: 3},
		{Name: "m-lb", Algorithm: sluice.LeakyBucket, Limit: 3, Period: time.Second, Burst: 2},
	} {
		for i := range p.Capacity() {
			if d, err := cached.Decide(bg, "k", p, 1); err != nil || !d.Allowed {
				t.Fatalf("%v: request %d: %+v %v", p.Algorithm, i, d, err)
			}
			clock.Advance(time.Millisecond)
		}
		first, err := cached.Decide(bg, "k", p, 1)
		if err != nil || first.Allowed || first.RetryAfter <= 0 {
			t.Fatalf("%v: spent: %+v %v; want a refusal", p.Algorithm, first, err)
		}
		for step := 1; step <= 3; step++ {
			clock.Advance(first.RetryAfter / 4)
			hits := cached.Stats().CacheHits
			got, err1 := cached.Decide(bg, "k", p, 1)
			want, err2 := truth.Decide(bg, "k", p, 1)
			if err1 != nil || err2 != nil || cached.Stats().CacheHits != hits+1 {
				t.Fatalf("%v: %v %v; want an answer from the cache", p.Algorithm, err1, err2)
			}
			if !got.Cached() || want.Cached() {
				t.Errorf("%v: Cached %v from the cache, %v from Redis", p.Algorithm, got.Cached(), want.Cached())
			}
			got.Source = sluice.FromStore
			if got != want {
				t.Errorf("%v, %v after the refusal: the cache answers %+v, Redis %+v", p.Algorithm, time.Duration(step)*(first.RetryAfter/4), got, want)
			}
		}
		clock.Advance(first.RetryAfter) // past the refusal
	}
}
