package answer

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/store/memory"
)

// member is one parsed list member of RateLimit-Policy or RateLimit: a String and Integer
// parameters, in order.
type member struct {
	Name   string
	Params []param
}

type param struct {
	Key   string
	Value int64
}

func (m member) String() string {
	s := strconv.Quote(m.Name)
	for _, p := range m.Params {
		s += fmt.Sprintf(";%s=%d", p.Key, p.Value)
	}
	return s
}

// parseList parses every line of a field as one Structured Field List (RFC 9651, section 4.2,
// by github.com/dunglas/httpsfv, which passes the httpwg test suite) and requires what the draft
// requires of both fields: each member an Item (no Inner List) whose value is a String, with
// Integer parameters.
func parseList(t testing.TB, lines []string) []member {
	t.Helper()
	if len(lines) == 0 {
		t.Fatal("field absent")
	}
	list, err := httpsfv.UnmarshalList(lines)
	if err != nil {
		t.Fatalf("%q does not parse as a Structured Field List: %v", lines, err)
	}
	var out []member
	for _, m := range list {
		item, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%q: member %v is not an Item", lines, m)
		}
		name, ok := item.Value.(string)
		if !ok {
			t.Fatalf("%q: member value %v (%T) is not a String", lines, item.Value, item.Value)
		}
		mb := member{Name: name}
		for _, k := range item.Params.Names() {
			v, _ := item.Params.Get(k)
			n, ok := v.(int64)
			if !ok {
				t.Fatalf("%q: parameter %s=%v (%T) is not an Integer", lines, k, v, v)
			}
			mb.Params = append(mb.Params, param{k, n})
		}
		out = append(out, mb)
	}
	return out
}

// policyMember and limitMember are the members the draft defines, with exactly its parameters.
func policyMember(name string, q, w int64) member { return member{name, []param{{"q", q}, {"w", w}}} }
func limitMember(name string, r, t int64) member  { return member{name, []param{{"r", r}, {"t", t}}} }

var (
	perSecond = sluice.Policy{Name: "per-second", Algorithm: sluice.TokenBucket, Limit: 10, Period: time.Second}
	daily     = sluice.Policy{Name: "daily", Algorithm: sluice.FixedWindow, Limit: 10000, Period: 24 * time.Hour}
	standard  = sluice.Policy{Name: "standard", Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Minute, Burst: 20}
)

func TestHeaders(t *testing.T) {
	tests := []struct {
		name       string
		decisions  []Applied
		policy     []member
		limit      []member
		policyText string // the exact serialisation, where it is worth pinning
		limitText  string
	}{
		{
			name:       "one policy allowed",
			decisions:  []Applied{{standard, sluice.Decision{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 3 * time.Second}, "", ""}},
			policy:     []member{policyMember("standard", 100, 60)},
			limit:      []member{limitMember("standard", 19, 3)},
			policyText: `"standard";q=100;w=60`,
			limitText:  `"standard";r=19;t=3`,
		},
		{
			name: "two policies allowed: both reported",
			decisions: []Applied{
				{perSecond, sluice.Decision{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 300 * time.Millisecond}, "", ""},
				{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 9412, ResetAfter: 50510*time.Second + time.Microsecond}, "", ""},
			},
			policy:     []member{policyMember("per-second", 10, 1), policyMember("daily", 10000, 86400)},
			limit:      []member{limitMember("per-second", 7, 1), limitMember("daily", 9412, 50511)},
			policyText: `"per-second";q=10;w=1, "daily";q=10000;w=86400`,
			limitText:  `"per-second";r=7;t=1, "daily";r=9412;t=50511`,
		},
		{
			name: "refused by one: only it, with t the retry time",
			decisions: []Applied{
				{perSecond, sluice.Decision{Allowed: false, Limit: 10, Remaining: 0, RetryAfter: 99 * time.Millisecond, ResetAfter: time.Second}, "", ""},
				{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 9411, ResetAfter: 50000 * time.Second}, "", ""},
			},
			policy:    []member{policyMember("per-second", 10, 1), policyMember("daily", 10000, 86400)},
			limit:     []member{limitMember("per-second", 0, 1)},
			limitText: `"per-second";r=0;t=1`,
		},
		{
			name: "refused by both",
			decisions: []Applied{
				{perSecond, sluice.Decision{Allowed: false, Limit: 10, RetryAfter: 100 * time.Millisecond, ResetAfter: time.Second}, "", ""},
				{daily, sluice.Decision{Allowed: false, Limit: 10000, RetryAfter: 7200*time.Second + 1, ResetAfter: 7200*time.Second + 1}, "", ""},
			},
			policy: []member{policyMember("per-second", 10, 1), policyMember("daily", 10000, 86400)},
			limit:  []member{limitMember("per-second", 0, 1), limitMember("daily", 0, 7201)},
		},
		{
			name:      "refused with some remaining (a costly request)",
			decisions: []Applied{{standard, sluice.Decision{Allowed: false, Limit: 20, Remaining: 3, RetryAfter: 1200 * time.Millisecond, ResetAfter: 10200 * time.Millisecond}, "", ""}},
			policy:    []member{policyMember("standard", 100, 60)},
			limit:     []member{limitMember("standard", 3, 2)},
		},
		{
			name:      "refused forever: t is the reset",
			decisions: []Applied{{standard, sluice.Decision{Allowed: false, Limit: 20, Remaining: 20, RetryAfter: sluice.Never}, "", ""}},
			policy:    []member{policyMember("standard", 100, 60)},
			limit:     []member{limitMember("standard", 20, 0)},
		},
		{
			name:      "fresh key: t=0",
			decisions: []Applied{{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 9999}, "", ""}},
			policy:    []member{policyMember("daily", 10000, 86400)},
			limit:     []member{limitMember("daily", 9999, 0)},
		},
		{
			name:      "sub-second period: w rounded up",
			decisions: []Applied{{sluice.Policy{Name: "burst", Algorithm: sluice.FixedWindow, Limit: 5, Period: 250 * time.Millisecond}, sluice.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 200 * time.Millisecond}, "", ""}},
			policy:    []member{policyMember("burst", 5, 1)},
			limit:     []member{limitMember("burst", 4, 1)},
		},
		{
			name:      "fractional period: w rounded up",
			decisions: []Applied{{sluice.Policy{Name: "odd", Algorithm: sluice.SlidingWindow, Limit: 3, Period: 1500 * time.Millisecond}, sluice.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 1500 * time.Millisecond}, "", ""}},
			policy:    []member{policyMember("odd", 3, 2)},
			limit:     []member{limitMember("odd", 2, 2)},
		},
		{
			name:      "negative values are never sent",
			decisions: []Applied{{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: -5, ResetAfter: -time.Second}, "", ""}},
			policy:    []member{policyMember("daily", 10000, 86400)},
			limit:     []member{limitMember("daily", 0, 0)},
		},
		{
			name:       "huge limit clamped to what an sf-integer holds",
			decisions:  []Applied{{sluice.Policy{Name: "vast", Algorithm: sluice.FixedWindow, Limit: 1 << 53, Period: time.Hour}, sluice.Decision{Allowed: true, Limit: 1 << 53, Remaining: 1<<53 - 1}, "", ""}},
			policy:     []member{policyMember("vast", 999_999_999_999_999, 3600)},
			limit:      []member{limitMember("vast", 999_999_999_999_999, 0)},
			policyText: `"vast";q=999999999999999;w=3600`,
		},
		{
			name:       "quote and backslash escaped",
			decisions:  []Applied{{sluice.Policy{Name: `the "gold" \ plan`, Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, sluice.Decision{Allowed: true, Limit: 1}, "", ""}},
			policy:     []member{policyMember(`the "gold" \ plan`, 1, 1)},
			limit:      []member{limitMember(`the "gold" \ plan`, 0, 0)},
			policyText: `"the \"gold\" \\ plan";q=1;w=1`,
		},
		{
			name:      "non-ASCII percent-encoded",
			decisions: []Applied{{sluice.Policy{Name: "café\n", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, sluice.Decision{Allowed: true, Limit: 1}, "", ""}},
			policy:    []member{policyMember("caf%c3%a9%0a", 1, 1)},
			limit:     []member{limitMember("caf%c3%a9%0a", 0, 0)},
		},
		{
			name:      "empty name",
			decisions: []Applied{{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, sluice.Decision{Allowed: true, Limit: 1}, "", ""}},
			policy:    []member{policyMember("", 1, 1)},
			limit:     []member{limitMember("", 0, 0)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			Headers(h, tt.decisions, false)
			if got := parseList(t, h.Values(FieldRateLimitPolicy)); !reflect.DeepEqual(got, tt.policy) {
				t.Errorf("RateLimit-Policy: %q parses as %v, want %v", h.Values(FieldRateLimitPolicy), got, tt.policy)
			}
			if got := parseList(t, h.Values(FieldRateLimit)); !reflect.DeepEqual(got, tt.limit) {
				t.Errorf("RateLimit: %q parses as %v, want %v", h.Values(FieldRateLimit), got, tt.limit)
			}
			if tt.policyText != "" && h.Get(FieldRateLimitPolicy) != tt.policyText {
				t.Errorf("RateLimit-Policy: %s, want %s", h.Get(FieldRateLimitPolicy), tt.policyText)
			}
			if tt.limitText != "" && h.Get(FieldRateLimit) != tt.limitText {
				t.Errorf("RateLimit: %s, want %s", h.Get(FieldRateLimit), tt.limitText)
			}
			for _, legacy := range []string{FieldLegacyLimit, FieldLegacyRemaining, FieldLegacyReset} {
				if v := h.Values(legacy); v != nil {
					t.Errorf("%s = %q without legacy", legacy, v)
				}
			}
			// Section 6: "the Retry-After field value SHOULD NOT reference a point in time earlier
			// than the end of the effective window."
			if wait := Wait(tt.decisions); wait > 0 {
				ra, err := strconv.ParseInt(RetryAfter(wait), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range parseList(t, h.Values(FieldRateLimit)) {
					if tw := m.Params[1].Value; tw > ra {
						t.Errorf("RateLimit %v: t=%d is after Retry-After %d", m, tw, ra)
					}
				}
			}
		})
	}
}

func TestHeadersNone(t *testing.T) {
	h := http.Header{}
	Headers(h, nil, true)
	if len(h) != 0 {
		t.Errorf("no decisions: header %v, want none", h)
	}
}

// TestHeadersKeepUpstreamFields: a List may be split over field lines; an upstream's own members
// are kept, and all lines parse as one List.
func TestHeadersKeepUpstreamFields(t *testing.T) {
	h := http.Header{}
	h.Add("RateLimit", `"backend";r=5;t=10`)
	Headers(h, []Applied{{standard, sluice.Decision{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 3 * time.Second}, "", ""}}, false)
	want := []member{limitMember("backend", 5, 10), limitMember("standard", 19, 3)}
	if got := parseList(t, h.Values("Ratelimit")); !reflect.DeepEqual(got, want) {
		t.Errorf("RateLimit lines %q parse as %v, want %v", h.Values("Ratelimit"), got, want)
	}
}

func TestLegacyHeaders(t *testing.T) {
	tests := []struct {
		name                    string
		decisions               []Applied
		limit, remaining, reset string
	}{
		{"one", []Applied{{standard, sluice.Decision{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 2500 * time.Millisecond}, "", ""}}, "20", "19", "3"},
		{"fewest remaining", []Applied{
			{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 9000, ResetAfter: time.Hour}, "", ""},
			{perSecond, sluice.Decision{Allowed: true, Limit: 10, Remaining: 2, ResetAfter: time.Second}, "", ""},
		}, "10", "2", "1"},
		{"tie: longest reset", []Applied{
			{perSecond, sluice.Decision{Allowed: true, Limit: 10, Remaining: 0, ResetAfter: time.Second}, "", ""},
			{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 0, ResetAfter: time.Hour}, "", ""},
		}, "10000", "0", "3600"},
		{"refusal beats fewer remaining", []Applied{
			{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 0, ResetAfter: time.Hour}, "", ""},
			{perSecond, sluice.Decision{Allowed: false, Limit: 10, Remaining: 1, RetryAfter: 200 * time.Millisecond, ResetAfter: time.Second}, "", ""},
		}, "10", "1", "1"},
		{"longest refusal", []Applied{
			{perSecond, sluice.Decision{Allowed: false, Limit: 10, RetryAfter: 200 * time.Millisecond}, "", ""},
			{daily, sluice.Decision{Allowed: false, Limit: 10000, RetryAfter: 90 * time.Minute}, "", ""},
		}, "10000", "0", "5400"},
		{"limit from the policy when the decision has none", []Applied{{standard, sluice.Decision{Allowed: true, Remaining: 3}, "", ""}}, "20", "3", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			Headers(h, tt.decisions, true)
			for field, want := range map[string]string{FieldLegacyLimit: tt.limit, FieldLegacyRemaining: tt.remaining, FieldLegacyReset: tt.reset} {
				if got := h.Values(field); len(got) != 1 || got[0] != want {
					t.Errorf("%s = %q, want %q", field, got, want)
				}
			}
		})
	}
}

// delaySeconds is RFC 9110's delay-seconds = 1*DIGIT.
var delaySeconds = regexp.MustCompile(`^[0-9]+$`)

func TestRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{sluice.Never, "1"}, {0, "1"}, {time.Nanosecond, "1"}, {time.Microsecond, "1"}, {999 * time.Millisecond, "1"},
		{time.Second, "1"}, {time.Second + time.Microsecond, "2"}, {12 * time.Second, "12"},
		{11*time.Second + 1, "12"}, {24 * time.Hour, "86400"},
	} {
		got := RetryAfter(tt.d)
		if got != tt.want {
			t.Errorf("RetryAfter(%v) = %q, want %q", tt.d, got, tt.want)
		}
		if !delaySeconds.MatchString(got) {
			t.Errorf("RetryAfter(%v) = %q is not delay-seconds", tt.d, got)
		}
	}
}

func TestWait(t *testing.T) {
	allowed := sluice.Decision{Allowed: true}
	for _, tt := range []struct {
		name string
		ds   []Applied
		want time.Duration
	}{
		{"none", nil, 0},
		{"all allowed", []Applied{{perSecond, allowed, "", ""}, {daily, allowed, "", ""}}, 0},
		{"longest refusal", []Applied{{perSecond, sluice.Decision{RetryAfter: time.Second}, "", ""}, {daily, allowed, "", ""}, {standard, sluice.Decision{RetryAfter: 3 * time.Second}, "", ""}}, 3 * time.Second},
		{"never", []Applied{{perSecond, sluice.Decision{RetryAfter: time.Second}, "", ""}, {standard, sluice.Decision{RetryAfter: sluice.Never}, "", ""}}, sluice.Never},
	} {
		if got := Wait(tt.ds); got != tt.want {
			t.Errorf("%s: Wait = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestCheckPolicyName(t *testing.T) {
	for _, ok := range []string{"", "standard", "orders-api:v2", `a "quoted" \ name`} {
		if err := CheckPolicyName(ok); err != nil {
			t.Errorf("CheckPolicyName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"café", "tab\there", "nl\n", "\x7f"} {
		if err := CheckPolicyName(bad); err == nil {
			t.Errorf("CheckPolicyName(%q) = nil", bad)
		}
	}
}

// virtualClock is a sluice.Clock that tests move by hand.
type virtualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *virtualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *virtualClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestRetryAfterSucceeds runs every algorithm on the real memory store: after a refusal, a retry
// after the advertised Retry-After seconds is approved, and RateLimit agrees with Retry-After.
func TestRetryAfterSucceeds(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingLog, sluice.SlidingWindow, sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := &virtualClock{now: time.Unix(1_700_000_000, 123_456_000)}
			policy := sluice.Policy{Name: "p", Algorithm: alg, Limit: 3, Period: 2500 * time.Millisecond}
			lim, err := sluice.NewLimiter(memory.New(memory.WithClock(clock)), policy)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var d sluice.Decision
			for i := 0; i < 100; i++ {
				if d, err = lim.Allow(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					break
				}
				clock.Add(time.Millisecond)
			}
			if d.Allowed {
				t.Fatal("never refused")
			}
			applied := []Applied{{policy, d, "", ""}}
			h := http.Header{}
			Headers(h, applied, true)
			ra := RetryAfter(Wait(applied))
			secs, err := strconv.Atoi(ra)
			if err != nil || !delaySeconds.MatchString(ra) {
				t.Fatalf("Retry-After %q is not delay-seconds", ra)
			}
			limit := parseList(t, h.Values(FieldRateLimit))
			if len(limit) != 1 || limit[0].Params[1].Value > int64(secs) {
				t.Errorf("RateLimit %v ends after Retry-After %d", limit, secs)
			}
			clock.Add(time.Duration(secs) * time.Second)
			if d, err = lim.Allow(ctx, "k"); err != nil || !d.Allowed {
				t.Errorf("retry after Retry-After %s s: %+v, %v; want allowed", ra, d, err)
			}
		})
	}
}

func FuzzPolicyName(f *testing.F) {
	for _, s := range []string{"standard", `a"b\c`, "café", "", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		h := http.Header{}
		Headers(h, []Applied{{sluice.Policy{Name: name, Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Second}, sluice.Decision{Allowed: true, Limit: 1}, "", ""}}, false)
		got := parseList(t, h.Values(FieldRateLimitPolicy))
		if len(got) != 1 {
			t.Fatalf("%q: %d members", name, len(got))
		}
		if CheckPolicyName(name) == nil && got[0].Name != name {
			t.Fatalf("name %q came back as %q", name, got[0].Name)
		}
		if CheckPolicyName(name) != nil && strings.ContainsAny(got[0].Name, "\x00\x7f") {
			t.Fatalf("name %q came back with control bytes: %q", name, got[0].Name)
		}
	})
}

func BenchmarkHeaders(b *testing.B) {
	ds := []Applied{
		{perSecond, sluice.Decision{Allowed: true, Limit: 10, Remaining: 7, ResetAfter: 300 * time.Millisecond}, "", ""},
		{daily, sluice.Decision{Allowed: true, Limit: 10000, Remaining: 9412, ResetAfter: 50510 * time.Second}, "", ""},
	}
	b.Run("two-policies", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Headers(make(http.Header, 4), ds, false)
		}
	})
	b.Run("two-policies-legacy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			Headers(make(http.Header, 8), ds, true)
		}
	})
}

func TestCanonicalKeys(t *testing.T) {
	for field, key := range map[string]string{
		FieldRateLimitPolicy: keyRateLimitPolicy, FieldRateLimit: keyRateLimit, FieldLegacyLimit: keyLegacyLimit,
		FieldLegacyRemaining: keyLegacyRemaining, FieldLegacyReset: keyLegacyReset,
	} {
		if c := http.CanonicalHeaderKey(field); c != key {
			t.Errorf("CanonicalHeaderKey(%s) = %s, the code uses %s", field, c, key)
		}
	}
}
