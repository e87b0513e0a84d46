package deploy

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/gateway"
	"github.com/sluicehq/sluice/store/memory"
)

// The Grafana dashboard is valid JSON, and every metric its queries use is one sluice exports:
// a renamed metric fails here, not on an operator's screen.
func TestGrafanaDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("grafana/sluice.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard does not parse: %v", err)
	}
	// A gateway whose every metric has been observed at least once: a request allowed, one held,
	// one refused, an early retry, a held one whose client left, and a reload.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	cfg, err := config.Parse([]byte("upstream: "+upstream.URL+`
policies:
  - {name: q, algorithm: leaky-bucket, limit: 1, period: 10s, burst: 2}
default_policy: q
limits: {max_delay: 15s}
`), "grafana.yaml")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.NewServer(cfg, "", gateway.Store{Store: memory.New()}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	serve := func(ctx context.Context) int {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil).WithContext(ctx))
		return rec.Code
	}
	if code := serve(context.Background()); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	serve(gone)              // held 10 s, its client already gone: abandoned
	serve(gone)              // held 20 s: over max_delay, refused
	serve(gone)              // refused again, before its Retry-After: an early retry
	if srv.Reload() == nil { // no file to reload: a failed reload, counted
		t.Fatal("a server without a file reloaded")
	}
	admin := httptest.NewServer(srv.Admin())
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The families sluice exports (# TYPE lines), histograms with their _bucket, _sum, _count.
	exported := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)`).FindAllStringSubmatch(string(text), -1) {
		exported[m[1]] = true
		if m[2] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[m[1]+s] = true
			}
		}
	}
	used := regexp.MustCompile(`\bsluice_[a-z_]+\b`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range used.FindAllString(tg.Expr, -1) {
				n++
				if !exported[name] && !exported[strings.TrimSuffix(name, "_total")+"_total"] {
					t.Errorf("panel %q uses %s, which sluice does not export", p.Title, name)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("the dashboard uses only %d metrics", n)
	}
}
