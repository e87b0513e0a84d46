package envoyconf

import (
	"regexp"
	"strings"
	"testing"
)

// keyCase is a request descriptor and the reference's counter key for it, derived by hand from
// its cache key generator (limiter/cache_key.go there: the domain, then each entry's key and
// value, a share_threshold entry's wildcard in place of its value, then the window's start,
// written here as the unit).
type keyCase struct {
	entries []Entry
	peer    string
}

// checkSharing asserts that two cases share Match.Key exactly when their reference keys are
// equal.
func checkSharing(t *testing.T, c *Config, domain string, cases []keyCase) {
	t.Helper()
	keys := make([]string, len(cases))
	for i, tc := range cases {
		m, ok := c.Match(domain, tc.entries, nil)
		if !ok || m.Key == "" {
			t.Fatalf("%v: no counter (%+v)", tc.entries, m)
		}
		keys[i] = m.Key
	}
	for i := range cases {
		for j := range cases {
			if (keys[i] == keys[j]) != (cases[i].peer == cases[j].peer) {
				t.Errorf("%v and %v: keys %s, %s; the reference's %s, %s", cases[i].entries, cases[j].entries, keys[i], keys[j], cases[i].peer, cases[j].peer)
			}
		}
	}
}

// Exact values, value-less keys (one counter per value) and levels.
func TestKeysShareAsTheReference(t *testing.T) {
	checkSharing(t, load(t, "basic_config.yaml"), "test-domain", []keyCase{
		{kv("key1", "value1", "subkey1", "a"), "test-domain_key1_value1_subkey1_a_/second"},
		{kv("key1", "value1", "subkey1", "a"), "test-domain_key1_value1_subkey1_a_/second"},
		{kv("key1", "value1", "subkey1", "b"), "test-domain_key1_value1_subkey1_b_/second"},
		{kv("key1", "value1", "subkey1", "subvalue1"), "test-domain_key1_value1_subkey1_subvalue1_/second"},
		{kv("key2", "a"), "test-domain_key2_a_/minute"},
		{kv("key2", "b"), "test-domain_key2_b_/minute"},
		{kv("key2", "value2"), "test-domain_key2_value2_/minute"},
		{kv("key3", "a"), "test-domain_key3_a_/hour"},
		{kv("key5", "value5"), "test-domain_key5_value5_/day"},
		{kv("key5", "value5", "subkey5", "subvalue5"), "test-domain_key5_value5_subkey5_subvalue5_/day"},
		{kv("key7", "a"), "test-domain_key7_a_/minute"},
	})
	// Wildcards without share_threshold: one counter per value.
	checkSharing(t, load(t, "wildcard.yaml"), "test-domain", []keyCase{
		{kv("wild", "foo1"), "test-domain_wild_foo1_/minute"},
		{kv("wild", "foo2"), "test-domain_wild_foo2_/minute"},
		{kv("wild", "foo1"), "test-domain_wild_foo1_/minute"},
		{kv("midWild", "barab"), "test-domain_midWild_barab_/minute"},
		{kv("multiWild", "foobarbaz"), "test-domain_multiWild_foobarbaz_/minute"},
		{kv("nestedWild", "val1", "wild", "goo2"), "test-domain_nestedWild_val1_wild_goo2_/minute"},
		{kv("noVal", "foo1"), "test-domain_noVal_foo1_/minute"},
	})
	// share_threshold: the wildcard stands for the value, per entry.
	checkSharing(t, load(t, "share_threshold.yaml"), "test-domain", []keyCase{
		{kv("files", "files/a.pdf"), "test-domain_files_files/*_/minute"},
		{kv("files", "files/b.csv"), "test-domain_files_files/*_/minute"},
		{kv("files", "files/*"), "test-domain_files_files/*_/minute"}, // the pattern itself, matched exactly
		{kv("nested", "parent", "files", "nested/1"), "test-domain_nested_parent_files_nested/*_/minute"},
		{kv("nested", "parent", "files", "nested/2"), "test-domain_nested_parent_files_nested/*_/minute"},
		{kv("files", "top/1", "files", "nested/1"), "test-domain_files_top/*_files_nested/*_/minute"},
		{kv("files", "top/2", "files", "nested/2"), "test-domain_files_top/*_files_nested/*_/minute"},
		{kv("route", "api/v1", "method", "GET"), "test-domain_route_api/*_method_GET_/minute"},
		{kv("route", "api/v2", "method", "GET"), "test-domain_route_api/*_method_GET_/minute"},
		{kv("route", "api/v2", "method", "PUT"), "test-domain_route_api/*_method_PUT_/minute"},
		{kv("path", "path/a", "file", "file/x", "type", "pdf"), "test-domain_path_path/*_file_file/x_type_pdf_/minute"},
		{kv("path", "path/b", "file", "file/x", "type", "pdf"), "test-domain_path_path/*_file_file/x_type_pdf_/minute"},
		{kv("path", "path/b", "file", "file/y", "type", "pdf"), "test-domain_path_path/*_file_file/y_type_pdf_/minute"},
		{kv("file", "test1"), "test-domain_file_test1_/minute"},
		{kv("file", "test2"), "test-domain_file_test*_/minute"},
		{kv("file", "test23"), "test-domain_file_test*_/minute"},
		{kv("tenant", "t1prod", "resource", "resAv2"), "test-domain_tenant_t*prod_resource_res*v2_/minute"},
		{kv("tenant", "t9prod", "resource", "resBv2"), "test-domain_tenant_t*prod_resource_res*v2_/minute"},
	})
}

// An override's counter: the reference keys it by the entries and the unit's window (not by
// the limit), so requests with the same entries and unit share it. sluice also tells two limits
// apart (a counter under one limit means nothing under another: see docs/envoy.md).
func TestKeysOverride(t *testing.T) {
	c := load(t, "basic_config.yaml")
	e := kv("key2", "a")
	key := func(o *Override) string {
		m, ok := c.Match("test-domain", e, o)
		if !ok {
			t.Fatal("no match")
		}
		return m.Key
	}
	rule, _ := c.Match("test-domain", e, nil) // 20 a minute
	if key(&Override{20, Minute, 0}) != key(&Override{20, Minute, 0}) {
		t.Error("one override, two counters")
	}
	if key(&Override{20, Minute, 0}) != rule.Key {
		t.Error("an override equal to the rule's limit does not share the rule's counter")
	}
	if key(&Override{20, Hour, 0}) == rule.Key || key(&Override{20, Hour, 0}) == key(&Override{20, Day, 0}) {
		t.Error("overrides of different units share a counter")
	}
	if key(&Override{21, Minute, 0}) == rule.Key {
		t.Error("an override of another limit shares the rule's counter")
	}
	// An invalid override is ignored: the rule applies.
	if m, _ := c.Match("test-domain", e, &Override{5, UnknownUnit, 0}); m.Key != rule.Key || m.Override {
		t.Errorf("invalid override: %+v", m)
	}
	if (Override{5, UnknownUnit, 0}).Validate() == nil || (Override{5, Unit(8), 0}).Validate() == nil || (Override{0, Week, 0}).Validate() != nil {
		t.Error("Override.Validate")
	}
	// With no rule for the entries, an override still applies (in a configured domain).
	m, ok := c.Match("test-domain", kv("nothing", "here"), &Override{3, Second, 0})
	if !ok || m.Rule != "test-domain (override)" || !strings.Contains(m.Key, ":(override):") {
		t.Errorf("override without a rule: %+v", m)
	}
	// Its counter is keyed by the request's values, even where a rule would share a wildcard's.
	s := load(t, "share_threshold.yaml")
	a, _ := s.Match("test-domain", kv("files", "files/a"), &Override{3, Second, 0})
	b, _ := s.Match("test-domain", kv("files", "files/b"), &Override{3, Second, 0})
	if a.Key == b.Key {
		t.Error("an override shares a share_threshold wildcard's counter")
	}
}

// maxKeyLen is the longest a Match.Key can be: domain, rule, the hash and two colons.
const maxKeyLen = maxDomainKey + 1 + maxRuleKey + 1 + 32

var keyShape = regexp.MustCompile(`^[!-~]+:[!-~]+:[0-9a-f]{32}$`)

// No request value appears in Key or Rule, whatever the rule that matched, and a Key's length is
// bounded whatever the request.
func TestKeysHoldNoRequestValue(t *testing.T) {
	const secret = "sk_live_51HhQ2xSECRETsecret0123456789abcdef"
	c, err := Parse([]byte(`domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: bearer
    value: "sk_*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: shared
    value: "sk_*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 50}
`), "api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 10<<10) + secret
	for _, tc := range []struct {
		entries  []Entry
		override *Override
	}{
		{kv("api_key", secret), nil},
		{kv("bearer", secret), nil},
		{kv("shared", secret), nil},
		{kv("tenant", secret, "api_key", secret), nil},
		{kv("api_key", secret), &Override{1, Second, 0}},
		{kv("no-rule", secret), &Override{1, Second, 0}},
		{kv("api_key", long), nil},
		{kv("tenant", long, "api_key", long), nil},
		{kv("api_key", long), &Override{1, Second, 0}},
	} {
		m, ok := c.Match("api", tc.entries, tc.override)
		if !ok {
			t.Fatalf("%.60v: no match", tc.entries)
		}
		for _, s := range []string{m.Key, m.Rule} {
			if strings.Contains(s, "SECRET") || strings.Contains(s, "xxxxxxxx") {
				t.Errorf("%.60v: %q holds the request's value", tc.entries, s)
			}
		}
		if len(m.Key) > maxKeyLen || !keyShape.MatchString(m.Key) {
			t.Errorf("%.60v: key %q (%d bytes)", tc.entries, m.Key, len(m.Key))
		}
	}
	// The long value counts apart from the short one.
	a, _ := c.Match("api", kv("api_key", long), nil)
	b, _ := c.Match("api", kv("api_key", long+"y"), nil)
	if a.Key == b.Key {
		t.Error("two 10 KB values share a counter")
	}
}

// A configuration's own long or odd names are bounded and made printable in Key (the hash tells
// rules apart; Rule keeps them as written).
func TestKeysOfOddConfigurations(t *testing.T) {
	longValue := strings.Repeat("v", 10<<10)
	if maxKeyLen != 226 {
		t.Errorf("keys are up to %d bytes; Match.Key says 226", maxKeyLen)
	}
	longDomain := strings.Repeat("d", 1000)
	ld, err := Parse([]byte("domain: "+longDomain+"\ndescriptors:\n  - key: "+longValue+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "long.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := ld.Match(longDomain, kv(longValue, "x"), nil); !ok || len(m.Key) != maxKeyLen || !keyShape.MatchString(m.Key) {
		t.Errorf("long domain and rule: %v, key of %d bytes: %.80q", ok, len(m.Key), m.Key)
	}
	c, err := Parse([]byte("domain: \"d {x} é\"\ndescriptors:\n  - key: k\n    value: "+longValue+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: "+longValue+"w\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), "odd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, okA := c.Match("d {x} é", kv("k", longValue), nil)
	b, okB := c.Match("d {x} é", kv("k", longValue+"w"), nil)
	if !okA || !okB {
		t.Fatal("no match")
	}
	for _, m := range []Match{a, b} {
		if len(m.Key) > maxKeyLen || !keyShape.MatchString(m.Key) || strings.ContainsAny(m.Key, "{} ") {
			t.Errorf("key %q (%d bytes)", m.Key, len(m.Key))
		}
		if !strings.HasPrefix(m.Key, "d__x__") {
			t.Errorf("key %q", m.Key[:20])
		}
	}
	if a.Key == b.Key {
		t.Error("two rules whose readable names are cut alike share a counter")
	}
	if a.Rule != "d {x} é/k="+longValue {
		t.Errorf("Rule %.40q", a.Rule)
	}
}

// The reference joins an entry's key and value with '_' to look it up, so a request's (a, b)
// finds a value-less descriptor "a_b", and the two are one descriptor to it (a duplicate). Match
// looks up the same way; keys, whose encoding is unambiguous, do not confuse ("a_b", "c") with
// ("a", "b_c"), which the reference's keys do (a difference: see docs/envoy.md).
func TestUnderscoreJoin(t *testing.T) {
	c, err := Parse([]byte(`domain: d
descriptors:
  - key: a_b
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: x
    value: y_z
    rate_limit: {unit: second, requests_per_unit: 8}
`), "u.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want(t, c, "d", kv("a", "b"), 7, Second, "d/a_b")   // key_value "a_b" is the value-less a_b
	want(t, c, "d", kv("a_b", "q"), 7, Second, "d/a_b") // and a_b itself matches any value
	want(t, c, "d", kv("x_y", "z"), 8, Second, "d/x=y_z")
	m1, _ := c.Match("d", kv("x_y", "z"), nil)
	m2, _ := c.Match("d", kv("x", "y_z"), nil)
	if m1.Key == m2.Key {
		t.Error(`("x_y", "z") and ("x", "y_z") share a counter`)
	}
	_, err = Parse([]byte("domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n"), "dup.yaml")
	wantErrors(t, err, `dup.yaml:4:5: descriptors[1] "a=b": descriptor "a=b" is already defined at this level (line 3): duplicate descriptor composite key "d.a_b"`)

	// A '*' in a key makes a wildcard of key_value too, as it does in the reference.
	c, err = Parse([]byte("domain: d\ndescriptors:\n  - key: \"k*\"\n    rate_limit: {unit: second, requests_per_unit: 9}\n"), "star.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want(t, c, "d", kv("kite", "v"), 9, Second, "d/k*")
	want(t, c, "d", kv("k", "v"), 9, Second, "d/k*")
	none(t, c, "d", kv("other", "v"))
}
