package gateway_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gateway"
)

// sharedYAML names two clients by API key and counts everyone else by address, 3 an hour (a
// token bucket: nothing refills while the test runs). No proxy is trusted.
const sharedYAML = `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
  - ip: {}
policies:
  - {name: per-ip, algorithm: token-bucket, limit: 3, period: 1h}
  - {name: standard, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: per-ip
clients:
  - {name: partner-a, api_key_sha256: KEY_A, policy: standard}
  - {name: partner-b, api_key_sha256: KEY_B, policy: standard}
`

// The "shared address" finding is true: it is raised only for an address behind which several
// clients are counted as one. Two partners named by their API keys, from one address, and through
// a proxy that is not trusted (so that their requests carry X-Forwarded-For), are counted apart:
// no finding. One anonymous client through that proxy: none either. A second anonymous client
// through it: both are counted as the proxy's address (the second is refused at once, the first
// having spent the 3), and the finding names the proxy's address and the two it forwards for, the
// second refused. Real requests, through a real proxy, on both engines.
func TestSharedAddressFinding(t *testing.T) {
	yaml := strings.NewReplacer("KEY_A", sum("key-a"), "KEY_B", sum("key-b")).Replace(sharedYAML)
	forEachEngine(t, func(t *testing.T, engine string) {
		gw, srv := start(t, engine, yaml, newUpstream(t))
		admin := httptest.NewServer(srv.Admin())
		t.Cleanup(admin.Close)
		// shared returns the shared_address findings and the addresses listed as shared.
		shared := func() ([]gateway.Finding, []gateway.SharedAddress) {
			t.Helper()
			resp, err := http.Get(admin.URL + "/v1/stats")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st gateway.Stats
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatal(err)
			}
			var out []gateway.Finding
			for _, f := range st.Diagnosis.Findings {
				if f.Kind == "shared_address" {
					out = append(out, f)
				}
			}
			return out, st.Diagnosis.SharedAddress
		}
		proxy := proxyTo(t, gw.URL, "X-Forwarded-For")
		a, b := from(t, clientA), from(t, clientB)
		for _, url := range []string{gw.URL, proxy} {
			for _, key := range []string{"key-a", "key-b"} {
				if code := send(t, a, url+"/x", [2]string{"X-API-Key", key}); code != http.StatusOK {
					t.Fatalf("%s from %s to %s: %d, want 200", key, clientA, url, code)
				}
			}
		}
		if f, sa := shared(); len(f) != 0 || len(sa) != 0 {
			t.Fatalf("two clients named by their API keys from one address: %+v, %+v; want no shared_address finding", f, sa)
		}

		for i := range 3 {
			if code := send(t, a, proxy+"/x"); code != http.StatusOK {
				t.Fatalf("anonymous %s through the proxy, request %d: %d, want 200", clientA, i+1, code)
			}
		}
		if f, sa := shared(); len(f) != 0 || len(sa) != 0 {
			t.Fatalf("one anonymous client behind the proxy: %+v, %+v; want no shared_address finding", f, sa)
		}
		if code := send(t, b, proxy+"/x"); code != http.StatusTooManyRequests {
			t.Fatalf("anonymous %s through the proxy after %s spent the proxy's address's 3: %d, want 429 (counted as one)", clientB, clientA, code)
		}
		f, sa := shared()
		if len(f) != 1 || f[0].Subject != proxyAddr || len(sa) != 1 || sa[0].Address != proxyAddr ||
			fmt.Sprint(sa[0].Clients) != fmt.Sprint([]string{clientA, clientB}) || fmt.Sprint(sa[0].Refused) != fmt.Sprint([]string{clientB}) {
			t.Fatalf("two anonymous clients behind the proxy: %+v, %+v; want one shared_address finding about %s, forwarding for %s and %s, %[4]s refused",
				f, sa, proxyAddr, clientA, clientB)
		}
	})
}
