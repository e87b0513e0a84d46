package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The metrics an operator runs sluice by: the upstream's answers by status class and time (on
// both engines), holds, the build, the store's breaker and reachability.
func TestOperatingMetrics(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		fe, srv := start(t, engine, `
upstream: UPSTREAM
policies:
  - {name: q, algorithm: leaky-bucket, limit: 10, period: 1s, burst: 5}
default_policy: q
`, up)
		for range 3 {
			if r := get(t, fe.URL+"/x"); r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
		}
		admin := httptest.NewServer(srv.Admin())
		defer admin.Close()
		if n := metricSum(t, admin.URL, "sluice_upstream_seconds_count", `class="2xx"`); n != 3 {
			t.Errorf("sluice_upstream_seconds_count{class=2xx} = %v, want 3", n)
		}
		if n := metricSum(t, admin.URL, "sluice_hold_seconds_count"); n != 2 { // the 2nd and 3rd were held
			t.Errorf("sluice_hold_seconds_count = %v, want 2", n)
		}
		if n := metricSum(t, admin.URL, "sluice_build_info"); n != 1 {
			t.Errorf("sluice_build_info = %v, want 1", n)
		}
		if n := metricSum(t, admin.URL, "sluice_store_reachable"); n != 1 {
			t.Errorf("sluice_store_reachable = %v, want 1", n)
		}
		if n := metricSum(t, admin.URL, "sluice_store_breaker_open"); n != 0 {
			t.Errorf("sluice_store_breaker_open = %v, want 0", n)
		}
	})
}

// A failed reload says so in its gauges until a reload takes.
func TestReloadMetrics(t *testing.T) {
	good := "upstream: UPSTREAM\n"
	srv, reload := reloadable(t, newUpstream(t), good)
	admin := httptest.NewServer(srv.Admin())
	defer admin.Close()
	if ok, at := metricSum(t, admin.URL, "sluice_config_last_reload_successful"), metricSum(t, admin.URL, "sluice_config_last_reload_timestamp_seconds"); ok != 1 || at != 0 {
		t.Errorf("before any reload: successful %v, timestamp %v; want 1, 0", ok, at)
	}
	if reload(strings.Replace(good, "upstream", "upstrem", 1)) == nil {
		t.Fatal("a bad file reloaded")
	}
	if ok, at := metricSum(t, admin.URL, "sluice_config_last_reload_successful"), metricSum(t, admin.URL, "sluice_config_last_reload_timestamp_seconds"); ok != 0 || at < 1.7e9 {
		t.Errorf("after a failed reload: successful %v, timestamp %v", ok, at)
	}
	if err := reload(good); err != nil {
		t.Fatal(err)
	}
	if ok := metricSum(t, admin.URL, "sluice_config_last_reload_successful"); ok != 1 {
		t.Errorf("after a good reload: successful %v", ok)
	}
}

// A scraper that asks for OpenMetrics gets it.
func TestOpenMetrics(t *testing.T) {
	up := newUpstream(t)
	_, srv := start(t, "nethttp", "upstream: UPSTREAM\n", up)
	admin := httptest.NewServer(srv.Admin())
	defer admin.Close()
	req, _ := http.NewRequest("GET", admin.URL+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") || !strings.HasSuffix(strings.TrimSpace(string(b)), "# EOF") {
		t.Errorf("Content-Type %q, ends %q", ct, string(b[max(0, len(b)-20):]))
	}
}
