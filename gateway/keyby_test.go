package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// keyByYAML is a gateway whose policies count by request attributes: per-tenant by the X-Tenant
// header alone (shared across clients), per-client-tenant by the client and the header, and
// per-area by the first path segment.
const keyByYAML = `
upstream: UPSTREAM
STORE
identity:
  - api_key: {}
  - ip: {}
policies:
  - {name: per-tenant, algorithm: fixed-window, limit: 3, period: 1h, key_by: [{header: X-Tenant}]}
  - {name: per-client-tenant, algorithm: fixed-window, limit: 3, period: 1h, key_by: [client, {header: X-Tenant}]}
  - {name: per-area, algorithm: fixed-window, limit: 2, period: 1h, key_by: [{path_prefix: 1}]}
default_policy: per-tenant
clients:
  - {name: partner-a, api_key_sha256: KEY_A, policy: per-tenant}
  - {name: partner-b, api_key_sha256: KEY_B, policy: per-tenant}
  - {name: partner-c, api_key_sha256: KEY_C, policy: per-client-tenant}
  - {name: partner-d, api_key_sha256: KEY_D, policy: per-client-tenant}
routes:
  - {path_prefix: /area, policy: per-area}
`

func keyByConfig(store string) string {
	return strings.NewReplacer("STORE", store, "KEY_A", sum("key-a"), "KEY_B", sum("key-b"), "KEY_C", sum("key-c"), "KEY_D", sum("key-d")).Replace(keyByYAML)
}

// codes sends n requests to url with headers and returns their statuses.
func codes(t *testing.T, n int, url string, headers ...string) string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, fmt.Sprint(get(t, url, headers...).StatusCode))
	}
	return strings.Join(out, " ")
}

// checkKeyBy runs the key_by scenarios against a gateway at url.
func checkKeyBy(t *testing.T, url string) {
	t.Helper()
	want := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %s, want %s", what, got, want)
		}
	}
	// Each tenant its own quota of 3, whoever sends it.
	want("tenant acme", codes(t, 4, url+"/x", "X-API-Key", "key-a", "X-Tenant", "acme"), "200 200 200 429")
	want("tenant globex", codes(t, 3, url+"/x", "X-API-Key", "key-a", "X-Tenant", "globex"), "200 200 200")
	// Without client in key_by, two clients with the same tenant share its counter: partner-b's
	// globex requests find partner-a's three already counted.
	want("partner-b, tenant globex", codes(t, 1, url+"/x", "X-API-Key", "key-b", "X-Tenant", "globex"), "429")
	want("partner-b, tenant initech", codes(t, 1, url+"/x", "X-API-Key", "key-b", "X-Tenant", "initech"), "200")
	// A request without the header has a counter of its own: not acme's (spent), not a fresh
	// one per request.
	want("no tenant", codes(t, 4, url+"/x", "X-API-Key", "key-a"), "200 200 200 429")
	// Anonymous requests without it share that same counter: the absent value is one value.
	want("anonymous, no tenant", codes(t, 1, url+"/x"), "429")
	// With client in key_by, each client's tenant counter is its own.
	want("partner-c, acme", codes(t, 4, url+"/x", "X-API-Key", "key-c", "X-Tenant", "acme"), "200 200 200 429")
	want("partner-d, acme", codes(t, 3, url+"/x", "X-API-Key", "key-d", "X-Tenant", "acme"), "200 200 200")
	// A path prefix: one counter for /area, shared by everyone, whatever follows it.
	want("/area", codes(t, 1, url+"/area/1", "X-API-Key", "key-a")+" "+codes(t, 1, url+"/area/2")+" "+codes(t, 1, url+"/area/3", "X-API-Key", "key-c"), "200 200 429")
}

// TestKeyByGateway: policies keyed by a header and by a path prefix, through both engines on the
// memory store.
func TestKeyByGateway(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		gw, _ := start(t, engine, keyByConfig(""), newUpstream(t))
		checkKeyBy(t, gw.URL)
	})
}

// TestKeyByGatewayRedis: the same on Redis, whose keys hold the header's value only hashed.
func TestKeyByGatewayRedis(t *testing.T) {
	rs := redistest.Start(t)
	gw, _ := start(t, "fasthttp", keyByConfig("store: {type: redis, addrs: ["+rs.Addr+"], prefix: \"kb:\"}"), newUpstream(t))
	checkKeyBy(t, gw.URL)
	keys, err := rs.Do("KEYS", "kb:*")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte("acme"))
	if !strings.Contains(keys, hex.EncodeToString(h[:16])) {
		t.Errorf("no key holds acme's hash:\n%s", keys)
	}
	for _, plain := range []string{"acme", "globex", "initech", "key-a", "key-c"} {
		if strings.Contains(keys, plain) {
			t.Errorf("a Redis key holds %q:\n%s", plain, keys)
		}
	}
}
