package rlqs_test

import (
	"context"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
	"github.com/sluicehq/sluice/store/redis"
)

// redisService is a sluice instance's quota service on the Redis at addr, on clock (the ledger
// takes its time from it, not Redis's), its ledgers in groups by rule as sluice serve's.
func redisService(t *testing.T, addr string, clk *sluice.ManualClock, q *config.Quota) *rlqs.Service {
	t.Helper()
	st, err := redis.New(redis.Options{Addrs: []string{addr}, Clock: clk, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return rlqs.New(q, rlqs.Options{Now: clk.Now, Ledgers: func(name string, o ledger.Options) (ledger.Ledger, error) {
		rule, _ := rlqs.SplitName(name)
		return st.GroupLedger(rule, name, o)
	}})
}

// Two sluice instances on one Redis serve one fleet of Envoys as one: an Envoy on each, the
// bucket's limit split between them as if one instance served both; a bucket seen for the first
// time is answered at once (its rule's group is known); after a FLUSHALL every bucket learns for
// a lease and the margin before any quota is handed out; no value an Envoy reports is in a key.
func TestTwoInstancesOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	clk := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	user := config.QuotaBucket{Name: "per-user", Match: map[string]string{"user": "*"}, Limit: 60, Burst: 60, Period: time.Minute}
	q := quota(api, user)
	svcA, svcB := redisService(t, srv.Addr, clk, q), redisService(t, srv.Addr, clk, q)
	warm := svcA.Open("warm")
	report(t, warm, usage(apiID, 0, 0, 0), usage(map[string]string{"user": "warm"}, 0, 0, 0))
	warm.Close()
	clk.Advance(ttl + interval)

	a, b := svcA.Open("a"), svcB.Open("b")
	report(t, a, usage(apiID, 1, 0, 0))
	clk.Advance(interval)
	ra := report(t, a, usage(apiID, 600, 200, interval))
	rb := report(t, b, usage(apiID, 500, 0, interval))
	if rate(ra[0]) != 800 || rate(rb[0]) != 200 {
		t.Fatalf("a on A %d, b on B %d; want 800 and the 200 left", rate(ra[0]), rate(rb[0]))
	}
	clk.Advance(interval)
	ra = report(t, a, usage(apiID, 800, 100, interval))
	rb = report(t, b, usage(apiID, 200, 300, interval))
	if rate(ra[0]) != 500 || rate(ra[0])+rate(rb[0]) > 1000 {
		t.Fatalf("a %d, b %d; want a's fair share 500, and at most the limit in all", rate(ra[0]), rate(rb[0]))
	}
	clk.Advance(interval)
	_ = a.Tick(context.Background())
	if tb := b.Tick(context.Background()); len(tb) != 1 || rate(tb[0]) != 500 {
		t.Fatalf("b's tick on B after a confirmed on A: %v; want 500", tb)
	}

	// A new user's bucket, first seen now: answered at once, not after a learning mode.
	if acts := report(t, b, usage(map[string]string{"user": "carol-api-key-123"}, 1, 0, 0)); len(acts) != 1 || rate(acts[0]) < 1 {
		t.Fatalf("a new bucket of a known rule: %v; want an assignment at once", acts)
	}
	keys, err := srv.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(keys, "carol") || !strings.Contains(keys, "{rate-limit:ledgers:per-user}:per-user.") {
		t.Fatalf("keys %q: want the rule's group tag and hashed buckets, no value", keys)
	}

	// The ledger's Redis flushed: nothing new is handed out for a lease and the margin.
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(interval)
	if acts := report(t, a, usage(apiID, 500, 400, interval)); len(acts) != 1 || rate(acts[0]) > 500 {
		// a reports holding 500 (its lease): the learning ledger grants at most what it holds.
		t.Fatalf("a after the flush: %v; want at most what it holds, 500", acts)
	}
	if acts := report(t, b, usage(map[string]string{"user": "dave"}, 1, 0, 0)); len(acts) != 0 {
		t.Fatalf("a new bucket after the flush: %v; want nothing while the rule's group learns", acts)
	}
}

// The ledgers' Redis killed: a report gets no assignment (the Envoy keeps what it holds until its
// time to live, then its expired fallback), after one failed call, not one per bucket; back, the
// ledgers (lost with the process) learn for a lease and the margin, then answer again.
func TestLedgerDown(t *testing.T) {
	srv := redistest.Start(t)
	clk := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
	user := config.QuotaBucket{Name: "per-user", Match: map[string]string{"user": "*"}, Limit: 60, Burst: 60, Period: time.Minute}
	svc := redisService(t, srv.Addr, clk, quota(user))
	e := svc.Open("e")
	ids := []map[string]string{{"user": "a"}, {"user": "b"}, {"user": "c"}}
	us := func(n uint64) []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
		var out []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		for _, id := range ids {
			out = append(out, usage(id, n, 0, interval))
		}
		return out
	}
	report(t, e, us(1)...)
	clk.Advance(ttl + interval)
	if acts := report(t, e, us(1)...); len(acts) != 3 {
		t.Fatalf("before: %v; want three assignments", acts)
	}
	srv.Kill()
	clk.Advance(interval)
	if acts := report(t, e, us(1)...); len(acts) != 0 {
		t.Fatalf("Redis down: %v; want nothing sent", acts)
	}
	if n := svc.Stats().LedgerErrors; n != 1 {
		t.Fatalf("%d ledger errors; want 1: the first failure skips the report's other buckets", n)
	}
	srv.Restart()
	clk.Advance(interval)
	var acts []*rlqspb.RateLimitQuotaResponse_BucketAction
	for end := time.Now().Add(20 * time.Second); len(acts) < 3 && time.Now().Before(end); {
		acts = report(t, e, us(1)...) // (the store's connection comes back with a report or two)
	}
	if len(acts) != 3 || rate(acts[0]) > 60 {
		// They hold their leases' allotments (reported as held): learning grants at most those.
		t.Fatalf("Redis back, empty: %v; want what each holds, at most", acts)
	}
	if acts := report(t, e, usage(map[string]string{"user": "new"}, 1, 0, 0)); len(acts) != 0 {
		t.Fatalf("a new bucket while the rule's group learns: %v; want nothing", acts)
	}
	clk.Advance(ttl + interval)
	acts = nil
	for end := time.Now().Add(20 * time.Second); len(acts) == 0 && time.Now().Before(end); {
		acts = report(t, e, usage(map[string]string{"user": "new"}, 1, 0, interval)) // (as above: a report may meet the connection coming back)
	}
	if len(acts) != 1 || rate(acts[0]) < 1 {
		t.Fatalf("after learning: %v (ledger errors %d); want an assignment", acts, svc.Stats().LedgerErrors)
	}
}
