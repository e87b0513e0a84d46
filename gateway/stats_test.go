package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/internal/redistest"
)

func stats(t *testing.T, admin string) gateway.Stats {
	t.Helper()
	resp, err := http.Get(admin + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st gateway.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// The stats show the store's state as it changes: reachable, then, once Redis is killed,
// unreachable with the breaker open and the failure mode (fail-open) deciding, counted as
// fallbacks; requests still pass, and the client is not shown as limited. The calls that found
// the store dead are store errors (the stats' errors, sluice_store_errors_total), though no
// request was answered 503: the breaker's threshold of them, 3 (and a probe or two after its
// cooldown, on a slow machine).
func TestStatsStoreHealth(t *testing.T) {
	rs := redistest.Start(t)
	up := newUpstream(t)
	yaml := `
upstream: UPSTREAM
store: {type: redis, addrs: [` + rs.Addr + `], on_error: fail-open}
identity:
  - ip: {}
policies:
  - {name: anonymous, algorithm: token-bucket, limit: 1000, period: 1s}
default_policy: anonymous
`
	gw, srv := start(t, "fasthttp", yaml, up)
	admin := httptest.NewServer(srv.Admin())
	defer admin.Close()
	get(t, gw.URL+"/a")
	st := stats(t, admin.URL)
	if !st.Store.Reachable || st.Store.BreakerOpen || st.Store.Type != "redis" || st.Store.OnError != "fail-open" || st.Store.Fallbacks != 0 {
		t.Fatalf("Redis up: %+v", st.Store)
	}
	rs.Kill()
	for i := 0; i < 5; i++ {
		if r := get(t, gw.URL+"/a"); r.StatusCode != 200 {
			t.Fatalf("fail-open with Redis down: %d", r.StatusCode)
		}
	}
	st = stats(t, admin.URL)
	if st.Store.Reachable || st.Store.Error == "" || !st.Store.BreakerOpen || st.Store.Fallbacks != 5 || st.Store.Unavailable != 0 ||
		st.Store.Errors < 3 || st.Store.Errors > 5 {
		t.Fatalf("Redis down: %+v; want 3 to 5 store errors, no 503", st.Store)
	}
	if m := metricValue(t, admin.URL, "sluice_store_errors_total"); m != strconv.FormatUint(stats(t, admin.URL).Store.Errors, 10) {
		t.Fatalf("sluice_store_errors_total %s; want the stats' errors, %d", m, st.Store.Errors)
	}
	if len(st.Clients) != 1 || st.Clients[0].Client != "anonymous" || st.Clients[0].Allowed != 6 || st.Clients[0].Limited {
		t.Fatalf("clients: %+v", st.Clients)
	}
	if strings.Contains(st.Config, "password") {
		t.Fatalf("config line: %s", st.Config)
	}
}

// httptestServer serves srv's admin listener on a real loopback server and returns its URL.
func httptestServer(t *testing.T, srv *gateway.Server) string {
	t.Helper()
	admin := httptest.NewServer(srv.Admin())
	t.Cleanup(admin.Close)
	return admin.URL
}
