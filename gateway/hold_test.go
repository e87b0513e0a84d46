package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A queue of 10 in 10s (one a second) with room for 100, behind max_delay 2s.
const holdYAML = `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: queue, algorithm: leaky-bucket, limit: 10, period: 10s, burst: 100}
default_policy: queue
limits: {max_delay: 2s}
clients:
  - {name: partner-q, api_key_sha256: KEY_Q, policy: queue}
`

// queueDepth peeks, through /v1/check, how long partner-q's queue takes to drain.
func queueDepth(t *testing.T, admin string) time.Duration {
	t.Helper()
	_, body := postCheck(t, admin, `{"client":"partner-q","cost":0}`)
	var out struct {
		Decisions []struct {
			ResetAfterMs float64 `json:"reset_after_ms"`
		}
	}
	if err := json.Unmarshal(body, &out); err != nil || len(out.Decisions) != 1 {
		t.Fatalf("peek: %v %s", err, body)
	}
	return time.Duration(out.Decisions[0].ResetAfterMs * float64(time.Millisecond))
}

func postCheck(t *testing.T, admin, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(admin+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// A request the queue would hold longer than max_delay is refused, and consumes nothing: 20 at
// once are 3 held (0s, 1s, 2s) and 17 refused, and the queue is left 3s deep, not 20s — on both
// engines and through /v1/check, which refuses exactly what the proxy refuses.
func TestHeldTooLongConsumesNothing(t *testing.T) {
	yaml := strings.ReplaceAll(holdYAML, "KEY_Q", sum("key-q"))
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, srv := start(t, engine, yaml, up)
		admin := httptest.NewServer(srv.Admin())
		defer admin.Close()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var refused atomic.Int32
		var retry sync.Map
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw.URL+"/q", nil)
				req.Header.Set("X-API-Key", "key-q")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // a held request, abandoned below
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 429 {
					refused.Add(1)
					retry.Store(resp.Header.Get("Retry-After"), true)
				}
			}()
		}
		// The 17 refusals come back at once; the 3 held ones are still held.
		deadline := time.Now().Add(10 * time.Second)
		for refused.Load() < 17 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling a counter the answers fill
		}
		if n := refused.Load(); n != 17 {
			t.Fatalf("20 at once on 10 in 10s, room 100, max_delay 2s: %d refused, want 17", n)
		}
		if d := queueDepth(t, admin.URL); d > 3*time.Second || d < 2*time.Second {
			t.Fatalf("the queue drains in %v after 3 held and 17 refused, want under 3s: the refusals consumed", d)
		}
		retry.Range(func(k, _ any) bool {
			if k != "1" {
				t.Errorf("Retry-After %q, want 1s (until the hold would be 2s)", k)
			}
			return true
		})
		cancel()
		wg.Wait()

		// /v1/check decides exactly as the proxy: a check on the queue, which would hold it
		// about 3s, is refused with 429 too, and consumes nothing.
		before := queueDepth(t, admin.URL)
		status, body := postCheck(t, admin.URL, `{"client":"partner-q"}`)
		if status != 429 || !bytes.Contains(body, []byte(`"allowed":false`)) {
			t.Fatalf("/v1/check on a queue about 3s deep behind max_delay 2s: %d %s, want 429", status, body)
		}
		if after := queueDepth(t, admin.URL); after > before {
			t.Fatalf("the queue drains in %v after a refused check, %v before: the check consumed", after, before)
		}
	})
}

const dryYAML = `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: strict, algorithm: fixed-window, limit: 1, period: 1h}
  - {name: trial, algorithm: sliding-log, limit: 5, period: 1h, dry_run: true}
  - {name: wide, algorithm: token-bucket, limit: 100, period: 1h}
default_policy: strict
clients:
  - {name: partner-d, api_key_sha256: KEY_D, policy: [strict, trial, wide]}
`

// A dry-run policy is decided in the same atomic call as the enforced ones and consumes nothing
// when an enforced one refuses; and the metrics count a policy that would have allowed a refused
// request as not_consumed, not allowed.
func TestDryRunAndMetricsTellTheTruth(t *testing.T) {
	yaml := strings.ReplaceAll(dryYAML, "KEY_D", sum("key-d"))
	forEachEngine(t, func(t *testing.T, engine string) {
		up := newUpstream(t)
		gw, srv := start(t, engine, yaml, up)
		admin := httptest.NewServer(srv.Admin())
		defer admin.Close()
		for i, want := range []int{200, 429, 429} {
			if r := get(t, gw.URL+"/x", "X-API-Key", "key-d"); r.StatusCode != want {
				t.Fatalf("request %d: %d, want %d", i, r.StatusCode, want)
			}
		}
		resp, err := http.Get(admin.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range []string{
			`sluice_decisions_total{client="partner-d",policy="strict",result="allowed"} 1`,
			`sluice_decisions_total{client="partner-d",policy="strict",result="refused"} 2`,
			`sluice_decisions_total{client="partner-d",policy="wide",result="allowed"} 1`,
			`sluice_decisions_total{client="partner-d",policy="wide",result="not_consumed"} 2`,
			`sluice_decisions_total{client="partner-d",policy="trial",result="not_consumed"} 2`,
		} {
			if !strings.Contains(string(body), line) {
				t.Errorf("metrics lack %s:\n%s", line, grep(string(body), "sluice_decisions_total"))
			}
		}
		for _, c := range []struct {
			policy string
			left   string
		}{{"trial", `"remaining":4`}, {"wide", `"remaining":99`}} {
			_, body := postCheck(t, admin.URL, `{"client":"partner-d","policy":"`+c.policy+`","cost":0}`)
			if !bytes.Contains(body, []byte(c.left)) {
				t.Fatalf("%s after 1 passed and 2 refused by strict: %s, want %s (only the passed request consumed)", c.policy, body, c.left)
			}
		}
	})
}
