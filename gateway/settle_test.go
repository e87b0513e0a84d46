package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestSettleAfterResponse: on both engines, a route's cost_from settles each request with the
// upstream's usage header, and refund_on refunds a listed status and an upstream that gave no
// response at all (the connection dropped: the gateway answers 502 itself); a route without the
// fields keeps its cost.
func TestSettleAfterResponse(t *testing.T) {
	forEachEngine(t, func(t *testing.T, engine string) {
		up := &upstream{count: map[string]int{}}
		up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			switch {
			case q.Has("drop"): // no response: the connection is closed under the proxy
				c, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					c.Close()
				}
				return
			case q.Has("status"):
				w.Header().Set("X-Usage", "1") // ignored: refund_on comes first
				if q.Get("status") == "429" {
					w.WriteHeader(http.StatusTooManyRequests)
				}
				return
			}
			w.Header().Set("X-Usage", q.Get("used"))
		}))
		t.Cleanup(up.Close)
		fe, srv := start(t, engine, `
upstream: UPSTREAM
identity:
  - api_key: {header: X-API-Key}
policies:
  - {name: tokens, algorithm: fixed-window, limit: 1000, period: 1000h}
clients:
  - {name: partner, api_key_sha256: `+sum("k")+`, policy: tokens}
routes:
  - path_prefix: /metered
    cost: 100
    cost_from: {header: x-usage}
    refund_on: [429]
  - path_prefix: /plain
    cost: 100
`, up)
		p := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 1000, Period: 1000 * time.Hour}
		left := func() int64 {
			d, err := srv.Store().Decide(context.Background(), "partner", p, 0)
			if err != nil {
				t.Fatal(err)
			}
			return d.Remaining
		}
		want := int64(1000)
		for i, s := range []struct {
			path   string
			status int
			cost   int64
		}{
			{"/metered?used=30", 200, 30},
			{"/metered?used=250", 200, 250},
			{"/metered?status=429", 429, 0},
			{"/metered?drop=1", 502, 0},
			{"/metered?used=abc", 200, 100},
			{"/plain?used=5", 200, 100},
			{"/metered?used=0", 200, 0},
		} {
			resp := get(t, fe.URL+s.path, "X-API-Key", "k")
			if resp.StatusCode != s.status {
				t.Fatalf("step %d %s: status %d, want %d", i, s.path, resp.StatusCode, s.status)
			}
			want -= s.cost
			if got := left(); got != want {
				t.Fatalf("step %d %s: %d left, want %d", i, s.path, got, want)
			}
		}
	})
}
