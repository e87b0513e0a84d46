package rlqs_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/rlqs"
)

// clock is a virtual clock the service and its memory ledgers share.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const (
	interval = time.Second
	ttl      = 3 * time.Second
)

func quota(buckets ...config.QuotaBucket) *config.Quota {
	return &config.Quota{ReportInterval: interval, TTL: ttl, Idle: time.Minute, Algorithm: "fair", Buckets: buckets}
}

var api = config.QuotaBucket{Name: "api", Match: map[string]string{"name": "api"}, Limit: 1000, Burst: 100, Period: time.Second}

// memService is a service on memory ledgers on c, and the ledgers it made by name.
func memService(t *testing.T, c *clock, q *config.Quota) (*rlqs.Service, map[string]*ledger.Memory) {
	t.Helper()
	books := map[string]*ledger.Memory{}
	var mu sync.Mutex
	group := &ledger.MemoryGroup{} // as sluice serve's: the process
	svc := rlqs.New(q, rlqs.Options{Now: c.Now, Ledgers: func(name string, o ledger.Options) (ledger.Ledger, error) {
		mu.Lock()
		defer mu.Unlock()
		if l := books[name]; l != nil && l.Options() == o {
			return l, nil
		}
		l, err := ledger.NewMemory(name, o, ledger.MemoryOptions{Now: c.Now, Group: group})
		books[name] = l
		return l, err
	}})
	return svc, books
}

// started begins the service's group of ledgers (as its first report does) and waits out its
// learning mode (the lease and the margin): a bucket's ledger begun later is as old as the group.
func started(t *testing.T, svc *rlqs.Service, c *clock, id map[string]string) {
	t.Helper()
	e := svc.Open("warm-up")
	defer e.Close()
	report(t, e, usage(id, 0, 0, 0))
	c.add(ttl + interval)
}

// usage is one bucket's line of a report.
func usage(id map[string]string, allowed, denied uint64, elapsed time.Duration) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: id},
		NumRequestsAllowed: allowed, NumRequestsDenied: denied, TimeElapsed: durationpb.New(elapsed)}
}

func report(t *testing.T, c *rlqs.Client, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) []*rlqspb.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	acts, err := c.Report(context.Background(), &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: us})
	if err != nil {
		t.Fatal(err)
	}
	return acts
}

// rate is an assignment's tokens per fill (-1: not a token bucket; -2: abandoned).
func rate(a *rlqspb.RateLimitQuotaResponse_BucketAction) int64 {
	if a.GetAbandonAction() != nil {
		return -2
	}
	tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil {
		return -1
	}
	return int64(tb.GetTokensPerFill().GetValue())
}

var apiID = map[string]string{"name": "api"}

// Two Envoys on one bucket: each report's demand is split by fair share, the token buckets'
// rates add up to at most the limit, the burst is split likewise, and the time to live is the
// lease left.
func TestSplitByDemand(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	svc, _ := memService(t, c, quota(api))
	started(t, svc, c, apiID)
	a, b := svc.Open("a"), svc.Open("b")
	// First reports (as Envoy sends a new bucket's first request: elapsed 0): a demand measured
	// over one report interval.
	ra := report(t, a, usage(apiID, 1, 0, 0))
	if len(ra) != 1 || rate(ra[0]) != 1 {
		t.Fatalf("a's first assignment: %v; want a token bucket of 1/s (1 request in an interval of 1s)", ra)
	}
	c.add(interval)
	ra = report(t, a, usage(apiID, 600, 200, interval)) // wants 800/s
	rb := report(t, b, usage(apiID, 500, 0, interval))  // wants 500/s
	// a held 1 until this refresh: b's share is 500 but only 1000 - 800 = 200 is free until a
	// is granted its fair share of 500 and confirms the shrink; here a got 800 (free then).
	if rate(ra[0]) != 800 || rate(rb[0]) != 200 {
		t.Fatalf("a %d, b %d; want 800 (all a wanted was free) and 200 (what a left)", rate(ra[0]), rate(rb[0]))
	}
	c.add(interval)
	ra = report(t, a, usage(apiID, 800, 100, interval))
	rb = report(t, b, usage(apiID, 200, 300, interval))
	if rate(ra[0]) != 500 {
		t.Fatalf("a %d; want its fair share 500", rate(ra[0]))
	}
	if rate(rb[0]) > 500 || rate(ra[0])+rate(rb[0]) > 1000 {
		t.Fatalf("a %d + b %d > the limit", rate(ra[0]), rate(rb[0]))
	}
	// a's shrink is confirmed a margin after it was sent; b's tick then takes the rest.
	c.add(interval)
	_ = a.Tick(context.Background())
	tb := b.Tick(context.Background())
	if len(tb) != 1 || rate(tb[0]) != 500 {
		t.Fatalf("b's tick after a confirmed: %v; want 500", tb)
	}
	q := tb[0].GetQuotaAssignmentAction()
	// b refused requests at its last report: busy, its bucket spends its tokens as they come; the
	// new bucket (which Envoy builds full) holds what the old one had left by the service's count,
	// but at least a quarter of the margin's refill (125 at 500 a second), so here its whole half
	// of the burst, 50 (the sim's TestRebuildChurn has a busy Envoy's buckets rebuilt smaller).
	if got := q.GetRateLimitStrategy().GetTokenBucket(); got.GetMaxTokens() != 50 || got.GetFillInterval().AsDuration() != time.Second {
		t.Fatalf("b's bucket %v; want 50 tokens, fill_interval 1s", got)
	}
	if d := q.GetAssignmentTimeToLive().AsDuration(); d <= 0 || d > ttl {
		t.Fatalf("ttl %v; want the lease left, (0, %v]", d, ttl)
	}
	st := svc.Stats()
	if len(st.Clients) != 2 || len(st.Buckets) != 1 || st.Buckets[0].Assigned != 1000 || st.Buckets[0].Rule != "api" {
		t.Fatalf("stats %+v", st)
	}
}

// A bucket without a rule is abandoned; a blanket rule answers ALLOW_ALL or DENY_ALL with the
// time to live; a wildcard makes one bucket (one ledger) per value, whose values never reach the
// ledger's names or the stats.
func TestRulesAnswers(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	user := config.QuotaBucket{Name: "per-user", Match: map[string]string{"name": "chat", "user": "*"}, Limit: 10, Burst: 10, Period: time.Minute}
	vip := config.QuotaBucket{Name: "vip", Match: map[string]string{"name": "chat", "user": "vip"}, Blanket: "allow"}
	blocked := config.QuotaBucket{Name: "blocked", Match: map[string]string{"name": "blocked"}, Blanket: "deny"}
	svc, books := memService(t, c, quota(user, vip, blocked))
	started(t, svc, c, map[string]string{"name": "chat", "user": "warm-up"})
	e := svc.Open("e")
	acts := report(t, e,
		usage(map[string]string{"name": "nope"}, 1, 0, 0),
		usage(map[string]string{"name": "chat"}, 1, 0, 0), // missing the user key: no rule
		usage(map[string]string{"name": "chat", "user": "vip"}, 1, 0, 0),
		usage(map[string]string{"name": "blocked"}, 1, 0, 0),
		usage(map[string]string{"name": "chat", "user": "alice-secret-key"}, 1, 0, 0),
		usage(map[string]string{"name": "chat", "user": "bob"}, 1, 0, 0))
	if len(acts) != 6 {
		t.Fatalf("%d actions; want one per bucket", len(acts))
	}
	if acts[0].GetAbandonAction() == nil || acts[1].GetAbandonAction() == nil {
		t.Fatalf("buckets without a rule: %v, %v; want abandoned", acts[0], acts[1])
	}
	if acts[2].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL ||
		acts[2].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() != nil {
		t.Fatalf("vip (exact beats the wildcard): %v; want ALLOW_ALL", acts[2])
	}
	if s := acts[3].GetQuotaAssignmentAction(); s.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || s.GetAssignmentTimeToLive().AsDuration() != ttl {
		t.Fatalf("blocked: %v; want DENY_ALL for the ttl", acts[3])
	}
	if rate(acts[4]) < 1 || rate(acts[5]) < 1 {
		t.Fatalf("per-user: %v %v; want token buckets", acts[4], acts[5])
	}
	if len(books) != 3 {
		t.Fatalf("%d ledgers; want one per user value (the warm-up's, alice's, bob's)", len(books))
	}
	for name := range books {
		if strings.Contains(name, "alice") || !strings.HasPrefix(name, "per-user.") {
			t.Fatalf("ledger name %q: want per-user.<hash>, no value", name)
		}
	}
	for _, b := range svc.Stats().Buckets {
		if strings.Contains(b.ID["user"], "alice") {
			t.Fatalf("stats show a wildcard's value: %v", b.ID)
		}
		if b.Rule == "vip" && b.ID["user"] != "vip" {
			t.Fatalf("an exact value is hidden: %v", b.ID)
		}
	}
}

// A bucket reported without requests for the idle time is abandoned; so is one whose rule a
// reload removed (at the next tick), while one whose rule changed gets the new answer at once.
func TestIdleAndReload(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	q := quota(api, config.QuotaBucket{Name: "other", Match: map[string]string{"name": "other"}, Blanket: "allow"})
	q.Idle = 5 * time.Second
	svc, _ := memService(t, c, q)
	started(t, svc, c, apiID)
	e := svc.Open("e")
	other := map[string]string{"name": "other"}
	report(t, e, usage(apiID, 10, 0, interval), usage(other, 1, 0, 0))
	for range 4 {
		c.add(interval)
		if acts := report(t, e, usage(apiID, 0, 0, interval), usage(other, 1, 0, interval)); acts[0].GetAbandonAction() != nil {
			t.Fatalf("abandoned after %v idle; want after 5s", c.Now())
		}
	}
	c.add(interval)
	if acts := report(t, e, usage(apiID, 0, 0, interval), usage(other, 1, 0, interval)); acts[0].GetAbandonAction() == nil {
		t.Fatalf("not abandoned after 5s without a request: %v", acts[0])
	}
	// The reload: "other" becomes a deny, api is reported again (a new bucket), then its rule goes.
	report(t, e, usage(apiID, 1, 0, 0))
	q2 := quota(api, config.QuotaBucket{Name: "other", Match: map[string]string{"name": "other"}, Blanket: "deny"})
	svc.Swap(q2)
	acts := report(t, e, usage(other, 1, 0, interval))
	if acts[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("after the reload: %v; want DENY_ALL", acts[0])
	}
	svc.Swap(quota(config.QuotaBucket{Name: "other", Match: map[string]string{"name": "other"}, Blanket: "deny"}))
	c.add(interval / 2)
	tick := e.Tick(context.Background())
	if len(tick) != 1 || tick[0].GetAbandonAction() == nil || tick[0].GetBucketId().GetBucket()["name"] != "api" {
		t.Fatalf("the tick after api's rule went: %v; want api abandoned", tick)
	}
}

// After a ledger state begins anew (sluice on the memory store restarted, the ledger's Redis
// flushed), the ledger learns for a lease and the margin: an Envoy it knows nothing of gets no
// assignment (it keeps what it has until it expires, then its expired_assignment_behavior),
// then quota as usual.
func TestLearningPushesNothing(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	svc, _ := memService(t, c, quota(api))
	e := svc.Open("e")
	if acts := report(t, e, usage(apiID, 500, 0, interval)); len(acts) != 0 {
		t.Fatalf("while learning: %v; want nothing", acts)
	}
	for c.Now().Add(interval / 2).Before(time.Unix(1_800_000_000, 0).Add(ttl + interval)) {
		c.add(interval / 2)
		if acts := e.Tick(context.Background()); len(acts) != 0 {
			t.Fatalf("a tick while learning: %v; want nothing", acts)
		}
	}
	c.add(interval / 2)
	if acts := e.Tick(context.Background()); len(acts) != 1 || rate(acts[0]) != 500 {
		t.Fatalf("after learning: %v; want 500", acts)
	}
}

// An Envoy that goes away gives its share back once its assignment's time to live and the
// margin have passed, not before.
func TestGoneEnvoyGivesBack(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	svc, books := memService(t, c, quota(api))
	started(t, svc, c, apiID)
	a, b := svc.Open("a"), svc.Open("b")
	report(t, a, usage(apiID, 900, 0, interval))
	if got := rate(report(t, b, usage(apiID, 900, 0, interval))[0]); got != 100 {
		t.Fatalf("b %d; want the 100 a left", got)
	}
	a.Close()
	for range 3 { // the lease a holds (3s)
		c.add(interval)
		if got := rate(report(t, b, usage(apiID, 100, 800, interval))[0]); got > 100 {
			t.Fatalf("b %d at %v, while a's assignment may still run; want at most 100", got, c.Now())
		}
	}
	c.add(interval + interval/2) // the lease and the margin (1s) have passed
	if got := rate(report(t, b, usage(apiID, 150, 1200, interval+interval/2))[0]); got != 900 {
		v, _ := books[svc.Stats().Buckets[0].Ledger].Read(context.Background())
		t.Fatalf("b %d after a's lease; want its 900; %+v", got, v)
	}
}

// Hostile and broken reports: a domain not the service's ends the stream; an oversized bucket
// id is abandoned; a stream's buckets are bounded (beyond, abandoned and counted); nothing of
// it reaches a ledger.
func TestBadReports(t *testing.T) {
	c := &clock{t: time.Unix(1_800_000_000, 0)}
	q := quota(config.QuotaBucket{Name: "u", Match: map[string]string{"u": "*"}, Limit: 10, Burst: 10, Period: time.Second})
	q.Domain = "edge"
	svc, books := memService(t, c, q)
	e := svc.Open("e")
	if _, err := e.Report(context.Background(), &rlqspb.RateLimitQuotaUsageReports{Domain: "other"}); err == nil || !strings.Contains(err.Error(), `domain "other"`) {
		t.Fatalf("another domain: %v; want an error naming it", err)
	}
	acts := report(t, e, usage(map[string]string{"u": strings.Repeat("x", 300)}, 1, 0, 0), usage(map[string]string{}, 1, 0, 0))
	if len(acts) != 2 || acts[0].GetAbandonAction() == nil || acts[1].GetAbandonAction() == nil || len(books) != 0 {
		t.Fatalf("oversized and empty ids: %v, %d ledgers; want abandoned, none", acts, len(books))
	}
	var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	for i := range rlqs.MaxStreamBuckets + 5 {
		us = append(us, usage(map[string]string{"u": strings.Repeat("v", 1+i%7) + string(rune('a'+i%26)) + time.Duration(i).String()}, 1, 0, 0))
	}
	acts = report(t, e, us...)
	abandoned := 0
	for _, a := range acts {
		if a.GetAbandonAction() != nil {
			abandoned++
		}
	}
	if abandoned != 5 || svc.Stats().RefusedBuckets != 7 {
		t.Fatalf("%d abandoned, %d refused; want the 5 beyond %d (and the 2 bad ids)", abandoned, svc.Stats().RefusedBuckets, rlqs.MaxStreamBuckets)
	}
	if st := svc.Stats(); len(st.Buckets) != rlqs.StatsBuckets || st.BucketsOmitted != rlqs.MaxStreamBuckets-rlqs.StatsBuckets {
		t.Fatalf("stats list %d buckets, %d omitted; want %d and the rest", len(st.Buckets), st.BucketsOmitted, rlqs.StatsBuckets)
	}
}

func TestMatch(t *testing.T) {
	rs := rlqs.Compile(quota(
		config.QuotaBucket{Name: "any", Match: map[string]string{"a": "*", "b": "*"}, Blanket: "allow"},
		config.QuotaBucket{Name: "a1", Match: map[string]string{"a": "1", "b": "*"}, Blanket: "allow"},
		config.QuotaBucket{Name: "b1", Match: map[string]string{"a": "*", "b": "1"}, Blanket: "allow"},
		config.QuotaBucket{Name: "one", Match: map[string]string{"a": "1"}, Blanket: "deny"},
	))
	for _, c := range []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"a": "2", "b": "2"}, "any"},
		{map[string]string{"a": "1", "b": "2"}, "a1"},
		{map[string]string{"a": "2", "b": "1"}, "b1"},
		{map[string]string{"a": "1", "b": "1"}, "a1"}, // as specific as b1: the first
		{map[string]string{"a": "1"}, "one"},
		{map[string]string{"a": "2"}, ""},
		{map[string]string{"a": "1", "c": "1"}, ""},
	} {
		got := ""
		if r := rs.Match(c.id); r != nil {
			got = r.Name
		}
		if got != c.want {
			t.Errorf("%v: %q; want %q", c.id, got, c.want)
		}
	}
}
