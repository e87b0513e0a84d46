package main

// One table, four front ends: the same requests, sent through the proxy, POST /v1/check,
// /v1/forward-auth and Envoy's rate limit service (gRPC), must get the same decisions, since all
// four are adapters over one decision layer.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/internal/peertest"
)

// outcome is what a front end said of one request: allowed or not, what remains of the policy,
// and the Retry-After (seconds) of a refusal.
type outcome struct {
	Allowed   bool
	Remaining int64
	Retry     int64
}

func (o outcome) String() string {
	if o.Allowed {
		return fmt.Sprintf("allowed r=%d", o.Remaining)
	}
	return fmt.Sprintf("refused r=%d retry=%ds", o.Remaining, o.Retry)
}

// step is one request of the table: a client (by API key), a method and path, and the cost the
// route gives that path (which /v1/check and the rate limit service are told, since they have
// no route).
type step struct {
	client, method, path string
	cost                 int64
}

// The policies (per day, so that no window ends and no token comes back during the test, but at
// midnight UTC), in sluice's own configuration and in envoyproxy/ratelimit's.
const tableSluice = `listen: %s
admin_listen: %s
upstream: %s
rls: {listen: %s, envoy_config: [envoy.yaml]}
identity:
  - api_key: {}
  - ip: {trusted_proxies: [127.0.0.1/32]}
policies:
  - {name: standard, algorithm: fixed-window, limit: 5, period: 24h}
  - {name: bucket, algorithm: token-bucket, limit: 5, period: 24h, burst: 3}
  - {name: log, algorithm: sliding-log, limit: 4, period: 24h}
clients:
  - {name: p1, api_key_sha256: %s, policy: [standard]}
  - {name: p2, api_key_sha256: %s, policy: [bucket]}
  - {name: p3, api_key_sha256: %s, policy: [log]}
routes:
  - {path_prefix: /reports, cost: 2}
`

const tableEnvoy = `domain: table
descriptors:
  - key: client
    value: p1
    rate_limit: {unit: day, requests_per_unit: 5, name: standard}
  - key: client
    value: p2
    algorithm: token-bucket
    burst: 3
    rate_limit: {unit: day, requests_per_unit: 5, name: bucket}
  - key: client
    value: p3
    algorithm: sliding-log
    rate_limit: {unit: day, requests_per_unit: 4, name: log}
`

var tableSteps = []step{
	{"p1", "GET", "/a", 1}, {"p1", "POST", "/reports", 2}, {"p2", "GET", "/a", 1}, {"p1", "GET", "/b", 1},
	{"p2", "POST", "/reports/x", 2}, {"p1", "GET", "/reports", 2}, {"p2", "GET", "/a", 1}, {"p1", "GET", "/c", 1},
	{"p3", "GET", "/a", 1}, {"p3", "GET", "/reports", 2}, {"p1", "GET", "/d", 1}, {"p3", "GET", "/reports", 2},
	{"p3", "GET", "/e", 1}, {"p3", "GET", "/f", 1}, {"p2", "GET", "/g", 1},
}

// tableWant is what the core decides for tableSteps: the four front ends must all say it.
var tableWant = []outcome{
	{true, 4, 0}, {true, 2, 0}, {true, 2, 0}, {true, 1, 0},
	{true, 0, 0}, {false, 1, 0}, {false, 0, 0}, {true, 0, 0},
	{true, 3, 0}, {true, 1, 0}, {false, 0, 0}, {false, 1, 0},
	{true, 0, 0}, {false, 0, 0}, {false, 0, 0},
}

func TestFourFrontEndsAgree(t *testing.T) {
	up := newUpstream(t)
	keys := map[string]string{"p1": "key-one", "p2": "key-two", "p3": "key-three"}
	// One sluice per front end, so that each starts from nothing.
	start := func(t *testing.T) (*sluiceProc, string) {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "envoy.yaml"), tableEnvoy)
		var rls string
		p := startSluice(t, dir, "sluice.yaml", func(listen, admin string) string {
			a, err := freeAddr()
			if err != nil {
				t.Fatal(err)
			}
			rls = a
			return fmt.Sprintf(tableSluice, listen, admin, up.URL, a, identity.HashAPIKey(keys["p1"]),
				identity.HashAPIKey(keys["p2"]), identity.HashAPIKey(keys["p3"]))
		})
		return p, rls
	}
	fronts := map[string]func(t *testing.T, p *sluiceProc, rls string, s step) outcome{
		"proxy": func(t *testing.T, p *sluiceProc, _ string, s step) outcome {
			req, _ := http.NewRequest(s.method, p.proxy+s.path, nil)
			req.Header.Set("X-API-Key", keys[s.client])
			return httpOutcome(t, req, http.StatusOK)
		},
		"forward-auth": func(t *testing.T, p *sluiceProc, _ string, s step) outcome {
			req, _ := http.NewRequest(http.MethodGet, p.admin+"/v1/forward-auth", nil)
			req.Header.Set("X-API-Key", keys[s.client])
			req.Header.Set("X-Forwarded-Method", s.method)
			req.Header.Set("X-Forwarded-Uri", s.path)
			req.Header.Set("X-Forwarded-For", "198.51.100.7")
			return httpOutcome(t, req, http.StatusOK)
		},
		"check": func(t *testing.T, p *sluiceProc, _ string, s step) outcome {
			body := fmt.Sprintf(`{"api_key":%q,"cost":%d}`, keys[s.client], s.cost)
			req, _ := http.NewRequest(http.MethodPost, p.admin+"/v1/check", bytes.NewBufferString(body))
			return httpOutcome(t, req, http.StatusOK)
		},
		"grpc": func(t *testing.T, _ *sluiceProc, rls string, s step) outcome {
			c := peertest.NewClient(t, rls)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := c.ShouldRateLimit(ctx, "table", [][]peertest.Entry{{peertest.E("client", s.client)}}, uint32(s.cost))
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			o := outcome{Allowed: resp.OverallCode == 1, Remaining: int64(resp.Statuses[0].LimitRemaining)}
			for _, h := range resp.ResponseHeadersToAdd {
				if h.Key == "Retry-After" {
					o.Retry, _ = strconv.ParseInt(h.Value, 10, 64)
				}
				if h.Key == "RateLimit" && !o.Allowed {
					o.Remaining = remainingOf(t, h.Value)
				}
			}
			return o
		},
	}
	results := map[string][]outcome{}
	for _, name := range []string{"proxy", "forward-auth", "check", "grpc"} {
		t.Run(name, func(t *testing.T) {
			p, rls := start(t)
			for i, s := range tableSteps {
				got := fronts[name](t, p, rls, s)
				results[name] = append(results[name], got)
				want := tableWant[i]
				if !got.Allowed {
					want.Retry = got.Retry // compared between the front ends below
					if got.Retry < 1 {
						t.Errorf("step %d %+v: refused without a Retry-After", i, s)
					}
				}
				if got != want {
					t.Errorf("step %d %+v: %v, want %v", i, s, got, want)
				}
			}
		})
	}
	// A refusal's wait is until midnight UTC (fixed window, sliding log) or until the bucket holds
	// the cost: every front end must say the same, give or take the seconds between their runs.
	for i := range tableSteps {
		proxy := results["proxy"]
		for name, r := range results {
			if i < len(r) && i < len(proxy) && (r[i].Retry-proxy[i].Retry > 5 || proxy[i].Retry-r[i].Retry > 5) {
				t.Errorf("step %d: %s says retry after %d s, the proxy %d s", i, name, r[i].Retry, proxy[i].Retry)
			}
		}
	}
}

// httpOutcome sends req and reads the answer's decision: allowed if its status is okStatus, the
// remaining quota from the RateLimit field, Retry-After when refused.
func httpOutcome(t *testing.T, req *http.Request, okStatus int) outcome {
	t.Helper()
	resp, err := e2eClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	o := outcome{Allowed: resp.StatusCode == okStatus}
	if !o.Allowed && resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%s %s: %s %s", req.Method, req.URL, resp.Status, buf.String())
	}
	o.Remaining = remainingOf(t, resp.Header.Get("RateLimit"))
	if !o.Allowed {
		o.Retry, _ = strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
	}
	if strings.HasSuffix(req.URL.Path, "/v1/check") {
		var body struct {
			Allowed   bool `json:"allowed"`
			Decisions []struct {
				Remaining int64 `json:"remaining"`
			} `json:"decisions"`
		}
		if err := json.Unmarshal(buf.Bytes(), &body); err != nil || len(body.Decisions) != 1 || body.Allowed != o.Allowed || body.Decisions[0].Remaining != o.Remaining {
			t.Fatalf("/v1/check body %s disagrees with its fields (%v)", buf.String(), err)
		}
	}
	return o
}

// remainingOf reads r= of the one item of a RateLimit field.
func remainingOf(t *testing.T, field string) int64 {
	t.Helper()
	l, err := httpsfv.UnmarshalList([]string{field})
	if err != nil || len(l) != 1 {
		t.Fatalf("RateLimit %q: %v", field, err)
	}
	r, _ := l[0].(httpsfv.Item).Params.Get("r")
	v, _ := r.(int64)
	return v
}
