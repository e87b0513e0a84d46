package redis_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/allot"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// ledgerOn returns a ledger of policy on a store on addrs (a virtual clock if clock is set).
func ledgerOn(t *testing.T, addrs []string, clock sluice.Clock, policy string, opts redis.LedgerOptions) *redis.Ledger {
	t.Helper()
	s := newStore(t, redis.Options{Addrs: addrs, Clock: clock})
	l, err := s.Ledger(policy, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func refresh(t *testing.T, l *redis.Ledger, region string, r redis.Report) redis.Grant {
	t.Helper()
	g, err := l.Refresh(context.Background(), region, r)
	if err != nil {
		t.Fatalf("refresh %s: %v", region, err)
	}
	return g
}

func readLedger(t *testing.T, l *redis.Ledger) redis.LedgerView {
	t.Helper()
	v, err := l.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkSum fails if the live regions' allotments, or what the ledger counts as held, exceed the
// limit, as read back from Redis.
func checkSum(t *testing.T, l *redis.Ledger) redis.LedgerView {
	t.Helper()
	v := readLedger(t, l)
	lim := l.Options().Limit
	if v.Outstanding() > lim || v.Held() > lim {
		t.Fatalf("outstanding %d, held %d over the limit %d: %+v", v.Outstanding(), v.Held(), lim, v.Regions)
	}
	return v
}

// refreshHolding is a region's refresh as its loop does it: it reports the grant it holds, and
// confirms at once a grant that shrank (Grant.Confirm), so that the ledger gives the difference
// back to the others.
func refreshHolding(t *testing.T, l *redis.Ledger, region string, last redis.Grant, want int64) redis.Grant {
	t.Helper()
	rep := redis.Report{Want: want}
	if !last.Expires.IsZero() {
		rep.Holds, rep.HoldsExpires = last.Allotment, last.Expires
	}
	g := refresh(t, l, region, rep)
	if g.Confirm {
		rep.Holds, rep.HoldsExpires = g.Allotment, g.Expires
		g = refresh(t, l, region, rep)
	}
	return g
}

// virtualLedger starts a Redis and returns it with a virtual clock and a ledger of policy on it,
// past its learning mode.
func virtualLedger(t *testing.T, policy string, opts redis.LedgerOptions) (*redistest.Server, *sluice.ManualClock, *redis.Ledger) {
	t.Helper()
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
	l := ledgerOn(t, []string{srv.Addr}, clock, policy, opts)
	pastLearning(t, l, clock, "eu")
	return srv, clock, l
}

// pastLearning moves the clock past the learning mode of a ledger whose state began now (a first
// refresh begins it).
func pastLearning(t *testing.T, l *redis.Ledger, clock *sluice.ManualClock, region string) {
	t.Helper()
	g := refresh(t, l, region, redis.Report{})
	if !g.Learning {
		t.Fatalf("a new ledger is not learning: %+v", g)
	}
	clock.Advance(l.Options().Lease + l.Options().Hold)
}

// The script's split is the allot package's, on random wants, limits, floors and region counts,
// both algorithms, up to 2^47 (the proportional share's products exact beyond 2^53).
func TestLedgerDifferential(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
	r := rand.New(rand.NewPCG(7, 8))
	for iter := range 150 {
		k := 1 + r.IntN(8)
		lim := []int64{1 + r.Int64N(20), 1 + r.Int64N(100000), 1 + r.Int64N(redis.MaxLedgerLimit)}[r.IntN(3)]
		n := k + r.IntN(3)
		floor := int64(0)
		if r.IntN(2) == 0 {
			floor = r.Int64N(lim/int64(n) + 1)
		}
		alg := []allot.Algorithm{allot.Fair, allot.Proportional}[r.IntN(2)]
		opts := redis.LedgerOptions{Limit: lim, Regions: n, Floor: floor, Lease: time.Minute, Algorithm: alg}
		l := ledgerOn(t, []string{srv.Addr}, clock, fmt.Sprintf("diff-%d", iter), opts)
		pastLearning(t, l, clock, "r0")
		want := make([]int64, k)
		names := make([]string, k)
		for i := range want {
			names[i] = fmt.Sprintf("r%d", i)
			switch r.IntN(4) {
			case 0:
				want[i] = r.Int64N(lim/int64(k) + 2)
			case 1:
				want[i] = r.Int64N(redis.MaxLedgerLimit)
			default:
				want[i] = min(r.Int64N(2*lim+1), redis.MaxLedgerLimit)
			}
		}
		// The first round tells the ledger every want; the second reads the shares of them.
		for round := range 2 {
			for i, name := range names {
				g := refresh(t, l, name, redis.Report{Want: want[i]})
				if round == 0 {
					continue
				}
				raised := make([]int64, k)
				for j := range want {
					raised[j] = max(want[j], floor)
				}
				exp := allot.Split(alg, lim-floor*int64(max(0, n-k)), raised)
				if g.Share != exp[i] {
					t.Fatalf("case %d (%s, limit %d, floor %d, %d of %d regions, wants %v): %s's share %d; allot says %d (%v)",
						iter, alg, lim, floor, k, n, want, name, g.Share, exp[i], exp)
				}
				if g.Allotment > g.Share || g.Allotment > g.Free {
					t.Fatalf("case %d: %s allotted %d over its share %d or the free %d", iter, name, g.Allotment, g.Share, g.Free)
				}
			}
			checkSum(t, l)
		}
	}
}

// Demand moving 70/20/10 -> 10/20/70 over a limit the total demand exceeds re-converges by each
// region's second refresh after the move, in every order of the refreshes, and the sum of the
// allotments never exceeds the limit meanwhile. On one Redis and on a Redis Cluster.
func TestLedgerConverges(t *testing.T) {
	t.Run("single", func(t *testing.T) { testLedgerConverges(t, []string{redistest.Start(t).Addr}) })
	t.Run("cluster", func(t *testing.T) { testLedgerConverges(t, redistest.StartCluster(t, 3).Addrs()) })
}

func testLedgerConverges(t *testing.T, addrs []string) {
	regions := []string{"eu", "us", "ap"}
	before, after := []int64{700, 200, 100}, []int64{100, 200, 700}
	orders := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for _, alg := range []allot.Algorithm{allot.Fair, allot.Proportional} {
		for oi, o1 := range orders {
			for _, o2 := range orders {
				clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
				opts := redis.LedgerOptions{Limit: 600, Regions: 3, Floor: 10, Lease: 10 * time.Second, Algorithm: alg}
				l := ledgerOn(t, addrs, clock, fmt.Sprintf("conv-%s-%d-%d%d%d", alg, oi, o2[0], o2[1], o2[2]), opts)
				pastLearning(t, l, clock, "eu")
				allotted := map[string]redis.Grant{}
				round := func(order []int, want []int64) {
					for _, i := range order {
						allotted[regions[i]] = refreshHolding(t, l, regions[i], allotted[regions[i]], want[i])
						checkSum(t, l)
					}
					clock.Advance(time.Second)
				}
				converged := func(want []int64) bool {
					exp := allot.Split(alg, 600, want)
					for i, name := range regions {
						if allotted[name].Allotment != exp[i] {
							return false
						}
					}
					return true
				}
				for range 3 {
					round(orders[0], before)
				}
				if !converged(before) {
					t.Fatalf("%s: 70/20/10 did not converge: %v", alg, allotted)
				}
				round(o1, after)
				round(o2, after)
				if !converged(after) {
					exp := allot.Split(alg, 600, after)
					t.Fatalf("%s, orders %v then %v: after two refreshes %v; the shares are %v", alg, o1, o2, allotted, exp)
				}
			}
		}
	}
}

// An idle region gives back at its next refresh (down to the floor); a region that stops
// refreshing keeps its lease, and what it holds, until the lease ends, and only then does the
// ledger give it to another.
func TestLedgerLeases(t *testing.T) {
	opts := redis.LedgerOptions{Limit: 1000, Regions: 2, Floor: 50, Lease: 10 * time.Second}
	_, clock, l := virtualLedger(t, "leases", opts)
	refresh(t, l, "eu", redis.Report{Want: 900})
	refresh(t, l, "us", redis.Report{Want: 900})
	eu := refresh(t, l, "eu", redis.Report{Want: 900})
	us := refresh(t, l, "us", redis.Report{Want: 900})
	if eu.Allotment != 500 || us.Allotment != 500 {
		t.Fatalf("both wanting 900 of 1000: %d and %d", eu.Allotment, us.Allotment)
	}
	// eu goes idle: it gives back down to the floor at its refresh, and us takes the rest.
	eu = refresh(t, l, "eu", redis.Report{Want: 0})
	us = refresh(t, l, "us", redis.Report{Want: 2000})
	if eu.Allotment != 50 || us.Allotment != 950 {
		t.Fatalf("eu idle: eu %d (the floor is 50), us %d", eu.Allotment, us.Allotment)
	}
	// eu wants again, and us stops refreshing: us's lease holds until it ends.
	end := us.Expires
	for clock.Now().Add(time.Second).Before(end) {
		clock.Advance(time.Second)
		eu = refresh(t, l, "eu", redis.Report{Want: 2000})
		if eu.Allotment != 50 {
			t.Fatalf("at %v, before us's lease ends at %v, eu got %d: us's 950 given away", clock.Now(), end, eu.Allotment)
		}
	}
	clock.Set(end)
	eu = refresh(t, l, "eu", redis.Report{Want: 2000})
	// us's lease ended: its quota comes back, but the floor stays reserved for it (2 regions).
	if eu.Allotment != 950 {
		t.Fatalf("us's lease ended: eu got %d; want 1000 - 50 reserved for us", eu.Allotment)
	}
	v := checkSum(t, l)
	if len(v.Regions) != 1 || v.Regions[0].Region != "eu" {
		t.Fatalf("the ledger still holds %+v", v.Regions)
	}
	// us's enforcement: its lease until LocalExpires, then the safe share (the floor by default).
	if a, safe := l.Enforce(us, us.LocalExpires.Add(-time.Microsecond)); a != 950 || safe {
		t.Errorf("Enforce before the lease's end: %d %v", a, safe)
	}
	if a, safe := l.Enforce(us, us.LocalExpires); a != 50 || !safe {
		t.Errorf("Enforce at the lease's end: %d %v; want the safe share 50", a, safe)
	}
	if a, safe := l.Enforce(redis.Grant{}, clock.Now()); a != 50 || safe {
		t.Errorf("Enforce with no grant: %d %v; want the floor", a, safe)
	}
}

// A region cut off keeps its lease until it ends, and with a hold (a fixed window's period) its
// allotment counts in full for the hold beyond: what it admitted under the lease since its last
// report cannot be given back within that window.
func TestLedgerHold(t *testing.T) {
	srv := redistest.Start(t)
	clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
	opts := redis.LedgerOptions{Limit: 1000, Regions: 2, Lease: 5 * time.Second, Hold: time.Minute}
	l := ledgerOn(t, []string{srv.Addr}, clock, "hold", opts)
	refresh(t, l, "eu", redis.Report{})
	clock.Advance(opts.Lease) // every lease the ledger did not know of has ended, not yet its hold
	if g := refresh(t, l, "eu", redis.Report{}); !g.Learning {
		t.Fatalf("a lease after the state began, within the hold: not learning: %+v", g)
	}
	clock.Advance(opts.Hold)
	refresh(t, l, "eu", redis.Report{Want: 700})
	refresh(t, l, "us", redis.Report{Want: 300})
	eu := refresh(t, l, "eu", redis.Report{Want: 700})
	clock.Set(eu.Expires) // eu is cut off: its lease ended
	us := refresh(t, l, "us", redis.Report{Want: 1000})
	if us.Allotment != 300 {
		t.Fatalf("within the hold after eu's lease: us got %d; want 300", us.Allotment)
	}
	if v := checkSum(t, l); v.Held() != 1000 {
		t.Fatalf("held %d; want eu's 700 and us's 300", v.Held())
	}
	clock.Set(eu.Expires.Add(opts.Hold))
	if us = refresh(t, l, "us", redis.Report{Want: 1000}); us.Allotment != 1000 {
		t.Fatalf("after the hold: us got %d; want 1000", us.Allotment)
	}
	start := time.Unix(1_700_000_040, 0)
	for _, c := range []struct {
		alg         algorithm.Algorithm
		st          redis.UseState
		burst       int64
		used        int64
		until       time.Time
		description string
	}{
		{algorithm.FixedWindow, redis.UseState{WindowStart: start, Cur: 40}, 0, 40, start.Add(time.Minute), "the window's count, to its end"},
		{algorithm.SlidingWindow, redis.UseState{WindowStart: start, Prev: 30, Cur: 5}, 0, 5 + 23, start.Add(2 * time.Minute), "⌈30·45/60⌉ + 5, to the next window's end"},
		{algorithm.TokenBucket, redis.UseState{InUse: 7, Full: start.Add(time.Second)}, 30, 3, start.Add(time.Second), "⌈7·10/30⌉, until full"},
	} {
		used, until := redis.LedgerUse(c.alg, time.Minute, 10, c.burst, start.Add(15*time.Second), c.st)
		if used != c.used || !until.Equal(c.until) {
			t.Errorf("LedgerUse(%v): %d until %v; want %s: %d until %v", c.alg, used, until, c.description, c.used, c.until)
		}
	}
	if h := redis.LedgerHold(algorithm.SlidingWindow, time.Minute, 10, 0); h != 2*time.Minute {
		t.Errorf("LedgerHold(sliding window, 1m) = %v", h)
	}
	if h := redis.LedgerHold(algorithm.TokenBucket, time.Minute, 10, 30); h != 3*time.Minute {
		t.Errorf("LedgerHold(token bucket, 1m, 10, burst 30) = %v", h)
	}
}

// A region whose allotment shrank keeps enforcing the larger one until the grant reaches it: the
// ledger counts the larger until the region's next refresh confirms the smaller, so no other region
// gets the difference in between.
func TestLedgerConfirm(t *testing.T) {
	_, _, l := virtualLedger(t, "confirm", redis.LedgerOptions{Limit: 1000, Regions: 2, Lease: 10 * time.Second})
	var eu, us redis.Grant
	for range 2 {
		eu = refreshHolding(t, l, "eu", eu, 800)
		us = refreshHolding(t, l, "us", us, 200)
	}
	if eu.Allotment != 800 || us.Allotment != 200 {
		t.Fatalf("800/200: %d, %d", eu.Allotment, us.Allotment)
	}
	shrunk := refresh(t, l, "eu", redis.Report{Want: 100, Holds: eu.Allotment, HoldsExpires: eu.Expires})
	if shrunk.Allotment != 100 || !shrunk.Confirm {
		t.Fatalf("eu's demand fell to 100: %+v", shrunk)
	}
	if g := refresh(t, l, "us", redis.Report{Want: 900, Holds: us.Allotment, HoldsExpires: us.Expires}); g.Allotment != 200 {
		t.Fatalf("before eu confirmed its 100, us got %d of the 800 eu still enforces", g.Allotment)
	}
	refresh(t, l, "eu", redis.Report{Want: 100, Holds: shrunk.Allotment, HoldsExpires: shrunk.Expires})
	if g := refresh(t, l, "us", redis.Report{Want: 900, Holds: us.Allotment, HoldsExpires: us.Expires}); g.Allotment != 900 {
		t.Fatalf("after eu confirmed its 100, us got %d; want 900", g.Allotment)
	}
	checkSum(t, l)
}

// A fixed window's use cannot be given back within its window: a region that used 600 of its
// 700 holds 600 until the window's end, even if its lease ends first, so the others never get it
// back within the window (worldwide admissions in the window ≤ the limit).
func TestLedgerUseCounts(t *testing.T) {
	_, clock, l := virtualLedger(t, "use", redis.LedgerOptions{Limit: 1000, Regions: 2, Lease: 5 * time.Second})
	windowEnd := clock.Now().Add(time.Minute)
	refresh(t, l, "eu", redis.Report{Want: 700})
	refresh(t, l, "us", redis.Report{Want: 300})
	eu := refresh(t, l, "eu", redis.Report{Want: 700, Used: 600, UsedUntil: windowEnd})
	if eu.Allotment != 700 {
		t.Fatalf("eu: %d", eu.Allotment)
	}
	// eu's demand falls to 0, but it used 600 in this window: it holds 600 whatever its allotment.
	eu = refresh(t, l, "eu", redis.Report{Want: 0, Used: 600, UsedUntil: windowEnd})
	us := refresh(t, l, "us", redis.Report{Want: 1000})
	if eu.Allotment != 0 || us.Allotment != 400 {
		t.Fatalf("eu idle having used 600: eu %d, us %d; want 0 and 400", eu.Allotment, us.Allotment)
	}
	clock.Set(eu.Expires) // eu's lease ends: its use still counts until the window ends
	us = refresh(t, l, "us", redis.Report{Want: 1000})
	if us.Allotment != 400 {
		t.Fatalf("eu's lease ended within the window: us got %d; want 400", us.Allotment)
	}
	checkSum(t, l)
	clock.Set(windowEnd)
	us = refresh(t, l, "us", redis.Report{Want: 1000})
	if us.Allotment != 1000 {
		t.Fatalf("the window ended: us got %d; want 1000", us.Allotment)
	}
	if v := checkSum(t, l); len(v.Regions) != 1 {
		t.Fatalf("eu was not dropped after its lease and its window: %+v", v.Regions)
	}
}

// The ledger flushed: for one lease it is learning, hands out no quota beyond what each region
// reports holding (the floor to a region without a lease), so with the leases it does not know
// of (regions that have not refreshed since) the sum stays within the limit; after a lease it
// splits by demand again.
func TestLedgerLearning(t *testing.T) {
	opts := redis.LedgerOptions{Limit: 900, Regions: 4, Floor: 30, Lease: 10 * time.Second}
	srv, clock, l := virtualLedger(t, "learn", opts)
	held := map[string]redis.Grant{}
	for range 3 {
		for _, name := range []string{"eu", "us", "ap"} {
			held[name] = refresh(t, l, name, redis.Report{Want: 500})
		}
	}
	old := readLedger(t, l)
	if old.Outstanding() != 900-30 {
		t.Fatalf("3 of 4 regions wanting 500: outstanding %d; want 870 (30 reserved)", old.Outstanding())
	}
	mustDo(t, srv, "FLUSHALL")
	clock.Advance(time.Second)
	// eu refreshes, wanting everything: it gets what it reports holding, no more.
	eu := refresh(t, l, "eu", redis.Report{Want: 900, Holds: held["eu"].Allotment, HoldsExpires: held["eu"].Expires})
	if !eu.Learning || eu.Allotment != held["eu"].Allotment {
		t.Fatalf("learning: eu got %+v; it held %d", eu, held["eu"].Allotment)
	}
	// A new region, without a lease, gets its floor; one that claims more than is left is capped.
	sa := refresh(t, l, "sa", redis.Report{Want: 900})
	if !sa.Learning || sa.Allotment != 30 {
		t.Fatalf("learning: a new region got %+v; want the floor 30", sa)
	}
	liar := refresh(t, l, "xx", redis.Report{Want: 900, Holds: 900, HoldsExpires: clock.Now().Add(time.Second)})
	// us and ap hold their old leases, unknown to the ledger: with them, the sum ≤ the limit.
	if liar.Allotment > 900-eu.Allotment-sa.Allotment {
		t.Fatalf("learning: a claim of 900 got %d; only %d was left", liar.Allotment, 900-eu.Allotment-sa.Allotment)
	}
	if sum := eu.Allotment + sa.Allotment + held["us"].Allotment + held["ap"].Allotment; sum > 900 {
		t.Fatalf("learning: eu %d + sa %d + the unknown leases of us %d and ap %d = %d > 900",
			eu.Allotment, sa.Allotment, held["us"].Allotment, held["ap"].Allotment, sum)
	}
	// Until one lease from the state's beginning, eu gets no more.
	for clock.Now().Add(time.Second).Before(eu.Since.Add(opts.Lease)) {
		clock.Advance(time.Second)
		if g := refresh(t, l, "eu", redis.Report{Want: 900, Holds: eu.Allotment, HoldsExpires: eu.Expires}); !g.Learning || g.Allotment > eu.Allotment {
			t.Fatalf("learning at %v: eu got %+v", clock.Now(), g)
		}
	}
	clock.Set(eu.Since.Add(opts.Lease))
	g := refresh(t, l, "eu", redis.Report{Want: 900})
	if g.Learning {
		t.Fatalf("still learning a lease after the state began: %+v", g)
	}
	checkSum(t, l)
}

// Many regions refreshing at once with random demand and honest uses, on Redis's own clock with
// short leases (some lapse: a region waits for its lease to end, read back from the ledger): at
// every read the live allotments and what the ledger counts as held are within the limit. Also on
// a Redis Cluster.
func TestLedgerConcurrent(t *testing.T) {
	t.Run("single", func(t *testing.T) { testLedgerConcurrent(t, []string{redistest.Start(t).Addr}) })
	t.Run("cluster", func(t *testing.T) { testLedgerConcurrent(t, redistest.StartCluster(t, 3).Addrs()) })
}

func testLedgerConcurrent(t *testing.T, addrs []string) {
	const lim, regions = 1000, 8
	opts := redis.LedgerOptions{Limit: lim, Regions: regions, Floor: 20, Lease: time.Second, Algorithm: allot.Fair}
	l := ledgerOn(t, addrs, nil, "concurrent", opts)
	var wg sync.WaitGroup
	var done atomic.Int32
	var reads, full atomic.Int64
	errs := make(chan error, regions+1)
	wg.Add(1)
	go func() { // the reader
		defer wg.Done()
		for done.Load() < regions {
			v, err := l.Read(context.Background())
			if err != nil {
				errs <- err
				return
			}
			if v.Outstanding() > lim || v.Held() > lim {
				errs <- fmt.Errorf("outstanding %d, held %d > %d: %+v", v.Outstanding(), v.Held(), lim, v.Regions)
				return
			}
			reads.Add(1)
			if v.Outstanding() > lim/2 {
				full.Add(1)
			}
		}
	}()
	for i := range regions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer done.Add(1)
			name := fmt.Sprintf("region-%d", i)
			r := rand.New(rand.NewPCG(uint64(i), 99))
			var last redis.Grant
			for iter := range 150 {
				enforced, safe := l.Enforce(last, time.Now())
				want := r.Int64N(50) // demand that moves: idle, then wanting much of the limit
				if r.IntN(2) == 0 {
					want = r.Int64N(2 * lim)
				}
				rep := redis.Report{Want: want, Admitted: r.Int64N(100), Refused: r.Int64N(100)}
				if !last.LocalExpires.IsZero() && !safe {
					rep.Holds, rep.HoldsExpires = enforced, last.Expires
					if r.IntN(2) == 0 { // a use it really had under its lease: at most its allotment
						rep.Used, rep.UsedUntil = r.Int64N(enforced+1), time.Now().Add(time.Duration(r.IntN(1500))*time.Millisecond)
					}
				}
				g, err := l.Refresh(context.Background(), name, rep)
				if err == nil && g.Confirm && r.IntN(4) > 0 { // (some confirm only at their next refresh)
					rep.Holds, rep.HoldsExpires, rep.Used = g.Allotment, g.Expires, min(rep.Used, g.Allotment)
					g, err = l.Refresh(context.Background(), name, rep)
				}
				if err != nil {
					errs <- err
					return
				}
				last = g
				if iter%50 == 49 && i%3 == 0 { // it stops refreshing until its lease has ended
					for {
						v, err := l.Read(context.Background())
						if err != nil {
							errs <- err
							return
						}
						i := slices.IndexFunc(v.Regions, func(r redis.LedgerRegion) bool { return r.Region == name })
						if i < 0 || !v.Regions[i].Live {
							break
						}
					}
					last = redis.Grant{}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if reads.Load() == 0 || full.Load() == 0 {
		t.Fatalf("the reader read %d times, %d of them with more than half the limit allotted", reads.Load(), full.Load())
	}
	checkSum(t, l)
}

// Inputs are checked: names, bounds, the number of regions.
func TestLedgerValidation(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redis.Options{Addrs: []string{srv.Addr}})
	for _, c := range []struct {
		policy string
		opts   redis.LedgerOptions
		err    string
	}{
		{"p", redis.LedgerOptions{}, "limit 0"},
		{"p", redis.LedgerOptions{Limit: redis.MaxLedgerLimit + 1}, "limit"},
		{"p p", redis.LedgerOptions{Limit: 10}, "policy name"},
		{"", redis.LedgerOptions{Limit: 10}, "policy name"},
		{"p", redis.LedgerOptions{Limit: 10, Regions: 65}, "65 regions"},
		{"p", redis.LedgerOptions{Limit: 10, Regions: 3, Floor: 4}, "floor 4"},
		{"p", redis.LedgerOptions{Limit: 10, Safe: 11}, "safe share 11"},
		{"p", redis.LedgerOptions{Limit: 10, Lease: time.Microsecond}, "lease"},
		{"p", redis.LedgerOptions{Limit: 10, Algorithm: "random"}, "algorithm"},
	} {
		if _, err := s.Ledger(c.policy, c.opts); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Ledger(%q, %+v): %v; want an error with %q", c.policy, c.opts, err, c.err)
		}
	}
	l, err := s.Ledger("p", redis.LedgerOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		region string
		rep    redis.Report
		err    string
	}{
		{"", redis.Report{}, "region name"},
		{"eu/west", redis.Report{}, "region name"},
		{strings.Repeat("a", 129), redis.Report{}, "region name"},
		{"eu", redis.Report{Want: -1}, "want -1"},
		{"eu", redis.Report{Used: redis.MaxLedgerLimit + 1}, "used"},
	} {
		if _, err := l.Refresh(ctx, c.region, c.rep); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Refresh(%q, %+v): %v; want an error with %q", c.region, c.rep, err, c.err)
		}
	}
	for i := range redis.MaxLedgerRegions {
		if _, err := l.Refresh(ctx, fmt.Sprintf("r%d", i), redis.Report{Want: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Refresh(ctx, "one-more", redis.Report{Want: 1}); err == nil || !strings.Contains(err.Error(), "too many clients (at most 64)") {
		t.Fatalf("a 65th region: %v", err)
	}
	if got := redis.Demand(30, 30, 10*time.Second, time.Minute); got != 360 {
		t.Errorf("Demand(30+30 in 10s, per minute) = %d; want 360", got)
	}
}

// Regions enforcing their allotments on fixed windows (a counter each, on the virtual clock),
// refreshing every 2 s from the ledger on a real Redis, as a region's loop would (reporting demand,
// the grant held, the window's count; confirming a shrink at once): demand 70/20/10 of 1.5 times the
// limit, moving to 10/20/70; one region cut off for three leases (it enforces its lease, then the
// safe share); the ledger flushed; a region restarted. Worldwide admissions stay within the limit in every window (the
// bounds of docs/design.md with S = F and R = N), and most of the limit is used while demand
// exceeds it.
func TestLedgerWorldwideBound(t *testing.T) {
	const lim = 600
	period := time.Minute
	opts := redis.LedgerOptions{Limit: lim, Regions: 3, Floor: 20, Lease: 10 * time.Second, Hold: period}
	srv, clock, l := virtualLedger(t, "world", opts)
	type region struct {
		name             string
		last             redis.Grant
		window, count    int64 // the window's index and its count
		demand           int64 // requests this interval
		admitted, refuse int64
	}
	regions := []*region{{name: "ap"}, {name: "eu"}, {name: "us"}}
	r := rand.New(rand.NewPCG(5, 6))
	start := clock.Now()
	worldwide := map[int64]int64{}
	var used, offered int64
	step, refreshEvery := 100*time.Millisecond, 2*time.Second
	for tick := 0; clock.Now().Before(start.Add(8 * time.Minute)); tick++ {
		now := clock.Now()
		elapsed := now.Sub(start)
		share := []int64{10, 70, 20} // ap, eu, us: 70/20/10 (eu, us, ap)
		if elapsed >= 3*time.Minute {
			share = []int64{70, 10, 20}
		}
		w := now.UnixMicro() / period.Microseconds()
		if elapsed == 7*time.Minute+time.Second {
			regions[2].last = redis.Grant{} // us restarts: it forgets its grant, keeps its counts (its own Redis)
		}
		for i, rg := range regions {
			if rg.window != w {
				rg.window, rg.count = w, 0
			}
			// 1.5 times the limit a minute, split by share, in random requests.
			rate := 1.5 * lim * float64(share[i]) / 100 * float64(step) / float64(period)
			n := int64(rate)
			if r.Float64() < rate-float64(n) {
				n++
			}
			rg.demand += n
			allotment, _ := l.Enforce(rg.last, now)
			for range n {
				if rg.count < allotment {
					rg.count++
					rg.admitted++
					worldwide[w]++
					if elapsed < 3*time.Minute || elapsed >= 4*time.Minute {
						used++
					}
				} else {
					rg.refuse++
				}
			}
			if elapsed < 3*time.Minute || elapsed >= 4*time.Minute {
				offered += n
			}
		}
		if tick%int(refreshEvery/step) == 0 {
			if elapsed >= 6*time.Minute && elapsed < 6*time.Minute+step {
				mustDo(t, srv, "FLUSHALL")
			}
			for _, rg := range regions {
				if rg.name == "ap" && elapsed >= 4*time.Minute && elapsed < 4*time.Minute+3*opts.Lease {
					continue // cut off from the ledger
				}
				rep := redis.Report{Want: redis.Demand(rg.demand, 0, refreshEvery, period), Admitted: rg.admitted, Refused: rg.refuse,
					Used: rg.count, UsedUntil: time.UnixMicro((rg.window + 1) * period.Microseconds())}
				if _, safe := l.Enforce(rg.last, now); !rg.last.LocalExpires.IsZero() && !safe {
					rep.Holds, rep.HoldsExpires = rg.last.Allotment, rg.last.Expires
				}
				g := refresh(t, l, rg.name, rep)
				if g.Confirm {
					rep.Holds, rep.HoldsExpires = g.Allotment, g.Expires
					g = refresh(t, l, rg.name, rep)
				}
				rg.last, rg.demand, rg.admitted, rg.refuse = g, 0, 0, 0
			}
			checkSum(t, l)
		}
		clock.Advance(step)
	}
	full := 0
	for w, n := range worldwide {
		if n > lim {
			t.Errorf("window %d: %d admitted worldwide; the limit is %d", w, n, lim)
		}
		if n >= lim*95/100 {
			full++
		}
	}
	if full < 4 {
		t.Errorf("%d windows used 95%% of the limit; want at least 4 of the 9 (demand is 1.5 times it)", full)
	}
	// (Outside the minute after the move and the learning mode's, demand ≥ 1.5 × the limit.)
	if used*100 < offered*55 {
		t.Errorf("admitted %d of %d offered", used, offered)
	}
	t.Logf("windows: %v; admitted %d of %d offered", worldwide, used, offered)
}
