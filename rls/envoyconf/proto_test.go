package envoyconf

import (
	"reflect"
	"strings"
	"testing"

	rlsconfpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
)

// A resource means what its YAML file means: the same limits, counters and modes for the same
// descriptors.
func TestFromProtoMatchesYAML(t *testing.T) {
	res := &rlsconfpb.RateLimitConfig{Name: "eg", Domain: "eg", Descriptors: []*rlsconfpb.RateLimitDescriptor{
		{Key: "remote_address", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_MINUTE, RequestsPerUnit: 5}},
		{Key: "path", Value: "/a", ShadowMode: true, DetailedMetric: true,
			RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_SECOND, RequestsPerUnit: 2, Name: "a"},
			Descriptors: []*rlsconfpb.RateLimitDescriptor{
				{Key: "user", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_HOUR, RequestsPerUnit: 100,
					Replaces: []*rlsconfpb.RateLimitReplace{{Name: "a"}}}},
			}},
		{Key: "free", RateLimit: &rlsconfpb.RateLimitPolicy{Unlimited: true}},
	}}
	src := `domain: eg
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /a
    shadow_mode: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 2, name: a}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 100, replaces: [{name: a}]}
  - key: free
    rate_limit: {unlimited: true}
`
	got, err := FromProto(res)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Parse([]byte(src), "eg.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, es := range [][]Entry{
		{{"remote_address", "10.0.0.1"}},
		{{"path", "/a"}},
		{{"path", "/a"}, {"user", "u1"}},
		{{"path", "/b"}},
		{{"free", "x"}},
	} {
		g, gok := got.Match("eg", es, nil)
		w, wok := want.Match("eg", es, nil)
		if gok != wok || !reflect.DeepEqual(g, w) {
			t.Errorf("%v: from the resource %v %+v, from the file %v %+v", es, gok, g, wok, w)
		}
	}
	if d := got.Domains(); !reflect.DeepEqual(d, []string{"eg"}) {
		t.Errorf("domains %v", d)
	}
}

// What a file may not hold, a resource may not either, with the file's message; a domain in
// two resources is refused as in two files.
func TestFromProtoErrors(t *testing.T) {
	lim := func(u rlsconfpb.RateLimitUnit, n uint32) *rlsconfpb.RateLimitPolicy {
		return &rlsconfpb.RateLimitPolicy{Unit: u, RequestsPerUnit: n}
	}
	for _, tc := range []struct {
		name string
		rs   []*rlsconfpb.RateLimitConfig
		want string
	}{
		{"no domain", []*rlsconfpb.RateLimitConfig{{Name: "r"}}, "xds:r: domain must not be empty"},
		{"no key", []*rlsconfpb.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{{Value: "v"}}}},
			`xds:r: descriptors[0]: key must not be empty`},
		{"no unit", []*rlsconfpb.RateLimitConfig{{Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{{Key: "k", RateLimit: lim(0, 1)}}}},
			`xds:d: descriptors[0] "k": rate_limit.unit is required`},
		{"unit with unlimited", []*rlsconfpb.RateLimitConfig{{Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{
			{Key: "k", RateLimit: &rlsconfpb.RateLimitPolicy{Unit: rlsconfpb.RateLimitUnit_SECOND, Unlimited: true}}}}},
			`xds:d: descriptors[0] "k": rate_limit.unit must not be set with unlimited: true`},
		{"duplicate descriptor", []*rlsconfpb.RateLimitConfig{{Domain: "d", Descriptors: []*rlsconfpb.RateLimitDescriptor{
			{Key: "k", Value: "v", RateLimit: lim(1, 1)}, {Key: "k", Value: "v", RateLimit: lim(1, 2)}}}},
			`xds:d: descriptors[1] "k=v": descriptor "k=v" is already defined at this level: duplicate descriptor composite key "d.k_v"`},
		{"domain twice", []*rlsconfpb.RateLimitConfig{{Name: "a", Domain: "d"}, {Name: "b", Domain: "d"}},
			`xds:b: domain "d" is also the domain of xds:a: each domain is defined in one file`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := FromProto(tc.rs...)
			if c != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, %v; want an error containing\n%s", c, err, tc.want)
			}
		})
	}
}
