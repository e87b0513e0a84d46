package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// serve runs the middleware around a handler that counts what reaches it, on a real server.
func serve(t *testing.T, lim *sluice.Limiter, opts ...middleware.Option) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var served atomic.Int32
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); io.WriteString(w, "ok") })
	srv := httptest.NewServer(middleware.New(lim, opts...)(next))
	t.Cleanup(srv.Close)
	return srv, &served
}

func do(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(body)
}

func limiter(t *testing.T, p sluice.Policy, opts ...memory.Option) *sluice.Limiter {
	t.Helper()
	lim, err := sluice.NewLimiter(memory.New(opts...), p)
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// By the peer's address: two pass, the third is a 429 with Retry-After, the RateLimit fields and
// a problem body, and never reaches the handler; after Retry-After it passes again.
func TestRefusesWithAnswerPeopleCanActOn(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1_000_000, 0))
	lim := limiter(t, sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 1, Period: 2 * time.Second, Burst: 2}, memory.WithClock(clock))
	srv, served := serve(t, lim)
	for i := 0; i < 2; i++ {
		if r, _ := do(t, srv.URL); r.StatusCode != 200 || r.Header.Get("RateLimit-Policy") != `"api";q=1;w=2` {
			t.Fatalf("request %d: %d %q", i, r.StatusCode, r.Header.Get("RateLimit-Policy"))
		}
	}
	r, body := do(t, srv.URL)
	var p struct {
		Type       string   `json:"type"`
		Violated   []string `json:"violated-policies"`
		RetryAfter int      `json:"retry-after"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != 429 || r.Header.Get("Retry-After") != "2" || r.Header.Get("RateLimit") != `"api";r=0;t=2` ||
		p.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || len(p.Violated) != 1 || p.RetryAfter != 2 {
		t.Fatalf("refusal: %d Retry-After %q RateLimit %q %s", r.StatusCode, r.Header.Get("Retry-After"), r.Header.Get("RateLimit"), body)
	}
	if served.Load() != 2 {
		t.Fatalf("the handler served %d, want 2", served.Load())
	}
	clock.Advance(2 * time.Second)
	if r, _ := do(t, srv.URL); r.StatusCode != 200 {
		t.Fatalf("after Retry-After: %d", r.StatusCode)
	}
}

// KeyFunc and CostFunc: clients are limited apart, a report costs 3 of 4, and a cost beyond the
// policy is a 400 that says retrying will not help; a KeyFunc error is a 400.
func TestKeyAndCost(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1_000_000, 0))
	lim := limiter(t, sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 4, Period: time.Hour}, memory.WithClock(clock))
	srv, _ := serve(t, lim,
		middleware.KeyFunc(func(r *http.Request) (string, error) {
			if k := r.Header.Get("X-Client"); k != "" {
				return "client:" + k, nil
			}
			return "", errors.New("say who you are in X-Client")
		}),
		middleware.CostFunc(func(r *http.Request) int64 {
			switch r.URL.Path {
			case "/report":
				return 3
			case "/huge":
				return 5
			}
			return 1
		}))
	if r, _ := do(t, srv.URL+"/report", "X-Client", "a"); r.StatusCode != 200 || !strings.Contains(r.Header.Get("RateLimit"), "r=1") {
		t.Fatalf("a's report: %d %q", r.StatusCode, r.Header.Get("RateLimit"))
	}
	if r, _ := do(t, srv.URL+"/report", "X-Client", "a"); r.StatusCode != 429 {
		t.Fatalf("a's second report: %d", r.StatusCode)
	}
	if r, _ := do(t, srv.URL+"/report", "X-Client", "b"); r.StatusCode != 200 {
		t.Fatalf("b's report: %d (b is limited apart from a)", r.StatusCode)
	}
	if r, body := do(t, srv.URL+"/huge", "X-Client", "c"); r.StatusCode != 400 || !strings.Contains(body, "cost-exceeds-limit") {
		t.Fatalf("cost 5 on a limit of 4: %d %s", r.StatusCode, body)
	}
	if r, body := do(t, srv.URL+"/x"); r.StatusCode != 400 || !strings.Contains(body, "X-Client") {
		t.Fatalf("no key: %d %s", r.StatusCode, body)
	}
}

// A leaky bucket holds the request for its delay, then serves it; a client that leaves while
// held is not served.
func TestLeakyBucketHolds(t *testing.T) {
	lim := limiter(t, sluice.Policy{Name: "queue", Algorithm: sluice.LeakyBucket, Limit: 10, Period: time.Second, Burst: 5})
	srv, served := serve(t, lim)
	do(t, srv.URL) // takes the slot; the next is held 100ms
	start := time.Now()
	if r, _ := do(t, srv.URL); r.StatusCode != 200 || time.Since(start) < 90*time.Millisecond {
		t.Fatalf("held request: %d after %v, want 200 after ~100ms", r.StatusCode, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a request held ~100ms returned before its client's 20ms deadline")
	}
	time.Sleep(200 * time.Millisecond) // past the hold: had it been served, it would be by now
	if served.Load() != 2 {
		t.Fatalf("the handler served %d, want 2 (not the abandoned one)", served.Load())
	}
}

// A store that cannot decide (Redis killed, fail-closed) is a 503 with its own problem type,
// and nothing reaches the handler.
func TestStoreDownIs503(t *testing.T) {
	rs := redistest.Start(t)
	store, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	lim, err := sluice.NewLimiter(store, sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv, served := serve(t, lim)
	if r, _ := do(t, srv.URL); r.StatusCode != 200 {
		t.Fatalf("Redis up: %d", r.StatusCode)
	}
	rs.Kill()
	r, body := do(t, srv.URL)
	if r.StatusCode != 503 || !strings.Contains(body, "store-unavailable") || served.Load() != 1 {
		t.Fatalf("Redis down: %d %s (served %d)", r.StatusCode, body, served.Load())
	}
}

// A leaky-bucket request that would be held longer than MaxDelay is refused and consumes
// nothing: 20 at once on 10 in 10s with room for 100, MaxDelay 2s, are 3 held and 17 refused,
// and the queue is left exactly 3s deep (the store's clock stands still), not 20s.
func TestHeldTooLongConsumesNothing(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1_000_000, 0))
	lim := limiter(t, sluice.Policy{Name: "queue", Algorithm: sluice.LeakyBucket, Limit: 10, Period: 10 * time.Second, Burst: 100}, memory.WithClock(clock))
	srv, served := serve(t, lim, middleware.MaxDelay(2*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	refused := make(chan string, 20)
	for i := 0; i < 20; i++ {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return // held, then abandoned
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusTooManyRequests {
				refused <- resp.Header.Get("Retry-After")
			}
		}()
	}
	for i := 0; i < 17; i++ {
		select {
		case ra := <-refused:
			if ra != "1" {
				t.Errorf("Retry-After %q, want 1 (until the hold would be 2s)", ra)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d refusals, want 17", i)
		}
	}
	d, err := lim.AllowN(context.Background(), "ip:127.0.0.1", 0)
	if err != nil || d.ResetAfter != 3*time.Second {
		t.Fatalf("the queue drains in %v (%v) after 3 held and 17 refused, want 3s: the refusals consumed", d.ResetAfter, err)
	}
	cancel()
	if n := served.Load(); n > 1 {
		t.Fatalf("%d served at once, want at most the one not held", n)
	}
}

// A negative cost is the invalid-cost problem, as /v1/check and the gateway answer it.
func TestNegativeCostIsInvalidCost(t *testing.T) {
	lim := limiter(t, sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second})
	srv, served := serve(t, lim, middleware.CostFunc(func(*http.Request) int64 { return -2 }))
	resp, body := do(t, srv.URL)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "cost -2 is negative") || served.Load() != 0 {
		t.Fatalf("negative cost: %d %s (served %d), want the invalid-cost 400", resp.StatusCode, body, served.Load())
	}
}
