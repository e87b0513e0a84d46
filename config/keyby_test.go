package config

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// pol is a policy line for key_by cases: a valid policy with the given key_by.
func pol(keyBy string) string {
	return "policies:\n  - name: p\n    algorithm: token-bucket\n    limit: 10\n    period: 1s\n    key_by: " + keyBy + "\n"
}

// key_by's errors, each at its line (a policy's key_by is at line 7 of up + pol). They join
// errorCases, so that TestErrors checks them and FuzzParse starts from them.
var keyByErrorCases = []struct {
	name string
	yaml string
	want []wantErr
}{
	{"key_by: not a list", up + pol("client"), []wantErr{at(7, `policies[0] "p": key_by must be a list, not "client"`)}},
	{"key_by: unknown attribute", up + pol("[client, tenant]"), []wantErr{at(7, `key_by[1] "tenant" is not an attribute (want client, header, query`)}},
	{"key_by: near attribute", up + pol("[remote-address, methd]"), []wantErr{at(7, `key_by[0] "remote-address" is not an attribute; did you mean "remote_address"?`), at(7, `key_by[1] "methd" is not an attribute; did you mean "method"?`)}},
	{"key_by: header without its name", up + pol("[header]"), []wantErr{at(7, "key_by[0] header needs its argument: write - header: X-Tenant")}},
	{"key_by: bad header name", up + pol("\n      - client\n      - header: \"X Tenant\""),
		[]wantErr{at(9, `policies[0] "p" key_by[1]: header "X Tenant" is not a header name`)}},
	{"key_by: empty header name", up + pol("[{header: \"\"}]"), []wantErr{at(7, "key_by[0]: header is empty")}},
	{"key_by: header null", up + pol("[{header: }]"), []wantErr{at(7, "key_by[0]: header needs a name")}},
	{"key_by: path_prefix 0", up + pol("\n      - path_prefix: 0"), []wantErr{at(8, "key_by[0]: path_prefix 0 must be from 1 to 32")}},
	{"key_by: path_prefix type", up + pol("[{path_prefix: two}]"), []wantErr{at(7, `path_prefix "two" must be an integer`)}},
	{"key_by: path_prefix too deep", up + pol("[{path_prefix: 33}]"), []wantErr{at(7, "path_prefix 33 must be from 1 to 32")}},
	{"key_by: jwt_claim without a jwt source", up + pol("\n      - jwt_claim: org"),
		[]wantErr{at(8, `key_by[0]: jwt_claim "org" is never read: identity has no jwt source`)}},
	{"key_by: the same header twice", up + pol("\n      - header: X-Tenant\n      - query: t\n      - header: x-tenant"),
		[]wantErr{at(10, "key_by[2] header X-Tenant is already in key_by at line 8")}},
	{"key_by: client twice", up + pol("[client, method, client]"), []wantErr{at(7, "key_by[2] client is already in key_by at line 7")}},
	{"key_by: path and path_prefix", up + pol("\n      - path\n      - path_prefix: 1"),
		[]wantErr{at(9, "key_by[1] path_prefix: the path already splits the counter at line 8")}},
	{"key_by: shared on an attribute every request has", up + pol("\n      - {path_prefix: 2, shared: true}"),
		[]wantErr{at(8, "shared has no meaning for path_prefix: every request has one")}},
	{"key_by: shared not a bool", up + pol("[{header: X-Tenant, shared: yes}]"), []wantErr{at(7, `shared "yes" must be true or false`)}},
	{"key_by: two attributes in one element", up + pol("\n      - header: X-Tenant\n        query: t"),
		[]wantErr{at(9, "key_by[0]: has both header and query; give each attribute its own list item")}},
	{"key_by: unknown field in an element", up + pol("\n      - header: X-Tenant\n        shard: true"),
		[]wantErr{at(9, `key_by[0]: unknown field "shard"; did you mean "shared"?`)}},
	{"key_by: only shared", up + pol("[{shared: true}]"), []wantErr{at(7, "key_by[0]: names no attribute")}},
	{"key_by: client with a value", up + pol("[{client: true}]"), []wantErr{at(7, "client takes no value: write - client")}},
	{"key_by: empty element", up + pol("[client, ~]"), []wantErr{at(7, "key_by[1] is empty")}},
	{"key_by: too many", up + pol("[client, path, method, remote_address, {header: A}, {header: B}, {query: c}, {query: d}, {header: E}]"),
		[]wantErr{at(7, "key_by has 9 elements; at most 8")}},
	{"key_by: several problems at once", up + pol("\n      - {header: \"a b\"}\n      - {path_prefix: -1}\n      - tenant"),
		[]wantErr{at(8, "is not a header name"), at(9, "path_prefix -1 must be from 1"), at(10, `"tenant" is not an attribute`)}},
}

func init() {
	errorCases = append(errorCases, keyByErrorCases...)
}

func TestKeyBy(t *testing.T) {
	y := up + `identity:
  - api_key: {}
  - jwt: {secret_env: JWT_SECRET}
  - ip: {}
policies:
  - name: per-tenant
    algorithm: token-bucket
    limit: 100
    period: 1s
    key_by:
      - client
      - header: x-tenant
      - query: region
      - path_prefix: 2
      - method
      - jwt_claim: org
      - remote_address
  - {name: per-path, algorithm: fixed-window, limit: 5, period: 1s, key_by: [path]}
  - {name: signed-in, algorithm: fixed-window, limit: 5, period: 1s, key_by: [{header: Authorization, shared: true}, {jwt_claim: org, shared: false}]}
  - {name: per-client, algorithm: fixed-window, limit: 5, period: 1s, key_by: [client]}
  - {name: everyone, algorithm: fixed-window, limit: 5, period: 1s, key_by: []}
  - {name: plain, algorithm: fixed-window, limit: 5, period: 1s}
default_policy: [per-tenant, plain]
routes:
  - {path_prefix: /orders, scope: orders}
  - {path_prefix: /paths, policy: [per-path, everyone]}
`
	cfg, err := parseTest(t, y)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]KeyPart{
		"per-tenant": {{Attr: KeyClient, Line: 12}, {Attr: KeyHeader, Name: "X-Tenant", Line: 13}, {Attr: KeyQuery, Name: "region", Line: 14},
			{Attr: KeyPathPrefix, Segments: 2, Line: 15}, {Attr: KeyMethod, Line: 16}, {Attr: KeyJWTClaim, Name: "org", Line: 17}, {Attr: KeyRemoteAddress, Line: 18}},
		"per-path":   {{Attr: KeyPath, Line: 19}},
		"signed-in":  {{Attr: KeyHeader, Name: "Authorization", Shared: true, Line: 20}, {Attr: KeyJWTClaim, Name: "org", Line: 20}},
		"per-client": nil, // [client] is the default
		"everyone":   {},  // one counter for every request: not nil
		"plain":      nil,
	}
	for _, p := range cfg.Policies {
		w, ok := want[p.Name]
		if !ok {
			t.Fatalf("policy %q", p.Name)
		}
		if !reflect.DeepEqual(p.KeyBy, w) || (p.KeyBy == nil) != (w == nil) {
			t.Errorf("%s: key_by %+v; want %+v", p.Name, p.KeyBy, w)
		}
	}
	// The applied policies carry it, on a route with a scope too (the scope renames the counter,
	// key_by splits it), and on a route's own policies.
	check := func(where string, got []AppliedPolicy, names ...string) {
		t.Helper()
		if len(got) != len(names) {
			t.Fatalf("%s: %d policies, want %d", where, len(got), len(names))
		}
		for i, a := range got {
			if a.PolicyName != names[i] || a.Key != "" || !reflect.DeepEqual(a.KeyBy, want[names[i]]) || (a.KeyBy == nil) != (want[names[i]] == nil) {
				t.Errorf("%s: %+v; want policy %s with key_by %+v", where, a, names[i], want[names[i]])
			}
		}
	}
	check("default", cfg.AppliedPoliciesFor(nil, nil), "per-tenant", "plain")
	orders, _ := cfg.Route("GET", "/orders/7")
	scoped := cfg.AppliedPoliciesFor(nil, orders)
	check("scoped", scoped, "per-tenant", "plain")
	if scoped[0].Policy.Name != "orders/per-tenant" {
		t.Errorf("scoped name %q", scoped[0].Policy.Name)
	}
	paths, _ := cfg.Route("GET", "/paths/x")
	check("route", cfg.AppliedPoliciesFor(nil, paths), "per-path", "everyone")
	if a, _ := cfg.Applied("per-tenant"); !reflect.DeepEqual(a.KeyBy, want["per-tenant"]) {
		t.Errorf("Applied: key_by %+v", a.KeyBy)
	}
}

// TestKeyByDocumented: every attribute key_by takes is in docs/config.md's key_by section.
func TestKeyByDocumented(t *testing.T) {
	doc := readDoc(t)
	_, section, ok := strings.Cut(doc, "### key_by")
	if !ok {
		t.Fatal("docs/config.md has no key_by section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for a := KeyClient; a <= KeyRemoteAddress; a++ {
		if !strings.Contains(section, "`"+a.String()) {
			t.Errorf("%s is not documented", a)
		}
	}
	for _, w := range []string{"shared", "absent", "sha256"} {
		if !strings.Contains(section, w) {
			t.Errorf("the key_by section does not say %q", w)
		}
	}
}

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
