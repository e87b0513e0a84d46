package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// sluice's extension: algorithm and burst beside rate_limit choose how the limit is applied.
func TestExtension(t *testing.T) {
	c := load(t, "sluice_extension.yaml")
	for _, tc := range []struct {
		entries []Entry
		want    sluice.Policy
	}{
		{kv("tier", "gold"), sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 20}},
		{kv("tier", "silver"), sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 100, Period: time.Minute, Burst: 100}},
		{kv("tier", "bronze"), sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second, Burst: 10}},
		{kv("tier", "queue"), sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second}},
		{kv("tier", "smooth"), sluice.Policy{Algorithm: sluice.SlidingWindow, Limit: 1000, Period: time.Hour}},
		{kv("tier", "exact"), sluice.Policy{Algorithm: sluice.SlidingLog, Limit: 3, Period: 24 * time.Hour}},
		{kv("tier", "plain"), sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 7, Period: 7 * 24 * time.Hour}},
		{kv("tier", "window"), sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 7, Period: 30 * 24 * time.Hour}},
	} {
		m, ok := c.Match("ext", tc.entries, nil)
		if !ok {
			t.Fatalf("%v: no match", tc.entries)
		}
		if m.Policy != tc.want {
			t.Errorf("%v: Policy %+v, want %+v", tc.entries, m.Policy, tc.want)
		}
		if err := m.Policy.Validate(); err != nil {
			t.Errorf("%v: %v", tc.entries, err)
		}
		if m.RequestsPerUnit != uint32(tc.want.Limit) || m.Unit.Duration() != tc.want.Period {
			t.Errorf("%v: current_limit %d per %v", tc.entries, m.RequestsPerUnit, m.Unit)
		}
	}
	// An override is the reference's own fixed window, whatever the rule's algorithm.
	m, _ := c.Match("ext", kv("tier", "gold"), &Override{RequestsPerUnit: 5, Unit: Second})
	if m.Policy != (sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}) {
		t.Errorf("override: %+v", m.Policy)
	}
	gold, _ := c.Match("ext", kv("tier", "gold"), nil)
	if m.Key == gold.Key {
		t.Error("the override and the token bucket share a counter")
	}
}

// Each misuse of the extension is refused at its line, naming the field.
func TestExtensionErrors(t *testing.T) {
	head := "domain: d\ndescriptors:\n  - key: k\n"
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"unknown algorithm", head + "    algorithm: token_bucket\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:4:16: descriptors[0] "k": algorithm "token_bucket" is unknown: want fixed-window, sliding-log, sliding-window, token-bucket or leaky-bucket`}},
		{"algorithm not a string", head + "    algorithm: [token-bucket]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:4:16: descriptors[0] "k": algorithm must be a string, not a list`}},
		{"algorithm without rate_limit", head + "    algorithm: token-bucket\n",
			[]string{`f.yaml:4:16: descriptors[0] "k": algorithm needs a rate_limit beside it`}},
		{"burst without rate_limit", head + "    burst: 5\n",
			[]string{`f.yaml:4:12: descriptors[0] "k": burst needs a rate_limit beside it`}},
		{"burst without algorithm", head + "    burst: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:4:12: descriptors[0] "k": burst needs algorithm: token-bucket or leaky-bucket beside it`}},
		{"burst of a window", head + "    algorithm: sliding-window\n    burst: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:5:12: descriptors[0] "k": algorithm sliding-window: burst 5 has no meaning for sliding-window`}},
		{"negative burst", head + "    algorithm: token-bucket\n    burst: -1\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:5:12: descriptors[0] "k": burst -1 must be an integer from 0 to 9007199254740992`}},
		{"fractional burst", head + "    algorithm: token-bucket\n    burst: 1.5\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{`f.yaml:5:12: descriptors[0] "k": burst 1.5 is a floating-point number`}},
		{"bucket too deep", head + "    algorithm: token-bucket\n    burst: 9007199254740992\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
			[]string{`f.yaml:5:12: descriptors[0] "k": algorithm token-bucket: burst 9007199254740992 × period 8760h0m0s / limit 1 is over 285 years`}},
		{"zero limit", head + "    algorithm: token-bucket\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
			[]string{`f.yaml:5:51: descriptors[0] "k": algorithm token-bucket: rate_limit.requests_per_unit (the limit) 0 must be > 0`}},
		{"no limit", head + "    algorithm: fixed-window\n    rate_limit: {unit: second}\n",
			[]string{`f.yaml:4:16: descriptors[0] "k": algorithm fixed-window: rate_limit.requests_per_unit (the limit) 0 must be > 0`}},
		{"unlimited", head + "    algorithm: token-bucket\n    burst: 3\n    rate_limit: {unlimited: true}\n",
			[]string{`f.yaml:4:16: descriptors[0] "k": algorithm has no meaning with rate_limit.unlimited: true`, `f.yaml:5:12: descriptors[0] "k": burst has no meaning with rate_limit.unlimited: true`}},
		{"inside rate_limit", head + "    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token-bucket}\n",
			[]string{`f.yaml:4:54: descriptors[0] "k": algorithm belongs in a descriptor, beside rate_limit, not in rate_limit`}},
		{"at the top", "domain: d\nburst: 3\n",
			[]string{`f.yaml:2:1: burst belongs in a descriptor, beside rate_limit, not in the top level`}},
	} {
		t.Run(tc.name, func(t *testing.T) { parseErr(t, tc.src, tc.want...) })
	}
	_, err := Parse([]byte(head+"    algorithm: token-bucket\n    rate_limit: {unit: second, requests_per_unit: 0}\n"), "f.yaml")
	if !errors.Is(err, sluice.ErrInvalidPolicy) {
		t.Errorf("a Validate error does not wrap sluice.ErrInvalidPolicy: %v", err)
	}
}

// The extension's fields are unknown to the reference, so a file with them is sluice's own;
// a file without them is read as the reference reads it (the fixtures above). This checks that
// the fixture really is read by Load, from a path, like any other.
func TestExtensionFixtureLoads(t *testing.T) {
	path := filepath.Join("testdata", "sluice_extension.yaml")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(path); err != nil || len(c.Warnings()) != 0 {
		t.Fatalf("%v, %v", err, c.Warnings())
	}
}
