package redis_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// The guard's one health rule against a real Redis that is killed: only a round trip to the store
// tells of its health. Answers that made none — a refusal from the negative cache, a unit spent
// from a local budget, a cost over the limit refused by the store's check before any call — may
// come between the calls that find the store dead, and the breaker still opens after its
// threshold of consecutive failures: the calls that reach the dead store (each of which may wait
// its timeout) are exactly the threshold. The breaker's cooldown is an hour, so no probe runs.

const healthThreshold = 3

// healthPolicy refuses a fourth request for 20 minutes wherever in time the test runs (a token
// bucket: no window ends meanwhile), so a refusal stays cached through the test.
var healthPolicy = sluice.Policy{Name: "health", Algorithm: sluice.TokenBucket, Limit: 3, Period: time.Hour}

// The stores' timeout is long: a killed Redis refuses the connection at once, and a busy machine
// must not fail the calls made before the kill.

// guarded is st (or a store on it) guarded as a gateway guards it: fail-closed, the default
// threshold, an hour's cooldown.
func guarded(t *testing.T, st sluice.Store) sluice.Store {
	t.Helper()
	g, err := sluice.Guard(st, sluice.WithBreaker(healthThreshold, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// decideAll is one request of key at cost through the path every front end uses.
func decideAll(g sluice.Store, key string, cost int64) (sluice.Decision, error) {
	out := make([]sluice.Decision, 1)
	_, err := g.DecideAll(bg, key, []sluice.Limit{{Policy: healthPolicy, Cost: cost}}, out)
	return out[0], err
}

// interleave breaks srv (kill: srv.Kill, or a hang), then makes 40 rounds of neutral (an answer that made no round trip)
// followed by another client's request, which finds the store dead; it checks that the calls that
// reached Redis (scripts sent: Stats.Calls) are the breaker's threshold and that the breaker is
// open.
func interleave(t *testing.T, srv *redistest.Server, st *redis.Store, g sluice.Store, kill func(), neutral func(i int) error) {
	t.Helper()
	kill()
	before := st.Stats().Calls
	for i := range 40 {
		open := !g.(sluice.Available).Available() // (then the breaker answers, fail-closed)
		if err := neutral(i); err != nil && !(open && errors.Is(err, sluice.ErrStoreUnavailable)) {
			t.Fatalf("round %d: the answer without a round trip: %v", i, err)
		}
		if _, err := decideAll(g, fmt.Sprintf("other-%d", i), 1); !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("round %d: another client's request with Redis killed: %v; want ErrStoreUnavailable", i, err)
		}
	}
	if calls := st.Stats().Calls - before; calls > healthThreshold {
		t.Errorf("%d calls reached the killed Redis (each may wait the store's timeout); want at most the breaker's threshold, %d", calls, healthThreshold)
	}
	if g.(sluice.Available).Available() {
		t.Errorf("the breaker is closed after 40 failures, each after an answer that made no round trip")
	}
}

// TestHealthCachedRefusals: refusals from the negative cache, through DecideAll (one limit: the
// Redis store answers it from its cache), do not hold the breaker closed. Redis hangs rather than
// dies: a dead Redis ends the store's subscription to refunds, which turns the cache off (it
// answers only while it would hear of a refund), so only a hung one keeps the cache answering.
func TestHealthCachedRefusals(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{Timeout: time.Second}) // (3 calls wait it out)
	g := guarded(t, st)
	for i := range 4 {
		if d, err := decideAll(g, "abuser", 1); err != nil || d.Allowed != (i < 3) {
			t.Fatalf("abuser's request %d: %+v %v", i, d, err)
		}
	}
	hang := func() {
		mustDo(t, srv, "CLIENT", "PAUSE", "600000", "ALL")
		t.Cleanup(func() { _, _ = srv.Do("CLIENT", "UNPAUSE") })
	}
	interleave(t, srv, st, g, hang, func(i int) error {
		d, err := decideAll(g, "abuser", 1)
		if err == nil && (d.Allowed || d.Source != sluice.FromCache) {
			err = fmt.Errorf("%+v; want a refusal from the negative cache", d)
		}
		return err
	})
}

// TestHealthLocalBudget: units spent from a local budget (BudgetStore) do not hold the breaker
// closed, and a probe answered from one is handed back.
func TestHealthLocalBudget(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{Timeout: 5 * time.Second})
	p := sluice.Policy{Name: "health-budget", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 24 * time.Hour}
	budgets := func(sluice.Policy) sluice.LocalBudget { return sluice.LocalBudget{Size: 100, MaxAge: time.Hour} }
	b := sluice.Budgeted(st, budgets)
	g := guarded(t, b)
	spend := func(key string) (sluice.Decision, error) {
		out := make([]sluice.Decision, 1)
		_, err := g.DecideAll(bg, key, []sluice.Limit{{Policy: p, Cost: 1}}, out)
		return out[0], err
	}
	if d, err := spend("budgeted"); err != nil || !d.Allowed || d.Source != sluice.FromStore {
		t.Fatalf("the request that takes the budget: %+v %v; want allowed, decided by the store", d, err)
	}
	srv.Kill()
	before := st.Stats().Calls
	for i := range 40 {
		open := !g.(sluice.Available).Available() // (then the breaker answers, fail-closed)
		if d, err := spend("budgeted"); (err != nil || !d.Allowed || d.Source != sluice.FromBudget) && !(open && errors.Is(err, sluice.ErrStoreUnavailable)) {
			t.Fatalf("round %d: %+v %v; want allowed from the local budget", i, d, err)
		}
		if _, err := spend(fmt.Sprintf("other-%d", i)); !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("round %d: another client's request with Redis killed: %v; want ErrStoreUnavailable", i, err)
		}
	}
	if calls := st.Stats().Calls - before; calls > healthThreshold {
		t.Errorf("%d calls reached the killed Redis; want at most the breaker's threshold, %d", calls, healthThreshold)
	}
	if g.(sluice.Available).Available() {
		t.Fatalf("the breaker is closed after 40 failures, each after a unit spent from a budget")
	}

	// The probe: with a short cooldown, the first request after it is the probe; one answered
	// from the budget tells nothing, so the breaker stays open and the next request probes.
	g, err := sluice.Guard(b, sluice.WithBreaker(1, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spend("other-probe"); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("with Redis killed: %v", err)
	}
	if g.(sluice.Available).Available() {
		t.Fatal("the breaker of threshold 1 is closed after a failure")
	}
	// Before the cooldown, the budgeted key meets the open breaker (fail-closed); once it has
	// passed, its request is the probe, served from the budget.
	if !pollUntil(time.Now().Add(10*time.Second), func() bool {
		d, err := spend("budgeted")
		return err == nil && d.Source == sluice.FromBudget
	}) {
		t.Fatal("no request served from the budget as the breaker's probe in 10 s")
	}
	if g.(sluice.Available).Available() {
		t.Errorf("a probe answered from a local budget closed the breaker of a killed Redis")
	}
	before = st.Stats().Calls
	if _, err := spend("other-after-probe"); !errors.Is(err, sluice.ErrStoreUnavailable) {
		t.Fatalf("the next request: %v", err)
	}
	if calls := st.Stats().Calls - before; calls != 1 {
		t.Errorf("the request after the handed-back probe made %d calls to Redis; want 1 (it is the probe)", calls)
	}
}

// TestHealthCostOverLimit: a cost that can never fit, refused by the store's check before any call
// (a client may send one with every request), does not hold the breaker closed.
func TestHealthCostOverLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{Timeout: 5 * time.Second})
	g := guarded(t, st)
	if _, err := decideAll(g, "warm", 1); err != nil {
		t.Fatal(err)
	}
	interleave(t, srv, st, g, srv.Kill, func(i int) error {
		d, err := decideAll(g, "greedy", 1000)
		if errors.Is(err, sluice.ErrCostExceedsLimit) && d.RetryAfter != sluice.Never {
			return fmt.Errorf("%+v %v; want RetryAfter Never", d, err)
		}
		if errors.Is(err, sluice.ErrCostExceedsLimit) {
			return nil
		}
		return err
	})
}

// TestHealthCachedRefusalsRedisHung: while Redis hangs (CLIENT PAUSE: it takes commands and answers
// none, so each call waits the store's timeout), a client hammering a key whose refusal the
// negative cache holds, through Decide (a Limiter's path), does not keep the breaker closed: the
// other clients' calls that wait the timeout are the breaker's threshold, whatever the machine's
// speed (no wall-clock window: the calls are counted, not timed).
func TestHealthCachedRefusalsRedisHung(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{Timeout: 50 * time.Millisecond})
	lim, err := sluice.NewLimiter(st, healthPolicy, sluice.WithBreaker(healthThreshold, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // the abuser spends its quota: its refusal is cached for 20 minutes
		if d, err := lim.Allow(bg, "abuser"); err != nil || d.Allowed != (i < 3) {
			t.Fatalf("abuser's request %d: %+v %v", i, d, err)
		}
	}
	mustDo(t, srv, "CLIENT", "PAUSE", "600000", "ALL")
	t.Cleanup(func() { _, _ = srv.Do("CLIENT", "UNPAUSE") })
	before := st.Stats()
	for i := range 20 {
		if lim.StoreAvailable() {
			if d, err := lim.Allow(bg, "abuser"); err != nil || d.Allowed || !d.Cached() {
				t.Fatalf("round %d: the abuser: %+v %v; want a refusal from the cache", i, d, err)
			}
		}
		if _, err := lim.Allow(bg, fmt.Sprintf("client-%d", i)); !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("round %d: another client with Redis hung: %v; want ErrStoreUnavailable", i, err)
		}
	}
	after := st.Stats()
	if calls := after.Calls - before.Calls; calls > healthThreshold || lim.StoreAvailable() {
		t.Errorf("%d calls waited the hung Redis's timeout, breaker open: %v; want %d and open (cached refusals between: %d)",
			calls, !lim.StoreAvailable(), healthThreshold, after.CacheHits-before.CacheHits)
	}
}

// TestHealthSettleAndLeases: settlements and leases are judged by the same rule as decisions. With
// Redis killed, releases of concurrency slots that fail open the breaker as decisions would (3 of
// them, not one request after another paying the timeout); and a settlement that sends nothing
// (reserved == actual), made as the breaker's probe, does not close it.
func TestHealthSettleAndLeases(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv, redis.Options{Timeout: 5 * time.Second})
	g := guarded(t, st)
	conc := sluice.Policy{Name: "health-slots", Algorithm: sluice.Concurrency, Limit: 2, Period: time.Minute}
	id := sluice.NewLeaseID()
	out := make([]sluice.Decision, 1)
	if ok, err := g.DecideAll(bg, "c", []sluice.Limit{{Policy: conc, Cost: 1, Lease: id}}, out); err != nil || !ok {
		t.Fatalf("taking a slot: %v %v", out[0], err)
	}
	srv.Kill()
	before := st.Stats().Calls
	for i := range 10 {
		err := g.(sluice.Leaser).Release(bg, "c", conc, id)
		if !errors.Is(err, sluice.ErrStoreUnavailable) {
			t.Fatalf("release %d with Redis killed: %v; want ErrStoreUnavailable", i, err)
		}
	}
	if calls := st.Stats().Calls - before; calls > healthThreshold || g.(sluice.Available).Available() {
		t.Errorf("10 releases with Redis killed: %d reached it, breaker open %v; want %d and open", calls, !g.(sluice.Available).Available(), healthThreshold)
	}

	// A probe that sends nothing: a settlement of reserved == actual.
	g, err := sluice.Guard(st, sluice.WithBreaker(1, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Decide(bg, "k", healthPolicy, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || g.(sluice.Available).Available() {
		t.Fatalf("with Redis killed: %v; want ErrStoreUnavailable and the breaker open", err)
	}
	if !pollUntil(time.Now().Add(10*time.Second), func() bool { // once the cooldown has passed, it is the probe
		return g.(sluice.Settler).Settle(bg, "k", healthPolicy, sluice.SettleNow, 5, 5) == nil
	}) {
		t.Fatal("no settlement admitted as the probe in 10 s")
	}
	if g.(sluice.Available).Available() {
		t.Errorf("a settlement that sent nothing, as the probe, closed the breaker of a killed Redis")
	}
}
