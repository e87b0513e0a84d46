package decision

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	_ "github.com/sluicehq/sluice/identity/jwt"
)

const (
	jwtSecret = "a-secret-of-at-least-32-bytes-for-hs256-keys"
	keyA      = "sk_live_partner_a_0123456789"
	keyB      = "sk_live_partner_b_0123456789"
)

func sum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// hash16 is a value as keys hold it: its SHA-256's first 16 bytes in hex.
func hash16(s string) string { return sum(s)[:32] }

// policies parses yaml (an upstream, the identity sources and two clients added) into Policies.
func policies(t *testing.T, yaml string) *Policies {
	t.Helper()
	t.Setenv("KEYS_TEST_JWT_SECRET", jwtSecret)
	y := "upstream: http://127.0.0.1:9\n" + `identity:
  - api_key: {}
  - jwt: {secret_env: KEYS_TEST_JWT_SECRET}
  - ip: {trusted_proxies: [10.0.0.0/8], ipv6_prefix: 48}
clients:
  - {name: partner-a, api_key_sha256: ` + sum(keyA) + `, jwt_subject: user-a}
  - {name: partner-b, api_key_sha256: ` + sum(keyB) + `}
` + yaml
	cfg, err := config.Parse([]byte(y), "keys.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPolicies(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// req is a request from peer with header pairs.
func req(method, target, peer string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, "http://api.example"+target, nil)
	r.RemoteAddr = peer
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// keys returns the Key of each limit of r.
func keys(p *Policies, r *http.Request) []string {
	res := p.Resolve(identity.HTTP(r), r.Method, r.URL.Path)
	out := make([]string, len(res.Limits))
	for i, l := range res.Limits {
		out[i] = l.Key
	}
	return out
}

func token(t *testing.T, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

func TestKeyByAttributes(t *testing.T) {
	p := policies(t, `policies:
  - {name: all, algorithm: fixed-window, limit: 10, period: 1s, key_by: [client, {header: X-Tenant}, {query: region}, path, method, {jwt_claim: org}, remote_address]}
  - {name: prefix, algorithm: fixed-window, limit: 10, period: 1s, key_by: [{path_prefix: 2}]}
  - {name: plain, algorithm: fixed-window, limit: 10, period: 1s}
default_policy: [all, prefix, plain]
`)
	exp := time.Now().Add(time.Hour).Unix()
	signed := token(t, jwt.MapClaims{"sub": "user-a", "org": "acme", "exp": exp})
	r := req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", signed)
	got := keys(p, r)
	want := []string{
		"by:c9=partner-a:h#" + hash16("t-1") + ":q#" + hash16("eu") + ":p13=/v1/orders/42:m3=GET:j#" + hash16("acme") + ":r14=ip:203.0.113.7",
		"by:s10=/v1/orders",
		"", // no key_by: the client's key, as before
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("keys\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Each attribute changes its own part only; a missing one is "absent", its own value.
	key := func(tenant, region, path, method, org, remote string) string {
		secret := func(v string) string {
			if v == "" {
				return "-"
			}
			return "#" + hash16(v)
		}
		return fmt.Sprintf("by:c9=partner-a:h%s:q%s:p%d=%s:m%d=%s:j%s:r%d=%s", secret(tenant), secret(region), len(path), path, len(method), method, secret(org), len(remote), remote)
	}
	if want[0] != key("t-1", "eu", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7") {
		t.Fatal("the test's key function disagrees with the key above")
	}
	other := token(t, jwt.MapClaims{"sub": "user-a", "org": "globex", "exp": exp})
	noOrg := token(t, jwt.MapClaims{"sub": "user-a", "exp": exp})
	for _, c := range []struct {
		name string
		r    *http.Request
		want string
	}{
		{"other tenant", req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "t-2", "Authorization", signed), key("t-2", "eu", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7")},
		{"no tenant", req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "Authorization", signed), key("", "eu", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7")},
		{"empty tenant", req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "", "Authorization", signed), key("", "eu", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7")},
		{"other region", req("GET", "/v1/orders/42?region=us", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", signed), key("t-1", "us", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7")},
		{"no region", req("GET", "/v1/orders/42", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", signed), key("t-1", "", "/v1/orders/42", "GET", "acme", "ip:203.0.113.7")},
		{"other path", req("GET", "/v1/orders/43?region=eu", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", signed), key("t-1", "eu", "/v1/orders/43", "GET", "acme", "ip:203.0.113.7")},
		{"other method", req("POST", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", signed), key("t-1", "eu", "/v1/orders/42", "POST", "acme", "ip:203.0.113.7")},
		{"other org", req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", other), key("t-1", "eu", "/v1/orders/42", "GET", "globex", "ip:203.0.113.7")},
		{"no org claim", req("GET", "/v1/orders/42?region=eu", "203.0.113.7:5000", "X-Tenant", "t-1", "Authorization", noOrg), key("t-1", "eu", "/v1/orders/42", "GET", "", "ip:203.0.113.7")},
		{"other peer", req("GET", "/v1/orders/42?region=eu", "203.0.113.8:5000", "X-Tenant", "t-1", "Authorization", signed), key("t-1", "eu", "/v1/orders/42", "GET", "acme", "ip:203.0.113.8")},
		// Through a trusted proxy, the address the ip source believes; IPv6 masked to its /48.
		{"behind a proxy", req("GET", "/v1/orders/42?region=eu", "10.0.0.1:5000", "X-Tenant", "t-1", "Authorization", signed, "X-Forwarded-For", "2001:db8:1:2::7"), key("t-1", "eu", "/v1/orders/42", "GET", "acme", "ip:2001:db8:1::/48")},
	} {
		if k := keys(p, c.r)[0]; k != c.want {
			t.Errorf("%s: key\n%s\nwant\n%s", c.name, k, c.want)
		}
	}

	// Anonymous: the client is the masked address; an expired or badly signed token's claims are
	// absent, as is a token's that nobody verifies.
	anon := keys(p, req("GET", "/v1/orders/42", "203.0.113.9:1", "Authorization", token(t, jwt.MapClaims{"sub": "user-a", "org": "acme", "exp": time.Now().Add(-time.Minute).Unix()})))
	if want := "by:c14=ip:203.0.113.9:h-:q-:p13=/v1/orders/42:m3=GET:j-:r14=ip:203.0.113.9"; anon[0] != want {
		t.Errorf("anonymous with an expired token: %s, want %s", anon[0], want)
	}
	forged, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "user-a", "org": "acme", "exp": exp}).SignedString([]byte("another-secret-of-at-least-32-bytes!"))
	if k := keys(p, req("GET", "/", "203.0.113.9:1", "Authorization", "Bearer "+forged)); !strings.Contains(k[0], ":j-:") {
		t.Errorf("forged token: %s", k[0])
	}
	// A valid token whose subject is no client's still has its claims read; an API key names
	// the client, and the token beside it is read for its claim.
	if k := keys(p, req("GET", "/", "203.0.113.9:1", "Authorization", token(t, jwt.MapClaims{"sub": "nobody", "org": "acme", "exp": exp}))); !strings.Contains(k[0], "by:c14=ip:203.0.113.9:") || !strings.Contains(k[0], ":j#"+hash16("acme")) {
		t.Errorf("token of no client: %s", k[0])
	}
	if k := keys(p, req("GET", "/", "203.0.113.9:1", "X-API-Key", keyB, "Authorization", signed)); !strings.HasPrefix(k[0], "by:c9=partner-b:") || !strings.Contains(k[0], ":j#"+hash16("acme")) {
		t.Errorf("api key and token: %s", k[0])
	}
	// For has no request: what only the request tells is absent.
	res := p.For(identity.Identity{Client: "partner-a", Key: "partner-a"}, "GET", "/v1/orders/42")
	if want := "by:c9=partner-a:h-:q-:p13=/v1/orders/42:m3=GET:j-:r-"; res.Limits[0].Key != want {
		t.Errorf("For: %s, want %s", res.Limits[0].Key, want)
	}
}

func TestKeyByPathPrefix(t *testing.T) {
	for _, c := range []struct {
		path string
		n    int
		want string
	}{
		{"/v1/orders/42", 2, "/v1/orders"}, {"/v1/orders/", 2, "/v1/orders"}, {"/v1/orders", 2, "/v1/orders"},
		{"/v1", 2, "/v1"}, {"/", 1, "/"}, {"/v1/orders/42", 1, "/v1"}, {"/a/b/c/d", 3, "/a/b/c"}, {"", 1, ""},
	} {
		if got := PathPrefix(c.path, c.n); got != c.want {
			t.Errorf("PathPrefix(%q, %d) = %q, want %q", c.path, c.n, got, c.want)
		}
	}
}

// TestKeyByShared: a shared element counts only whether the request has the attribute.
func TestKeyByShared(t *testing.T) {
	p := policies(t, `policies:
  - {name: signed-in, algorithm: fixed-window, limit: 10, period: 1s, key_by: [{path_prefix: 1}, {header: Authorization, shared: true}, {jwt_claim: org, shared: true}]}
default_policy: signed-in
`)
	exp := time.Now().Add(time.Hour).Unix()
	acme := keys(p, req("GET", "/v1/x", "203.0.113.7:1", "Authorization", token(t, jwt.MapClaims{"sub": "nobody", "org": "acme", "exp": exp})))[0]
	globex := keys(p, req("GET", "/v1/y", "203.0.113.8:1", "X-API-Key", keyA, "Authorization", token(t, jwt.MapClaims{"sub": "nobody", "org": "globex", "exp": exp})))[0]
	if want := "by:s3=/v1:h*:j*"; acme != want || globex != want {
		t.Errorf("two orgs, two clients: %s and %s; want one counter %s", acme, globex, want)
	}
	garbage := keys(p, req("GET", "/v1/z", "203.0.113.7:1", "Authorization", "Bearer not-a-token"))[0]
	none := keys(p, req("GET", "/v1/z", "203.0.113.7:1"))[0]
	if garbage != "by:s3=/v1:h*:j-" || none != "by:s3=/v1:h-:j-" {
		t.Errorf("an unverified token %s, none %s", garbage, none)
	}
}

// TestKeyByEveryone: key_by: [] is one counter for every request, whoever sends it.
func TestKeyByEveryone(t *testing.T) {
	p := policies(t, `policies:
  - {name: everyone, algorithm: fixed-window, limit: 10, period: 1s, key_by: []}
  - {name: per-client, algorithm: fixed-window, limit: 10, period: 1s, key_by: [client]}
default_policy: [everyone, per-client]
`)
	a := keys(p, req("GET", "/a", "203.0.113.7:1", "X-API-Key", keyA))
	b := keys(p, req("POST", "/b", "198.51.100.1:1"))
	if a[0] != "by" || b[0] != "by" || a[1] != "" || b[1] != "" {
		t.Errorf("keys %q and %q; want [by, \"\"] for both", a, b)
	}
}

// TestKeyBySafe: no header, query or claim value is ever in a key, however long; every key is
// bounded; long or odd paths and methods are hashed.
func TestKeyBySafe(t *testing.T) {
	p := policies(t, `policies:
  - name: all
    algorithm: fixed-window
    limit: 10
    period: 1s
    key_by: [client, {header: X-Tenant}, {header: X-API-Key}, {query: token}, path, method, {jwt_claim: org}, remote_address]
default_policy: all
`)
	big := strings.Repeat("secret-", 10<<10/7) // 10 KB
	exp := time.Now().Add(time.Hour).Unix()
	tok := token(t, jwt.MapClaims{"sub": "user-a", "org": big, "exp": exp})
	longPath := "/" + strings.Repeat("p", 10<<10)
	r := req("GET", longPath+"?token="+big, "203.0.113.7:1", "X-Tenant", big, "X-API-Key", keyA, "Authorization", tok)
	k := keys(p, r)[0]
	for _, secret := range []string{big[:16], keyA, "secret", strings.TrimPrefix(tok, "Bearer ")[:20], "ppppppppp"} {
		if strings.Contains(k, secret) {
			t.Errorf("key %s holds %q", k, secret)
		}
	}
	if want := "by:c9=partner-a:h#" + hash16(big) + ":h#" + hash16(keyA) + ":q#" + hash16(big) + ":p#" + hash16(longPath) + ":m3=GET:j#" + hash16(big) + ":r14=ip:203.0.113.7"; k != want {
		t.Errorf("key\n%s\nwant\n%s", k, want)
	}
	if len(k) > MaxKeyLen {
		t.Errorf("key of %d bytes > %d", len(k), MaxKeyLen)
	}
	// The longest a key can be: every literal part at MaxLiteral.
	lit := "/" + strings.Repeat("a", MaxLiteral-1)
	parts := make([]config.KeyPart, config.MaxKeyParts)
	for i := range parts {
		parts[i] = config.KeyPart{Attr: config.KeyPath}
	}
	if k := p.key(parts, &attrs{path: lit}); len(k) != MaxKeyLen || !strings.Contains(k, lit) {
		t.Errorf("the longest key is %d bytes, MaxKeyLen %d", len(k), MaxKeyLen)
	}
	if k := p.key(parts[:1], &attrs{path: lit + "a"}); k != "by:p#"+hash16(lit+"a") {
		t.Errorf("a path of %d bytes: %s", MaxLiteral+1, k)
	}
	// Odd bytes are hashed: a brace (a Redis Cluster hash tag), a space, a control byte, UTF-8.
	for _, path := range []string{"/a{b}", "/a b", "/a\x00", "/ä"} {
		if k := p.key(parts[:1], &attrs{path: path}); k != "by:p#"+hash16(path) {
			t.Errorf("path %q: %s", path, k)
		}
	}
	// A method that is not a short token is hashed.
	m := []config.KeyPart{{Attr: config.KeyMethod}}
	for method, want := range map[string]string{"PATCH": "by:m5=PATCH", "PROPFIND": "by:m8=PROPFIND", strings.Repeat("X", 17): "by:m#" + hash16(strings.Repeat("X", 17)), "GE T": "by:m#" + hash16("GE T"), "": "by:m-"} {
		if k := p.key(m, &attrs{method: method}); k != want {
			t.Errorf("method %q: %s, want %s", method, k, want)
		}
	}
}

// TestKeyByUnambiguous: different tuples of values never give the same key, however their values
// are made to look like the key's own syntax.
func TestKeyByUnambiguous(t *testing.T) {
	p := &Policies{claimIndex: map[string]int{}}
	parts := []config.KeyPart{{Attr: config.KeyClient}, {Attr: config.KeyPath}, {Attr: config.KeyMethod}}
	alphabet := []string{"a", ":", "=", "-", "*", "#", "1", "2", ":p=", ":p1=", ":p2=", ":m=", ":m1=", ":m-", ":p-", "1=", "ip:", "/"}
	rnd := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		var b strings.Builder
		for range rnd.IntN(4) {
			b.WriteString(alphabet[rnd.IntN(len(alphabet))])
		}
		return b.String()
	}
	seen := map[string]string{}
	for range 50000 {
		a := attrs{who: identity.Identity{Key: word()}, path: word(), method: word()}
		tuple := fmt.Sprintf("%q %q %q", a.who.Key, a.path, a.method)
		k := p.key(parts, &a)
		if prev, ok := seen[k]; ok && prev != tuple {
			t.Fatalf("%s and %s both give key %s", prev, tuple, k)
		}
		seen[k] = tuple
	}
	// Nor is a key ever a client's: client names have no ':', anonymous keys start "ip:".
	for k := range seen {
		if !strings.HasPrefix(k, "by:") {
			t.Fatalf("key %q", k)
		}
	}
}

// TestResolveAllocs: a request whose policies have no key_by resolves without allocating, even
// when other policies have one; one with a key_by gets its own copy of the limits.
func TestResolveAllocs(t *testing.T) {
	p := policies(t, `policies:
  - {name: plain, algorithm: fixed-window, limit: 10, period: 1s}
  - {name: keyed, algorithm: fixed-window, limit: 10, period: 1s, key_by: [{header: X-Tenant}]}
routes:
  - {path_prefix: /keyed, policy: keyed}
default_policy: plain
`)
	r := req("GET", "/orders", "203.0.113.7:1", "X-API-Key", keyA, "X-Tenant", "t")
	hr := identity.HTTP(r)
	if n := testing.AllocsPerRun(200, func() {
		res := p.Resolve(hr, "GET", "/orders")
		if len(res.Limits) != 1 || res.Limits[0].Key != "" {
			t.Fatal(res.Limits)
		}
	}); n != 0 {
		t.Errorf("Resolve without key_by allocates %v times; want 0", n)
	}
	// So too when some policy is keyed by a claim, and the request has no token.
	pc := policies(t, `policies:
  - {name: plain, algorithm: fixed-window, limit: 10, period: 1s}
  - {name: by-org, algorithm: fixed-window, limit: 10, period: 1s, key_by: [{jwt_claim: org}]}
routes:
  - {path_prefix: /keyed, policy: by-org}
default_policy: plain
`)
	if n := testing.AllocsPerRun(200, func() {
		res := pc.Resolve(hr, "GET", "/orders")
		if len(res.Limits) != 1 || res.Limits[0].Key != "" {
			t.Fatal(res.Limits)
		}
	}); n != 0 {
		t.Errorf("Resolve without key_by, with a claim-keyed policy configured, allocates %v times; want 0", n)
	}
	a := p.Resolve(hr, "GET", "/keyed")
	b := p.Resolve(identity.HTTP(req("GET", "/keyed", "203.0.113.7:1", "X-Tenant", "u")), "GET", "/keyed")
	if a.Limits[0].Key != "by:h#"+hash16("t") || b.Limits[0].Key != "by:h#"+hash16("u") {
		t.Errorf("keys %q %q", a.Limits[0].Key, b.Limits[0].Key)
	}
	// The configuration's shared limits are untouched.
	route, _ := p.Config().Route("GET", "/keyed")
	if shared := p.Config().AppliedPoliciesFor(nil, route); shared[0].Key != "" {
		t.Errorf("the shared limits were written: %q", shared[0].Key)
	}
}

// TestKeyByScope: on a route with a scope, a keyed policy counts under the scope's name with its
// key_by key: the same tenant's counters on the route and off it stay apart.
func TestKeyByScope(t *testing.T) {
	p := policies(t, `policies:
  - {name: per-tenant, algorithm: fixed-window, limit: 10, period: 1s, key_by: [{header: X-Tenant}]}
default_policy: per-tenant
routes:
  - {path_prefix: /orders, scope: orders}
`)
	on := p.Resolve(identity.HTTP(req("GET", "/orders/1", "203.0.113.7:1", "X-Tenant", "acme")), "GET", "/orders/1")
	off := p.Resolve(identity.HTTP(req("GET", "/other", "203.0.113.7:1", "X-Tenant", "acme")), "GET", "/other")
	k := "by:h#" + hash16("acme")
	if l := on.Limits[0]; l.Key != k || l.Policy.Name != "orders" || l.PolicyName != "per-tenant" {
		t.Errorf("on the scoped route: key %q, name %q (%q)", l.Key, l.Policy.Name, l.PolicyName)
	}
	if l := off.Limits[0]; l.Key != k || l.Policy.Name != "per-tenant" {
		t.Errorf("off it: key %q, name %q", l.Key, l.Policy.Name)
	}
}

// TestKeyByDocumentedKey: the key docs/config.md shows is the key.
func TestKeyByDocumentedKey(t *testing.T) {
	p := policies(t, `policies:
  - {name: doc, algorithm: fixed-window, limit: 10, period: 1s, key_by: [client, {header: X-Tenant}, {path_prefix: 2}]}
default_policy: doc
`)
	k := keys(p, req("GET", "/v1/orders/42", "203.0.113.7:1", "X-API-Key", keyA, "X-Tenant", "acme"))[0]
	doc, err := os.ReadFile("../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`"+k+"`") {
		t.Errorf("docs/config.md does not show the key %s", k)
	}
}
