package gateway_test

import (
	"net/http"
	"strings"
	"testing"
)

// A client whose key is sent the standard way, `Authorization: Bearer KEY` (the scheme in any
// case), is that client, through both engines: it was anonymous (the whole value was hashed), so
// its second request got the anonymous limit of 1.
func TestAPIKeyFromAuthorizationBearer(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, _ := start(t, engine, `
upstream: UPSTREAM
identity: [{api_key: {header: Authorization}}]
policies:
  - {name: anonymous, algorithm: fixed-window, limit: 1, period: 1h}
  - {name: standard, algorithm: fixed-window, limit: 10, period: 1h}
default_policy: anonymous
clients:
  - {name: partner-a, api_key_sha256: `+sum("key-a")+`, policy: standard}
`, up)
		for i, v := range []string{"Bearer key-a", "bearer key-a", "BEARER key-a"} {
			resp := get(t, gw.URL+"/x", "Authorization", v)
			if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("RateLimit-Policy"), `"standard"`) {
				t.Fatalf("request %d (Authorization: %.6s…): %d, RateLimit-Policy %q; want 200 under partner-a's policy",
					i, v, resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
			}
		}
	})
}

// The admin token's scheme is case-insensitive too: `bearer TOKEN` is let in.
func TestAdminTokenSchemeAnyCase(t *testing.T) {
	admin := adminWithToken(t, "s3cret-admin-token")
	for _, v := range []string{"bearer s3cret-admin-token", "BEARER s3cret-admin-token", "Bearer s3cret-admin-token"} {
		if resp := get(t, admin.URL+"/v1/stats", "Authorization", v); resp.StatusCode != http.StatusOK {
			t.Errorf("Authorization: %.6s… TOKEN: %d, want 200", v, resp.StatusCode)
		}
	}
}
