package envoyconf

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
)

// The tests in this file port the reference service's own configuration tests
// (test/config/config_test.go there) and run them on its fixtures, copied into testdata/: each
// says which test it mirrors. Where that test checks a statistic's name, the port checks the
// limit found and Rule (which names the rule as the statistic does, without request values).

func load(t *testing.T, files ...string) *Config {
	t.Helper()
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join("testdata", f)
	}
	c, err := Load(paths...)
	if err != nil {
		t.Fatalf("Load(%v): %v", files, err)
	}
	return c
}

// kv builds a descriptor from key, value, key, value, ...
func kv(pairs ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(pairs); i += 2 {
		es = append(es, Entry{pairs[i], pairs[i+1]})
	}
	return es
}

// want checks a match's limit: requests per unit, unit and rule.
func want(t *testing.T, c *Config, domain string, entries []Entry, rpu uint32, unit Unit, rule string) Match {
	t.Helper()
	m, ok := c.Match(domain, entries, nil)
	if !ok {
		t.Fatalf("Match(%s, %v): no match, want %d per %v (%s)", domain, entries, rpu, unit, rule)
	}
	if m.RequestsPerUnit != rpu || m.Unit != unit || m.Rule != rule {
		t.Fatalf("Match(%s, %v) = %d per %v (%s), want %d per %v (%s)", domain, entries, m.RequestsPerUnit, m.Unit, m.Rule, rpu, unit, rule)
	}
	if !m.Unlimited {
		wantPol := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: int64(rpu), Period: unit.Duration()}
		if m.Policy != wantPol {
			t.Fatalf("Match(%s, %v).Policy = %+v, want %+v", domain, entries, m.Policy, wantPol)
		}
		if rpu > 0 {
			if err := m.Policy.Validate(); err != nil {
				t.Fatalf("Match(%s, %v).Policy: %v", domain, entries, err)
			}
		}
	}
	return m
}

func none(t *testing.T, c *Config, domain string, entries []Entry) {
	t.Helper()
	if m, ok := c.Match(domain, entries, nil); ok {
		t.Fatalf("Match(%s, %v) = %+v, want no match", domain, entries, m)
	}
}

// Mirrors TestBasicConfig.
func TestBasicConfig(t *testing.T) {
	c := load(t, "basic_config.yaml")
	if got := c.Domains(); len(got) != 1 || got[0] != "test-domain" {
		t.Fatalf("Domains() = %v", got)
	}
	none(t, c, "foo_domain", nil)
	none(t, c, "test-domain", nil)
	none(t, c, "test-domain", kv("key1", "something"))
	none(t, c, "test-domain", kv("key1", "value1"))                        // a level with no limit of its own
	none(t, c, "test-domain", kv("key2", "value2", "subkey", "subvalue"))  // longer than the rule
	none(t, c, "test-domain", kv("key5", "value5", "subkey5", "subvalue")) // no such value, no value-less key
	want(t, c, "test-domain", kv("key1", "value1", "subkey1", "something"), 5, Second, "test-domain/key1=value1/subkey1")
	want(t, c, "test-domain", kv("key1", "value1", "subkey1", "subvalue1"), 10, Second, "test-domain/key1=value1/subkey1=subvalue1")
	want(t, c, "test-domain", kv("key2", "something"), 20, Minute, "test-domain/key2")
	want(t, c, "test-domain", kv("key2", "value2"), 30, Minute, "test-domain/key2=value2")
	none(t, c, "test-domain", kv("key2", "value3")) // the value without a limit: exempt
	m := want(t, c, "test-domain", kv("key3", "foo"), 1, Hour, "test-domain/key3")
	if m.Name != "" {
		t.Errorf("key3: Name = %q, want none", m.Name)
	}
	m = want(t, c, "test-domain", kv("key4", "foo"), 1, Day, "test-domain/key4")
	if m.Name != "key4_rate_limit" {
		t.Errorf("key4: Name = %q, want key4_rate_limit", m.Name)
	}
	m, ok := c.Match("test-domain", kv("key6", "foo"), nil)
	if !ok || !m.Unlimited || m.Key != "" {
		t.Errorf("key6: %+v, %v; want unlimited, no key", m, ok)
	}
	// detailed_metric: the reference names the statistic with the request's value; sluice keeps
	// Rule to configured values and reports the flag.
	m = want(t, c, "test-domain", kv("key7", "unspecified_value"), 70, Minute, "test-domain/key7")
	if !m.DetailedMetric {
		t.Error("key7: DetailedMetric false")
	}
	m2 := want(t, c, "test-domain", kv("key7", "another_value"), 70, Minute, "test-domain/key7")
	if m2.Key == m.Key {
		t.Error("key7: two values share a counter; a value-less key counts each value apart")
	}
	// 5 per day at key5=value5, 25 per day one level down.
	want(t, c, "test-domain", kv("key5", "value5"), 15, Day, "test-domain/key5=value5")
	want(t, c, "test-domain", kv("key5", "value5", "subkey5", "subvalue5"), 25, Day, "test-domain/key5=value5/subkey5=subvalue5")
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %v", w)
	}
}

// Mirrors TestDomainMerge: with merging (the reference's MERGE_DOMAIN_CONFIG), the descriptors
// of two files of one domain are put together.
func TestDomainMerge(t *testing.T) {
	var cfgs []*Config
	for _, f := range []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"} {
		cfgs = append(cfgs, load(t, f))
	}
	c, err := MergeDomains(cfgs...)
	if err != nil {
		t.Fatal(err)
	}
	none(t, c, "foo_domain", nil)
	none(t, c, "test-domain", nil)
	want(t, c, "test-domain", kv("key1", "value1"), 10, Minute, "test-domain/key1=value1")
	want(t, c, "test-domain", kv("key2", "value2"), 20, Minute, "test-domain/key2=value2")
	// The inputs are left as they were.
	none(t, cfgs[0], "test-domain", kv("key2", "value2"))

	// Without merging, the same files are an error naming both.
	_, err = Load(filepath.Join("testdata", "merge_domain_key1.yaml"), filepath.Join("testdata", "merge_domain_key2.yaml"))
	wantErrors(t, err, `merge_domain_key2.yaml:2:9: domain "test-domain" is also the domain of testdata/merge_domain_key1.yaml (line 2)`)
}

// Mirrors TestDuplicateKeyDomainMerge.
func TestDuplicateKeyDomainMerge(t *testing.T) {
	a, b := load(t, "merge_domain_key1.yaml"), load(t, "merge_domain_key1.yaml")
	_, err := MergeDomains(a, b)
	wantErrors(t, err, `merge_domain_key1.yaml:5:5: descriptor "key1=value1" is already defined in testdata/merge_domain_key1.yaml (line 5): duplicate descriptor composite key "test-domain.key1_value1"`)
}

// Mirrors TestConfigLimitOverride: a request's own limit applies whatever the rule says, with
// the request's own values in the counter.
func TestConfigLimitOverride(t *testing.T) {
	c := load(t, "basic_config.yaml")
	day := &Override{RequestsPerUnit: 10, Unit: Day}
	if m, ok := c.Match("foo_domain", nil, day); ok {
		t.Fatalf("override in an unknown domain: %+v", m)
	}
	entries := kv("key1", "value1", "subkey1", "something")
	m, ok := c.Match("test-domain", entries, day)
	if !ok || !m.Override || m.RequestsPerUnit != 10 || m.Unit != Day || m.ShadowMode || m.Name != "" {
		t.Fatalf("override: %+v, %v", m, ok)
	}
	if want := (sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10, Period: 24 * time.Hour}); m.Policy != want {
		t.Fatalf("override policy %+v, want %+v", m.Policy, want)
	}
	if m.Rule != "test-domain/key1=value1/subkey1 (override)" {
		t.Errorf("override rule %q", m.Rule)
	}
	hour := &Override{RequestsPerUnit: 42, Unit: Hour}
	m2, _ := c.Match("test-domain", entries, hour)
	if m2.RequestsPerUnit != 42 || m2.Unit != Hour {
		t.Fatalf("second override: %+v", m2)
	}
	// Different value creates a different counter.
	m3, _ := c.Match("test-domain", kv("key1", "value1", "subkey1", "something_else"), hour)
	if m3.Key == m2.Key {
		t.Error("two values share an override's counter")
	}
	// The same override on the same entries shares one.
	if again, _ := c.Match("test-domain", kv("key1", "value1", "subkey1", "something"), hour); again.Key != m2.Key {
		t.Error("one override on one descriptor: two counters")
	}
}

// wantErrors checks that err is config.Errors whose lines are exactly want, in order, each
// matched as a suffix of the file name onward (so that the directory may differ).
func wantErrors(t *testing.T, err error, want ...string) config.Errors {
	t.Helper()
	var es config.Errors
	if !errors.As(err, &es) {
		t.Fatalf("error %v (%T), want config.Errors", err, err)
	}
	if len(es) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(es), len(want), err)
	}
	for i, e := range es {
		if !strings.Contains(e.Error(), want[i]) {
			t.Errorf("error %d:\n got %s\nwant %s", i, e.Error(), want[i])
		}
	}
	return es
}

// Mirror TestEmptyDomain, TestDuplicateDomain, TestEmptyKey, TestDuplicateKey, TestBadLimitUnit,
// TestReplacesSelf, TestReplacesEmpty, TestBadYaml, TestMisspelledKey, TestNonStringKey,
// TestNonMapList and TestUnlimitedWithRateLimitUnit: each file is refused, with the reference's
// reason (its message quoted in the comment), at its line and column.
func TestRefusedFixtures(t *testing.T) {
	for _, tc := range []struct {
		files []string
		want  string
	}{
		// "config file cannot have empty domain"
		{[]string{"empty_domain.yaml"}, "empty_domain.yaml:1:1: domain is required"},
		// "duplicate domain 'test-domain' in config file"
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, `duplicate_domain.yaml:1:9: domain "test-domain" is also the domain of testdata/basic_config.yaml (line 2)`},
		// "descriptor has empty key"
		{[]string{"empty_key.yaml"}, "empty_key.yaml:3:5: descriptors[0]: key is required"},
		// "duplicate descriptor composite key 'test-domain.key1_value1'"
		{[]string{"duplicate_key.yaml"}, `duplicate_key.yaml:6:5: descriptors[1] "key1=value1": descriptor "key1=value1" is already defined at this level (line 3): duplicate descriptor composite key "test-domain.key1_value1"`},
		// "invalid rate limit unit 'foo'"
		{[]string{"bad_limit_unit.yaml"}, `bad_limit_unit.yaml:6:13: descriptors[0] "key1=value1": rate_limit.unit "foo" is not a unit`},
		// "replaces should not contain name of same descriptor"
		{[]string{"replaces_self.yaml"}, `replaces_self.yaml:10:15: descriptors[0] "key1=value1" > descriptors[0] "subkey1": rate_limit.replaces[0].name "self" is this limit's own name`},
		// "should not have an empty replaces entry"
		{[]string{"replaces_empty.yaml"}, `replaces_empty.yaml:10:15: descriptors[0] "key1=value1" > descriptors[0] "subkey1": rate_limit.replaces[0].name is empty`},
		// "error loading config file: yaml: line 2: found unexpected end of stream"
		{[]string{"bad_yaml.yaml"}, "bad_yaml.yaml:2: YAML: found unexpected end of stream"},
		// "config error, unknown key 'ratelimit'"
		{[]string{"misspelled_key.yaml"}, `misspelled_key.yaml:5:5: descriptors[0] "key1=value1": unknown field "ratelimit"; did you mean "rate_limit"?`},
		// "config error, unknown key 'requestsperunit'"
		{[]string{"misspelled_key2.yaml"}, `misspelled_key2.yaml:7:7: descriptors[0] "key1=value1": unknown field "requestsperunit"; did you mean "requests_per_unit"?`},
		// "should not specify rate limit unit when unlimited"
		{[]string{"unlimited_with_unit.yaml"}, "unlimited_with_unit.yaml:6:13: descriptors[0] \"foo\": rate_limit.unit must not be set with unlimited: true"},
	} {
		paths := make([]string, len(tc.files))
		for i, f := range tc.files {
			paths[i] = filepath.Join("testdata", f)
		}
		c, err := Load(paths...)
		if c != nil {
			t.Errorf("%v: a Config with the error", tc.files)
		}
		es := wantErrors(t, err, tc.want)
		if es[0].File != paths[len(paths)-1] {
			t.Errorf("%v: error in %s", tc.files, es[0].File)
		}
	}

	// "config error, key is not of type string: 0.25": the key, and the missing domain.
	_, err := Load(filepath.Join("testdata", "non_string_key.yaml"))
	wantErrors(t, err, "non_string_key.yaml:1:1: key 0.25 is not a field name (keys must be strings)", "non_string_key.yaml:1:1: domain is required")
	// "config error, yaml file contains list of type other than map: a": non_map_list has three
	// items, each refused.
	_, err = Load(filepath.Join("testdata", "non_map_list.yaml"))
	wantErrors(t, err, `non_map_list.yaml:3:5: descriptors[0] must be a mapping (field: value), not "a"`, `4:5: descriptors[1] must be a mapping`, `5:5: descriptors[2] must be a mapping`)
}

// Mirrors TestShadowModeConfig.
func TestShadowModeConfig(t *testing.T) {
	c := load(t, "shadowmode_config.yaml")
	for _, tc := range []struct {
		entries []Entry
		rpu     uint32
		unit    Unit
		rule    string
		shadow  bool
	}{
		{kv("key1", "value1", "subkey1", "something"), 5, Second, "test-domain/key1=value1/subkey1", false},
		{kv("key1", "value1", "subkey1", "subvalue1"), 10, Second, "test-domain/key1=value1/subkey1=subvalue1", true},
		{kv("key2", "something"), 20, Minute, "test-domain/key2", true},
		{kv("key2", "value2"), 30, Minute, "test-domain/key2=value2", false},
	} {
		m := want(t, c, "test-domain", tc.entries, tc.rpu, tc.unit, tc.rule)
		if m.ShadowMode != tc.shadow {
			t.Errorf("%v: ShadowMode %v, want %v", tc.entries, m.ShadowMode, tc.shadow)
		}
	}
}

// Mirrors TestWildcardConfig: trailing, middle and several '*'; values that match one pattern
// share its rule, and each value counts apart.
func TestWildcardConfig(t *testing.T) {
	c := load(t, "wildcard.yaml")
	// Baseline: a value-less key matches every value.
	v1 := want(t, c, "test-domain", kv("noVal", "foo1"), 20, Minute, "test-domain/noVal")
	v2 := want(t, c, "test-domain", kv("noVal", "foo2"), 20, Minute, "test-domain/noVal")
	if v1.Key == v2.Key {
		t.Error("noVal: two values share a counter")
	}
	w1 := want(t, c, "test-domain", kv("wild", "foo1"), 20, Minute, "test-domain/wild=foo*")
	w2 := want(t, c, "test-domain", kv("wild", "foo2"), 20, Minute, "test-domain/wild=foo*")
	if w1.Key == w2.Key {
		t.Error("wild: two values share a counter without share_threshold")
	}
	want(t, c, "test-domain", kv("nestedWild", "val1", "wild", "goo2"), 20, Minute, "test-domain/nestedWild=val1/wild=goo*")
	none(t, c, "test-domain", kv("wild", "bar"))
	none(t, c, "test-domain", kv("noWild", "foo1")) // a value without '*' matches only itself
	want(t, c, "test-domain", kv("noWild", "foo"), 20, Minute, "test-domain/noWild=foo")
	for _, v := range []string{"barab", "bar123b", "barb"} { // '*' matches the empty run too
		want(t, c, "test-domain", kv("midWild", v), 20, Minute, "test-domain/midWild=bar*b")
	}
	none(t, c, "test-domain", kv("midWild", "bara"))
	none(t, c, "test-domain", kv("midWild", "xbarb"))
	for _, v := range []string{"foo123bar456baz", "foobarbaz"} {
		want(t, c, "test-domain", kv("multiWild", v), 10, Minute, "test-domain/multiWild=foo*bar*baz")
	}
	none(t, c, "test-domain", kv("multiWild", "foo123baz"))
	none(t, c, "test-domain", kv("multiWild", "bar456baz"))
}

// Mirrors TestDetailedMetric's configurations (there checked by statistic name): the limit
// found, and the flag.
func TestDetailedMetric(t *testing.T) {
	c, err := Parse([]byte(`
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    detailed_metric: true
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 100, unit: minute}
`), "inline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := want(t, c, "nested", kv("key_1", "value-for-key-1"), 500, Minute, "nested/key_1")
	if !m.DetailedMetric {
		t.Error("key_1: DetailedMetric false")
	}
	want(t, c, "nested", kv("key_1", "some-value-for-key-1"), 500, Minute, "nested/key_1=some-value-for-key-1")
	want(t, c, "nested", kv("key_2", "key-2-value"), 5000, Minute, "nested/key_2")
	want(t, c, "nested", kv("key_2", "key-2-value", "key_3", "requested-key3-value"), 5, Minute, "nested/key_2/key_3=requested-key3-value")
	want(t, c, "nested", kv("key_2", "specific-id", "key_3", "requested-key3-value"), 100, Minute, "nested/key_2=specific-id/key_3=requested-key3-value")
	none(t, c, "nested", kv("key_2", "specific-id", "key_3", "other")) // key_3 without a value has no limit
}

// Mirrors TestShareThreshold (and TestGenerateCacheKeysWithShareThreshold, which checks the
// counters' keys): with share_threshold, every value that matches the wildcard shares one
// counter; without it, each value has its own; an exact value has its own.
func TestShareThreshold(t *testing.T) {
	c := load(t, "share_threshold.yaml")
	same := func(name string, ms ...Match) {
		t.Helper()
		for _, m := range ms[1:] {
			if m.Key != ms[0].Key {
				t.Errorf("%s: %s and %s are two counters, want one", name, ms[0].Key, m.Key)
			}
		}
	}
	var ms []Match
	for _, v := range []string{"files/a.pdf", "files/b.csv", "files/c.txt", "files/subdir/f.txt"} {
		ms = append(ms, want(t, c, "test-domain", kv("files", v), 100, Minute, "test-domain/files=files/*"))
	}
	same("files/*", ms...)

	same("route=api/* with value_to_metric",
		want(t, c, "test-domain", kv("route", "api/v1", "method", "GET"), 60, Minute, "test-domain/route=api/*/method"),
		want(t, c, "test-domain", kv("route", "api/v2", "method", "GET"), 60, Minute, "test-domain/route=api/*/method"))
	m1 := want(t, c, "test-domain", kv("route", "api/v1", "method", "GET"), 60, Minute, "test-domain/route=api/*/method")
	m2 := want(t, c, "test-domain", kv("route", "api/v1", "method", "POST"), 60, Minute, "test-domain/route=api/*/method")
	if m1.Key == m2.Key {
		t.Error("route: the value-less method level shares a counter across methods")
	}
	d := want(t, c, "test-domain", kv("service", "svc/user", "endpoint", "get"), 80, Minute, "test-domain/service=svc/*/endpoint")
	if !d.DetailedMetric {
		t.Error("service/endpoint: DetailedMetric false")
	}

	same("nested/*",
		want(t, c, "test-domain", kv("nested", "parent", "files", "nested/file1.txt"), 200, Minute, "test-domain/nested=parent/files=nested/*"),
		want(t, c, "test-domain", kv("nested", "parent", "files", "nested/file2.csv"), 200, Minute, "test-domain/nested=parent/files=nested/*"))
	same("top/* then nested/*",
		want(t, c, "test-domain", kv("files", "top/file1.txt", "files", "nested/sub1.txt"), 300, Minute, "test-domain/files=top/*/files=nested/*"),
		want(t, c, "test-domain", kv("files", "top/file2.pdf", "files", "nested/sub2.csv"), 300, Minute, "test-domain/files=top/*/files=nested/*"))

	// Parent shares, the child wildcard does not: one counter per child value.
	p1 := want(t, c, "test-domain", kv("path", "path/foo", "file", "file/doc1", "type", "pdf"), 120, Minute, "test-domain/path=path/*/file=file/*/type")
	p2 := want(t, c, "test-domain", kv("path", "path/bar", "file", "file/doc1", "type", "pdf"), 120, Minute, "test-domain/path=path/*/file=file/*/type")
	p3 := want(t, c, "test-domain", kv("path", "path/foo", "file", "file/doc2", "type", "pdf"), 120, Minute, "test-domain/path=path/*/file=file/*/type")
	same("path/* shared", p1, p2)
	if p1.Key == p3.Key {
		t.Error("file/* without share_threshold shares a counter across values")
	}
	same("user/* and res/*",
		want(t, c, "test-domain", kv("user", "user/alice", "resource", "res/file1", "action", "read"), 150, Minute, "test-domain/user=user/*/resource=res/*/action"),
		want(t, c, "test-domain", kv("user", "user/bob", "resource", "res/file2", "action", "read"), 150, Minute, "test-domain/user=user/*/resource=res/*/action"))

	// An exact value takes precedence over the wildcard and has its own counter.
	t1 := want(t, c, "test-domain", kv("file", "test1"), 50, Minute, "test-domain/file=test1")
	var tw []Match
	for _, v := range []string{"test2", "test23", "test123"} {
		tw = append(tw, want(t, c, "test-domain", kv("file", v), 100, Minute, "test-domain/file=test*"))
	}
	same("test*", tw...)
	if t1.Key == tw[0].Key {
		t.Error("file=test1 shares the wildcard's counter")
	}

	var mid []Match
	for _, v := range []string{"/api/v1", "/api-beta-v1", "/apiXYZv1"} {
		mid = append(mid, want(t, c, "test-domain", kv("midpath", v), 100, Minute, "test-domain/midpath=/api*v1"))
	}
	same("/api*v1", mid...)
	none(t, c, "test-domain", kv("midpath", "/api/v2"))
	var multi []Match
	for _, v := range []string{"svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"} {
		multi = append(multi, want(t, c, "test-domain", kv("multiroute", v), 50, Minute, "test-domain/multiroute=svc*ep*rpc"))
	}
	same("svc*ep*rpc", multi...)
	none(t, c, "test-domain", kv("multiroute", "svcABCrpc"))
	same("/api*v2",
		want(t, c, "test-domain", kv("midroute", "/api/v2"), 80, Minute, "test-domain/midroute=/api*v2"),
		want(t, c, "test-domain", kv("midroute", "/api-beta-v2"), 80, Minute, "test-domain/midroute=/api*v2"))
	same("t*prod and res*v2",
		want(t, c, "test-domain", kv("tenant", "t1prod", "resource", "resAv2"), 60, Minute, "test-domain/tenant=t*prod/resource=res*v2"),
		want(t, c, "test-domain", kv("tenant", "t99prod", "resource", "resBBBv2"), 60, Minute, "test-domain/tenant=t*prod/resource=res*v2"))
}

// Mirrors TestMetadata.
func TestMetadata(t *testing.T) {
	c := load(t, "metadata.yaml")
	none(t, c, "test-domain", nil)
	m := want(t, c, "test-domain", kv("key1", "value1", "subkey1", "something"), 5, Second, "test-domain/key1=value1/subkey1")
	if m.Metadata["name"] != "service_1" {
		t.Errorf("metadata %v", m.Metadata)
	}
	m = want(t, c, "test-domain", kv("key2", "something"), 20, Minute, "test-domain/key2")
	inner, _ := m.Metadata["service_with_quota"].(map[string]any)
	if inner["name"] != "service_2" {
		t.Errorf("metadata %v", m.Metadata)
	}
	m = want(t, c, "test-domain", kv("key1", "value1", "subkey1", "subvalue1"), 10, Second, "test-domain/key1=value1/subkey1=subvalue1")
	if m.Metadata != nil {
		t.Errorf("metadata %v, want none", m.Metadata)
	}
}

// Mirrors the reference's example configuration and its replaces integration test
// (integration-test/scripts/replaces.sh), and its service tests of unlimited and quota mode.
func TestExampleReplaces(t *testing.T) {
	c := load(t, "example.yaml")
	match := func(entries ...[]Entry) []Match {
		ms := make([]Match, len(entries))
		for i, e := range entries {
			ms[i], _ = c.Match("rl", e, nil)
		}
		return ms
	}
	// (foo, bar=banned) is banned_limit, 0 a minute: every request is over it.
	banned := kv("foo", "bkthomps", "bar", "banned")
	ms := match(banned)
	if ms[0].Name != "banned_limit" || ms[0].RequestsPerUnit != 0 {
		t.Fatalf("banned: %+v", ms[0])
	}
	if r := Replaced(ms); r[0] {
		t.Error("banned replaced on its own")
	}
	// With (source_cluster=proxy, destination_cluster=mock): still banned.
	if r := Replaced(match(banned, kv("source_cluster", "proxy", "destination_cluster", "mock"))); r[0] || r[1] {
		t.Errorf("mock: replaced %v", r)
	}
	// (source_cluster=proxy, destination_cluster=override) replaces banned_limit: 2 a minute.
	ms = match(banned, kv("source_cluster", "proxy", "destination_cluster", "override"))
	if r := Replaced(ms); !r[0] || r[1] || ms[1].RequestsPerUnit != 2 {
		t.Errorf("override: replaced %v, %+v", r, ms[1])
	}
	// One match replaces two limits (bkthomps and fake_name) at once.
	ms = match(kv("foo", "my_foo", "bar", "bkthomps"), kv("source_cluster", "proxy", "destination_cluster", "fake"), kv("category", "account"))
	if r := Replaced(ms); !r[0] || !r[1] || r[2] || ms[2].RequestsPerUnit != 4 {
		t.Errorf("category=account: replaced %v", r)
	}
	// A replacing limit and the one it replaces may both have names; each match is counted
	// unless another match of the same request replaces it.
	ms = match(kv("foo", "my_foo", "bar", "bkthomps"), kv("source_cluster", "proxy", "destination_cluster", "bkthomps"))
	if r := Replaced(ms); !r[0] || r[1] {
		t.Errorf("destination_cluster=bkthomps: replaced %v", r)
	}
	// Alone, bkthomps (1 a minute) applies.
	if r := Replaced(match(kv("foo", "foo_2", "bar", "bkthomps"))); r[0] {
		t.Error("bkthomps replaced with no replacing match")
	}

	// Unlimited (bay, qux) and quota mode (service).
	u, ok := c.Match("rl", kv("qux", "anything"), nil)
	if !ok || !u.Unlimited {
		t.Errorf("qux: %+v", u)
	}
	u, ok = c.Match("rl", kv("foo", "x", "bay", "y"), nil)
	if !ok || !u.Unlimited {
		t.Errorf("foo/bay: %+v", u)
	}
	q := want(t, c, "rl", kv("service", "service_1"), 1, Minute, "rl/service=service_1")
	if !q.QuotaMode || q.Metadata == nil {
		t.Errorf("service_1: %+v", q)
	}
	s := want(t, c, "rl", kv("foo", "x", "baz", "shady"), 3, Minute, "rl/foo/baz=shady")
	if !s.ShadowMode {
		t.Error("baz=shady: ShadowMode false")
	}
	// The file starts with "---": one document, read.
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("warnings %v", w)
	}
}

// The reference collects the names replaced by every limit the request matched, unlimited ones
// included, and drops every named limit in that set (service/ratelimit.go there).
func TestReplacedRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		ms   []Match
		want []bool
	}{
		{"none", []Match{{Name: "a"}, {}}, []bool{false, false}},
		{"one", []Match{{Name: "a"}, {Replaces: []string{"a"}}}, []bool{true, false}},
		{"each other", []Match{{Name: "a", Replaces: []string{"b"}}, {Name: "b", Replaces: []string{"a"}}}, []bool{true, true}},
		{"by an unlimited", []Match{{Name: "a"}, {Unlimited: true, Replaces: []string{"a"}}}, []bool{true, false}},
		{"an unlimited is not", []Match{{Name: "a", Unlimited: true}, {Replaces: []string{"a"}}}, []bool{false, false}},
		{"nameless", []Match{{}, {Replaces: []string{""}}}, []bool{false, false}},
		{"all with the name", []Match{{Name: "a"}, {Name: "a"}, {Replaces: []string{"a"}}}, []bool{true, true, false}},
		{"empty", nil, []bool{}},
	} {
		got := Replaced(tc.ms)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %v", tc.name, got)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%s: Replaced = %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}

// Units: the reference's dividers (utilities.go there), case-insensitive names, week numbered
// after year as in Envoy's enumeration.
func TestUnits(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name string
		unit Unit
		num  int32
		d    time.Duration
	}{
		{"second", Second, 1, time.Second}, {"MINUTE", Minute, 2, time.Minute}, {"Hour", Hour, 3, time.Hour},
		{"day", Day, 4, day}, {"month", Month, 5, 30 * day}, {"year", Year, 6, 365 * day}, {"week", Week, 7, 7 * day},
	} {
		u, ok := parseUnit(tc.name)
		if !ok || u != tc.unit || int32(u) != tc.num || u.Duration() != tc.d || !u.Valid() {
			t.Errorf("%s: %v %v (%d, %v)", tc.name, u, ok, int32(u), u.Duration())
		}
		c, err := Parse([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.name+", requests_per_unit: 3}\n"), "u.yaml")
		if err != nil {
			t.Fatal(err)
		}
		want(t, c, "d", kv("k", "v"), 3, tc.unit, "d/k")
	}
	for _, s := range []string{"unknown", "", "seconds", "ms"} {
		if u, ok := parseUnit(s); ok {
			t.Errorf("%q is unit %v", s, u)
		}
	}
	if UnknownUnit.Valid() || Unit(8).Valid() || Unit(8).Duration() != 0 || Unit(9).String() != "Unit(9)" {
		t.Error("invalid units")
	}
}
