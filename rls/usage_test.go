package rls_test

import (
	"fmt"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// usageConf has a counter per algorithm the service offers for usage. The windows are years, and
// the bucket refills a token in 2.4 hours, so that on Redis's clock no window ends during a test
// (unless it runs across the instant a year starts) and no whole token is refilled.
const usageConf = `
domain: usage
descriptors:
  - key: fixed
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: sliding
    algorithm: sliding-window
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: log
    algorithm: sliding-log
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: bucket
    algorithm: token-bucket
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: plain
    rate_limit: {unit: year, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 10}
`

// usageStores are the stores the usage tests run on: memory (on a manual clock), one Redis, and
// a Redis Cluster of three masters (a request's counters in several hash slots).
func usageStores(t *testing.T) map[string]sluice.Store {
	rs := redistest.Start(t)
	// A loaded machine may take longer than the default bound of a call: these tests are not about it.
	single, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(single.Close)
	cluster, err := redisstore.New(redisstore.Options{Addrs: redistest.StartCluster(t, 3).Addrs(), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return map[string]sluice.Store{
		"memory":  memory.New(memory.WithClock(sluice.NewManualClock(time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC)))),
		"redis":   single,
		"cluster": cluster,
	}
}

func usageService(t *testing.T, st sluice.Store) *rls.Service {
	t.Helper()
	conf, err := envoyconf.Parse([]byte(usageConf), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := decision.Decider{Store: st}
	return rls.New(conf, d.Decide)
}

// use is d with its own hits_addend n: usage, as Envoy sends a cost (0: a check).
func use(d *commonpb.RateLimitDescriptor, n uint64) *commonpb.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// answered is a descriptor's code and remaining, as the tests compare them.
type answered struct {
	code      string
	remaining uint32
}

func statuses(s *rls.Service, t *testing.T, hits uint32, ds ...*commonpb.RateLimitDescriptor) []answered {
	t.Helper()
	var out []answered
	for _, st := range ask(t, s, "usage", hits, ds...).Statuses {
		out = append(out, answered{st.Code.String(), st.LimitRemaining})
	}
	return out
}

func want(kv ...any) []answered {
	var out []answered
	for i := 0; i < len(kv); i += 2 {
		out = append(out, answered{kv[i].(string), uint32(kv[i+1].(int))})
	}
	return out
}

// Envoy's check/charge pattern, on every algorithm and store: a check (hits_addend 0) before
// the request, the usage charged (hits_addend N) at its end. A charge that passes the limit is
// counted all the same, and answered OVER_LIMIT, so the next check is refused; a check consumes
// nothing, and one at the limit exactly is OK.
func TestUsageCheckThenCharge(t *testing.T) {
	for name, st := range usageStores(t) {
		s := usageService(t, st)
		for _, key := range []string{"fixed", "sliding", "log", "bucket"} {
			t.Run(name+"/"+key, func(t *testing.T) {
				steps := []struct {
					note string
					hits uint64
					want []answered
				}{
					{"check", 0, want("OK", 10)},
					{"charge 6", 6, want("OK", 4)},
					{"check", 0, want("OK", 4)},
					{"charge 6 passes the limit", 6, want("OVER_LIMIT", 0)},
					{"check after 12 of 10", 0, want("OVER_LIMIT", 0)},
				}
				for _, step := range steps {
					got := statuses(s, t, 0, use(desc(key, "a"), step.hits))
					if fmt.Sprint(got) != fmt.Sprint(step.want) {
						t.Fatalf("%s: %v, want %v", step.note, got, step.want)
					}
				}
				// A plain request is refused too: the usage was counted.
				if got := statuses(s, t, 0, desc(key, "a")); got[0].code != "OVER_LIMIT" {
					t.Fatalf("a plain request after 12 of 10: %v", got)
				}
				// At the limit exactly, a check is OK with nothing left (as the reference compares).
				for _, step := range []struct {
					hits uint64
					want []answered
				}{{10, want("OK", 0)}, {0, want("OK", 0)}, {1, want("OVER_LIMIT", 0)}, {0, want("OVER_LIMIT", 0)}} {
					if got := statuses(s, t, 0, use(desc(key, "b"), step.hits)); fmt.Sprint(got) != fmt.Sprint(step.want) {
						t.Fatalf("%d on a counter of 10: %v, want %v", step.hits, got, step.want)
					}
				}
			})
		}
	}
}

// A charge past the limit is counted exactly once, and in full: a token bucket of 10 a day
// charged 12 is 2 tokens in debt, so a check passes again only once 2 tokens' time (2 × 2.4 h)
// has passed, with nothing left, and one token later with 1 left.
func TestUsageChargedExactly(t *testing.T) {
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC))
	s := usageService(t, memory.New(memory.WithClock(clock)))
	token := 24 * time.Hour / 10
	for _, step := range []struct {
		wait time.Duration
		hits uint64
		want []answered
	}{
		{0, 6, want("OK", 4)},
		{0, 6, want("OVER_LIMIT", 0)},
		{2*token - time.Second, 0, want("OVER_LIMIT", 0)},
		{time.Second, 0, want("OK", 0)},
		{token, 0, want("OK", 1)},
	} {
		clock.Advance(step.wait)
		if got := statuses(s, t, 0, use(desc("bucket", "x"), step.hits)); fmt.Sprint(got) != fmt.Sprint(step.want) {
			t.Fatalf("after %v more, hits %d: %v, want %v", step.wait, step.hits, got, step.want)
		}
	}
}

// A request with usage and plain descriptors: the usage is counted whatever the answer; the plain
// ones stay all or nothing, consuming nothing when any descriptor of the request is over, a
// check or a charge included.
func TestUsageBesidePlainDescriptors(t *testing.T) {
	for name, st := range usageStores(t) {
		t.Run(name, func(t *testing.T) {
			s := usageService(t, st)
			d := func(ds ...*commonpb.RateLimitDescriptor) []*commonpb.RateLimitDescriptor { return ds }
			steps := []struct {
				note string
				hits uint32 // the request's: the plain descriptors'
				ds   []*commonpb.RateLimitDescriptor
				want []answered
			}{
				{"plain, and a charge of 11 that never fits (the plain one is only peeked at)", 0,
					d(desc("plain", "m"), use(desc("fixed", "m"), 11)), want("OK", 3, "OVER_LIMIT", 0)},
				{"the charge was counted, the plain hit was not", 0,
					d(desc("plain", "m"), use(desc("fixed", "m"), 0)), want("OK", 2, "OVER_LIMIT", 0)},
				{"a plain hit alone", 0, d(desc("plain", "m")), want("OK", 2)},
				{"a plain hit and a charge of 4", 0, d(desc("plain", "m"), use(desc("sliding", "m"), 4)), want("OK", 1, "OK", 6)},
				{"2 plain hits of 1 left refuse the request; the charge of 5 is counted", 2,
					d(desc("plain", "m"), use(desc("sliding", "m"), 5)), want("OVER_LIMIT", 0, "OK", 1)},
				{"a check: 9 of 10", 0, d(use(desc("sliding", "m"), 0)), want("OK", 1)},
				{"a shadow_mode charge past its limit is counted, and OK", 0, d(use(desc("shadow", "m"), 12)), want("OK", 0)},
				{"its check is over, but OK; the plain hit passes", 0,
					d(use(desc("shadow", "m"), 0), desc("plain", "m")), want("OK", 0, "OK", 0)},
			}
			for _, step := range steps {
				if got := statuses(s, t, step.hits, step.ds...); fmt.Sprint(got) != fmt.Sprint(step.want) {
					t.Fatalf("%s: %v, want %v", step.note, got, step.want)
				}
			}
		})
	}
}

// When Redis is down, usage follows the store's failure mode: with a local fallback the charges
// count on this instance's share (the next check refused as on the store); failing open, nothing
// is counted (no settlement is tried on the store) and everything is OK; failing closed, a check or a charge is an error (Unavailable),
// never an answer that would pass for one.
func TestUsageWhenTheStoreFails(t *testing.T) {
	rs := redistest.Start(t)
	for _, c := range []struct {
		mode sluice.FailureMode
		want []string
	}{
		{sluice.FailLocal, []string{"OK 10", "OK 4", "OVER_LIMIT 0", "OVER_LIMIT 0"}},
		{sluice.FailOpen, []string{"OK 10", "OK 4", "OK 4", "OK 10"}}, // (each as if alone on an empty counter)
		{sluice.FailClosed, []string{"Unavailable", "Unavailable", "Unavailable", "Unavailable"}},
	} {
		t.Run(fmt.Sprint(c.mode), func(t *testing.T) {
			st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			rs.Kill()
			opt := sluice.WithFailureMode(c.mode)
			if c.mode == sluice.FailLocal {
				opt = sluice.WithLocalFallback(memory.New(), 1) // (FailLocal, on this store)
			}
			g, err := sluice.Guard(st, opt)
			if err != nil {
				t.Fatal(err)
			}
			s := usageService(t, g)
			var got []string
			for _, n := range []uint64{0, 6, 6, 0} {
				resp, err := s.ShouldRateLimit(t.Context(), &rlspb.RateLimitRequest{Domain: "usage",
					Descriptors: []*commonpb.RateLimitDescriptor{use(desc("fixed", "f"), n)}})
				if err != nil {
					got = append(got, grpcstatus.Code(err).String())
					continue
				}
				got = append(got, fmt.Sprint(resp.Statuses[0].Code, " ", resp.Statuses[0].LimitRemaining))
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("check, charge 6, charge 6, check: %v, want %v", got, c.want)
			}
		})
	}
}
