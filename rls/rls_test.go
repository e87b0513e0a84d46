package rls_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/decision"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/rls/envoyconf"
	"github.com/sluicehq/sluice/store/memory"
)

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

// service is a Service on a fresh memory store, on a manual clock stopped in the middle of a
// minute (so that no window ends during a test), deciding with the decision layer as sluice
// serve does.
func service(t *testing.T, yaml string) (*rls.Service, *memory.Store) {
	t.Helper()
	conf, err := envoyconf.Parse([]byte(yaml), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 10, 0, 30, 0, time.UTC))
	st := memory.New(memory.WithClock(clock))
	d := decision.Decider{Store: st, MaxDelay: 10 * time.Second}
	return rls.New(conf, d.Decide), st
}

func desc(kv ...string) *commonpb.RateLimitDescriptor {
	d := &commonpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, s *rls.Service, domain string, hits uint32, ds ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

func codes_(resp *rlspb.RateLimitResponse) []rlspb.RateLimitResponse_Code {
	var out []rlspb.RateLimitResponse_Code
	for _, s := range resp.Statuses {
		out = append(out, s.Code)
	}
	return out
}

func header(resp *rlspb.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return ""
}

const tree = `
domain: shop
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: path
        value: /orders
        rate_limit: {unit: minute, requests_per_unit: 1, name: orders}
  - key: region
    value: eu*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: internal
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: bucket
    algorithm: token-bucket
    burst: 2
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: gold
    rate_limit: {unit: minute, requests_per_unit: 10, name: gold, replaces: [{name: orders}]}
`

// A value-less key counts per value; each request's status states its limit, what remains and
// when its window ends; over the limit, the request is OVER_LIMIT with Retry-After, the
// RateLimit fields and a problem body.
func TestPerValueCountersAndAnswers(t *testing.T) {
	s, _ := service(t, tree)
	for i := 1; i <= 3; i++ {
		resp := ask(t, s, "shop", 0, desc("client", "a"))
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.LimitRemaining != uint32(3-i) || st.CurrentLimit.GetRequestsPerUnit() != 3 ||
			st.CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("request %d: %v", i, resp)
		}
		if d := st.DurationUntilReset.AsDuration(); d != 30*time.Second {
			t.Errorf("request %d: duration_until_reset %v, want 30s (the minute's end)", i, d)
		}
		if header(resp, "RateLimit") == "" || header(resp, "RateLimit-Policy") == "" || header(resp, "Retry-After") != "" {
			t.Errorf("request %d: headers %v", i, resp.ResponseHeadersToAdd)
		}
	}
	resp := ask(t, s, "shop", 0, desc("client", "a"))
	if resp.OverallCode != over || resp.Statuses[0].Code != over || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("4th: %v", resp)
	}
	if header(resp, "Retry-After") != "30" || header(resp, "Content-Type") != "application/problem+json" {
		t.Errorf("4th: headers %v", resp.ResponseHeadersToAdd)
	}
	var problem map[string]any
	if err := json.Unmarshal(resp.RawBody, &problem); err != nil || problem["status"] != 429.0 || problem["retry-after"] != 30.0 {
		t.Errorf("raw_body %s (%v)", resp.RawBody, err)
	}
	// Another value has its own counter.
	if resp := ask(t, s, "shop", 0, desc("client", "b")); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("client b: %v", resp)
	}
}

// Nested descriptors match the node of the last entry; wildcards match by prefix; a descriptor
// no rule matches is OK with nothing else; an unknown domain limits nothing.
func TestTreesWildcardsAndNoMatch(t *testing.T) {
	s, _ := service(t, tree)
	if resp := ask(t, s, "shop", 0, desc("client", "a", "path", "/orders")); resp.Statuses[0].CurrentLimit.GetName() != "orders" || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("nested: %v", resp)
	}
	if resp := ask(t, s, "shop", 0, desc("client", "a", "path", "/orders")); resp.OverallCode != over {
		t.Fatalf("nested, 2nd: %v", resp)
	}
	// The nested counter is its own: the parent's is untouched.
	if resp := ask(t, s, "shop", 0, desc("client", "a")); resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("parent after nested: %v", resp)
	}
	for _, v := range []string{"eu-west", "eu-north"} {
		if resp := ask(t, s, "shop", 0, desc("region", v)); resp.OverallCode != ok {
			t.Fatalf("region %s: %v", v, resp)
		}
	}
	if resp := ask(t, s, "shop", 0, desc("region", "us-east")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("region us-east matched: %v", resp)
	}
	if resp := ask(t, s, "shop", 0, desc("nothing", "here")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("no rule: %v", resp)
	}
	if resp := ask(t, s, "elsewhere", 0, desc("client", "a")); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", resp)
	}
}

// Unlimited is never counted; shadow mode counts but never refuses; replaces drops the replaced
// limit for that request.
func TestUnlimitedShadowReplaces(t *testing.T) {
	s, st := service(t, tree)
	for range 5 {
		resp := ask(t, s, "shop", 0, desc("internal", "x"))
		if resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != math.MaxUint32 || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unlimited: %v", resp)
		}
	}
	if st.Len() != 0 {
		t.Fatalf("unlimited descriptors were counted: %d keys", st.Len())
	}
	for i := range 3 {
		resp := ask(t, s, "shop", 0, desc("shadow", "x"))
		if resp.OverallCode != ok || resp.Statuses[0].Code != ok {
			t.Fatalf("shadow %d: %v", i, resp)
		}
		if i > 0 && resp.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("shadow %d: remaining %d", i, resp.Statuses[0].LimitRemaining)
		}
	}
	// gold replaces orders: with both in one request, orders is OK with no limit and is not
	// counted, again and again.
	for range 3 {
		resp := ask(t, s, "shop", 0, desc("client", "c", "path", "/orders"), desc("gold", "c"))
		if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit.GetName() != "gold" {
			t.Fatalf("replaces: %v", resp)
		}
	}
	if resp := ask(t, s, "shop", 0, desc("client", "c", "path", "/orders")); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("orders alone after being replaced: %v", resp)
	}
}

// Several descriptors: the request is over if any is, and then none of them consumes anything
// (all or nothing).
func TestOneOverRefusesAllAndConsumesNothing(t *testing.T) {
	s, _ := service(t, tree)
	ask(t, s, "shop", 0, desc("client", "d", "path", "/orders")) // orders for d: spent
	resp := ask(t, s, "shop", 0, desc("client", "d"), desc("client", "d", "path", "/orders"))
	if resp.OverallCode != over || resp.Statuses[0].Code != ok || resp.Statuses[1].Code != over {
		t.Fatalf("mixed: %v", resp)
	}
	if resp := ask(t, s, "shop", 0, desc("client", "d")); resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("the refused request consumed the allowed descriptor's quota: remaining %d, want 2", resp.Statuses[0].LimitRemaining)
	}
}

// hits_addend is the cost, per request or per descriptor; one above the limit is over, one a
// window can never hold is over and consumes nothing; 0 peeks.
func TestHitsAddendAndOverrides(t *testing.T) {
	s, _ := service(t, tree)
	if resp := ask(t, s, "shop", 2, desc("client", "e")); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("hits 2: %v", resp)
	}
	if resp := ask(t, s, "shop", 2, desc("client", "e")); resp.OverallCode != over {
		t.Fatalf("hits 2 more: %v", resp)
	}
	d := desc("client", "e")
	d.HitsAddend = wrapperspb.UInt64(1)
	if resp := ask(t, s, "shop", 5, d); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("descriptor hits 1 beside request hits 5: %v", resp)
	}
	d.HitsAddend = wrapperspb.UInt64(0)
	if resp := ask(t, s, "shop", 0, d); resp.OverallCode != ok || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("peek: %v", resp)
	}
	if resp := ask(t, s, "shop", 99, desc("client", "f")); resp.OverallCode != over || resp.Statuses[0].Code != over {
		t.Fatalf("hits over capacity: %v", resp)
	}
	if resp := ask(t, s, "shop", 0, desc("client", "f")); resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("hits over capacity consumed: %v", resp)
	}
	// The descriptor's own limit overrides the configuration's.
	o := desc("client", "g")
	o.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typepb.RateLimitUnit_HOUR}
	resp := ask(t, s, "shop", 0, o)
	if resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 || resp.Statuses[0].CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("override: %v", resp)
	}
	if resp := ask(t, s, "shop", 0, o); resp.OverallCode != over {
		t.Fatalf("override, 2nd: %v", resp)
	}
}

// sluice's extension: a token bucket per descriptor.
func TestExtensionAlgorithm(t *testing.T) {
	s, _ := service(t, tree)
	var got []rlspb.RateLimitResponse_Code
	for range 4 {
		got = append(got, ask(t, s, "shop", 0, desc("bucket", "x")).OverallCode)
	}
	if want := []rlspb.RateLimitResponse_Code{ok, ok, over, over}; !equal(got, want) {
		t.Fatalf("token bucket burst 2: %v, want %v", got, want)
	}
}

// Bad requests are errors (InvalidArgument), not answers.
func TestBadRequests(t *testing.T) {
	s, _ := service(t, tree)
	bad := []*rlspb.RateLimitRequest{
		{Descriptors: []*commonpb.RateLimitDescriptor{desc("client", "a")}},
		{Domain: "shop"},
		{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: desc("client", "a").Entries, IsNegativeHits: true}}},
		{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{{Entries: desc("client", "a").Entries,
			Limit: &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typepb.RateLimitUnit(42)}}}},
	}
	for i, r := range bad {
		_, err := s.ShouldRateLimit(context.Background(), r)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("bad request %d: %v, want InvalidArgument", i, err)
		}
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var _ = codes_

// Descriptors sharing a counter are one limit of their summed hits; a sum past 2^63-1 saturates
// (a cost no limit can hold: over) instead of wrapping to a small cost that passes. Being usage
// (their own hits_addend), the hits are charged all the same, as many as a counter holds.
func TestSummedHitsSaturate(t *testing.T) {
	s, _ := service(t, tree)
	var ds []*commonpb.RateLimitDescriptor
	for _, h := range []uint64{math.MaxInt64, math.MaxInt64, 3} {
		d := desc("client", "wrap")
		d.HitsAddend = wrapperspb.UInt64(h)
		ds = append(ds, d)
	}
	resp := ask(t, s, "shop", 0, ds...)
	if resp.OverallCode != over || !equal(codes_(resp), []rlspb.RateLimitResponse_Code{over, over, over}) {
		t.Fatalf("2^63-1 + 2^63-1 + 3 hits on a limit of 3: %v, want OVER_LIMIT", resp)
	}
	if resp := ask(t, s, "shop", 0, desc("client", "wrap")); resp.OverallCode != over {
		t.Fatalf("after the usage was charged: %v, want OVER_LIMIT", resp)
	}
}

// A request's own limit with a unit_multiplier ("3 per 60 seconds") is a window of 60 s, on its
// own counter, stated in current_limit; a multiplier of 0, or a window over 100 years, is refused.
func TestOverrideUnitMultiplier(t *testing.T) {
	s, _ := service(t, tree) // the clock stands at 10:00:30
	perMinute := desc("client", "m")
	perMinute.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typepb.RateLimitUnit_SECOND,
		UnitMultiplier: wrapperspb.UInt32(60)}
	for i := 1; i <= 3; i++ {
		resp := ask(t, s, "shop", 0, perMinute)
		st := resp.Statuses[0]
		if resp.OverallCode != ok || st.CurrentLimit.GetUnitMultiplier().GetValue() != 60 || st.CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_SECOND {
			t.Fatalf("request %d: %v", i, resp)
		}
		if d := st.DurationUntilReset.AsDuration(); d != 30*time.Second {
			t.Fatalf("request %d: duration_until_reset %v, want 30s (the end of the 60 s window)", i, d)
		}
	}
	if resp := ask(t, s, "shop", 0, perMinute); resp.OverallCode != over {
		t.Fatalf("4th of 3 per 60 s: %v", resp)
	}
	perSecond := desc("client", "m")
	perSecond.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typepb.RateLimitUnit_SECOND}
	if resp := ask(t, s, "shop", 0, perSecond); resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetUnitMultiplier() != nil {
		t.Fatalf("3 per second is not the counter of 3 per 60 seconds: %v", resp)
	}
	for _, n := range []uint32{0, math.MaxUint32} {
		bad := desc("client", "m")
		bad.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typepb.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(n)}
		_, err := s.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "shop", Descriptors: []*commonpb.RateLimitDescriptor{bad}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("unit_multiplier %d years: %v, want InvalidArgument", n, err)
		}
	}
}

// A request that can never pass (hits above what its limit ever holds, or a limit of 0) is
// OVER_LIMIT without Retry-After or a retry-after in its body: waiting would not help. Its
// status still says when the window ends, as the reference's does.
func TestNeverPassesHasNoRetryHint(t *testing.T) {
	s, _ := service(t, tree+`
  - key: banned
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	for _, tc := range []struct {
		name string
		hits uint32
		d    *commonpb.RateLimitDescriptor
	}{{"hits 99 of 3", 99, desc("client", "n")}, {"a limit of 0", 1, desc("banned", "x")}} {
		resp := ask(t, s, "shop", tc.hits, tc.d)
		if resp.OverallCode != over || resp.Statuses[0].Code != over {
			t.Fatalf("%s: %v, want OVER_LIMIT", tc.name, resp)
		}
		if h := header(resp, "Retry-After"); h != "" {
			t.Errorf("%s: Retry-After %q for a request that can never pass", tc.name, h)
		}
		var body map[string]any
		if err := json.Unmarshal(resp.RawBody, &body); err != nil {
			t.Fatalf("%s: body %q: %v", tc.name, resp.RawBody, err)
		}
		if _, has := body["retry-after"]; has || !strings.Contains(body["detail"].(string), "retrying will not help") {
			t.Errorf("%s: problem %s", tc.name, resp.RawBody)
		}
		if d := resp.Statuses[0].DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("%s: duration_until_reset %v, want the window's end, as the reference says", tc.name, d)
		}
	}
}

// quota_mode does what docs/envoy.md says, which is what the reference at the version sluice is
// tested against does: counted, but never OVER_LIMIT, not even when every quota descriptor of the
// request is over (the docs said it then was).
func TestQuotaModeAsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `quota_mode` \\|.*$").Find(doc)
	if !strings.Contains(string(row), "never makes the request over the limit") || strings.Contains(string(row), "only if every quota descriptor") {
		t.Errorf("docs/envoy.md's quota_mode row does not say what the service does: %s", row)
	}
	s, _ := service(t, `
domain: q
descriptors:
  - key: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	if resp := ask(t, s, "q", 0, desc("a", "x"), desc("b", "x")); resp.OverallCode != ok {
		t.Fatalf("within quota: %v", resp)
	}
	resp := ask(t, s, "q", 0, desc("a", "x"), desc("b", "x"))
	if resp.OverallCode != ok {
		t.Fatalf("every quota descriptor over: %v, want OK", resp)
	}
	for i, st := range resp.Statuses {
		if st.Code != ok || st.LimitRemaining != 0 || st.DurationUntilReset != nil || st.CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Errorf("status %d: %v, want OK with its limit, nothing remaining and no reset", i, st)
		}
	}
}
