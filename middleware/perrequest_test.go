package middleware_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/store/memory"
	redisstore "github.com/sluicehq/sluice/store/redis"
)

// Contracts by tenant, as an application would look them up: gold 3 an hour, silver 2 an hour
// and, shared by every client of the tenant, 4 a day; free has none.
var (
	goldHourly   = sluice.Policy{Name: "gold", Algorithm: sluice.FixedWindow, Limit: 3, Period: time.Hour}
	silverHourly = sluice.Policy{Name: "silver", Algorithm: sluice.FixedWindow, Limit: 2, Period: time.Hour}
	silverDaily  = sluice.Policy{Name: "silver-daily", Algorithm: sluice.FixedWindow, Limit: 4, Period: 24 * time.Hour}
	contracts    = map[string][]sluice.Limit{
		"gold":   {{Policy: goldHourly}},
		"silver": {{Policy: silverHourly}, {Key: "tenant:silver", Policy: silverDaily}},
	}
)

func byClient(r *http.Request) (string, error) {
	if c := r.Header.Get("X-Client"); c != "" {
		return "client:" + c, nil
	}
	return "", errors.New("say who you are in X-Client")
}

func byTenant(r *http.Request) []sluice.Limit { return contracts[r.Header.Get("X-Tenant")] }

// policyless is a Limiter without a policy of its own on the memory store.
func policyless(t *testing.T) *sluice.Limiter {
	t.Helper()
	lim, err := sluice.New(memory.New(memory.WithClock(sluice.NewManualClock(time.Unix(1_000_000, 0)))))
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// Each request is decided under its tenant's contract, with a Limiter that has no policy of its
// own: gold's 3 an hour per client; silver's 2 an hour per client and 4 a day for the tenant, all
// or nothing; free, no policy: unlimited, without fields. Each answer's fields are its own
// policies'.
func TestPerRequestPolicies(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			lim := policyless(t)
			if store == "redis" {
				st := openRedis(t)
				var err error
				if lim, err = sluice.New(st); err != nil {
					t.Fatal(err)
				}
			}
			srv, served := serve(t, lim, middleware.KeyFunc(byClient), middleware.Limits(byTenant))
			for i, c := range []struct {
				client, tenant string
				status         int
				policy, limit  string
			}{
				{"a", "gold", 200, `"gold";q=3;w=3600`, `"gold";r=2;t=`},
				{"a", "gold", 200, `"gold";q=3;w=3600`, `"gold";r=1;t=`},
				{"a", "gold", 200, `"gold";q=3;w=3600`, `"gold";r=0;t=`},
				{"a", "gold", 429, `"gold";q=3;w=3600`, `"gold";r=0;t=`},
				{"s1", "silver", 200, `"silver";q=2;w=3600, "silver-daily";q=4;w=86400`, `"silver";r=1;t=`},
				{"s1", "silver", 200, `"silver";q=2;w=3600, "silver-daily";q=4;w=86400`, `"silver";r=0;t=`},
				{"s1", "silver", 429, `"silver";q=2;w=3600, "silver-daily";q=4;w=86400`, `"silver";r=0;t=`}, // its own hourly refuses; the tenant's daily keeps its 2
				{"s2", "silver", 200, "", `"silver-daily";r=1;t=`},
				{"s2", "silver", 200, "", `"silver-daily";r=0;t=`},
				{"s3", "silver", 429, "", `"silver-daily";r=0;t=`}, // the tenant's daily refuses s3's fresh hourly
				{"f", "free", 200, "", ""},
				{"f", "free", 200, "", ""},
			} {
				r, body := do(t, srv.URL, "X-Client", c.client, "X-Tenant", c.tenant)
				pol, rl := r.Header.Get("RateLimit-Policy"), strings.Join(r.Header.Values("RateLimit"), ", ")
				if r.StatusCode != c.status || (c.policy != "" && pol != c.policy) || !strings.Contains(rl, c.limit) {
					t.Fatalf("step %d (%s of %s): %d RateLimit-Policy %q RateLimit %q %s; want %d %q %q", i, c.client, c.tenant, r.StatusCode, pol, rl, body, c.status, c.policy, c.limit)
				}
				if c.tenant == "free" && (pol != "" || rl != "") {
					t.Fatalf("step %d: a request under no policy got fields %q %q", i, pol, rl)
				}
			}
			if served.Load() != 9 {
				t.Fatalf("the handler served %d, want 9", served.Load())
			}
		})
	}
}

// A limit's own Cost is its cost; a limit whose Cost is 0 costs what CostFunc says (default 1).
// An unnamed policy is named by its numbers in the fields.
func TestPerRequestCosts(t *testing.T) {
	lim := policyless(t)
	perMinute := sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 10, Period: time.Minute}
	tokens := sluice.Policy{Name: "tokens", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Minute}
	srv, _ := serve(t, lim,
		middleware.CostFunc(func(r *http.Request) int64 { return 2 }),
		middleware.Limits(func(r *http.Request) []sluice.Limit {
			return []sluice.Limit{{Policy: perMinute}, {Policy: tokens, Cost: 30}}
		}))
	r, _ := do(t, srv.URL)
	if r.StatusCode != 200 || r.Header.Get("RateLimit-Policy") != `"fixed-window/10/1m0s/0";q=10;w=60, "tokens";q=100;w=60` ||
		!strings.Contains(r.Header.Get("RateLimit"), `"fixed-window/10/1m0s/0";r=8;`) || !strings.Contains(r.Header.Get("RateLimit"), `"tokens";r=70;`) {
		t.Fatalf("%d %q %q", r.StatusCode, r.Header.Get("RateLimit-Policy"), r.Header.Get("RateLimit"))
	}
	for i := 0; i < 2; i++ {
		do(t, srv.URL)
	}
	// 3×30 = 90 tokens: a fourth request (30 more) is refused by tokens alone.
	r, body := do(t, srv.URL)
	if r.StatusCode != 429 || !strings.Contains(body, `"violated-policies":["tokens"]`) {
		t.Fatalf("the fourth: %d %s", r.StatusCode, body)
	}
}

// Exempt requests pass untouched: not keyed (KeyFunc would refuse them), not counted, no fields,
// even when the quota is spent; the others are limited as before.
func TestExempt(t *testing.T) {
	lim := limiter(t, sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Hour})
	var keyed atomic.Int32
	srv, served := serve(t, lim,
		middleware.KeyFunc(func(r *http.Request) (string, error) { keyed.Add(1); return byClient(r) }),
		middleware.Exempt(func(r *http.Request) bool { return r.URL.Path == "/healthz" }))
	for i := 0; i < 3; i++ {
		r, _ := do(t, srv.URL+"/healthz")
		if r.StatusCode != 200 || len(r.Header.Values("RateLimit")) != 0 || len(r.Header.Values("RateLimit-Policy")) != 0 {
			t.Fatalf("exempt request %d: %d %v", i, r.StatusCode, r.Header)
		}
	}
	if keyed.Load() != 0 {
		t.Fatalf("KeyFunc was called %d times for exempt requests", keyed.Load())
	}
	if r, _ := do(t, srv.URL+"/orders", "X-Client", "a"); r.StatusCode != 200 || r.Header.Get("RateLimit") == "" {
		t.Fatalf("the first limited request: %d (the exempt ones counted?)", r.StatusCode)
	}
	if r, _ := do(t, srv.URL+"/orders", "X-Client", "a"); r.StatusCode != 429 {
		t.Fatalf("the second limited request: %d", r.StatusCode)
	}
	if r, _ := do(t, srv.URL+"/healthz", "X-Client", "a"); r.StatusCode != 200 || r.Header.Get("RateLimit") != "" {
		t.Fatalf("an exempt request of a client whose quota is spent: %d %q", r.StatusCode, r.Header.Get("RateLimit"))
	}
	if served.Load() != 5 {
		t.Fatalf("served %d, want 5", served.Load())
	}
}

// OnRefused writes the refusal: its own body, with the RateLimit fields and Retry-After already
// set (and the legacy ones); what it is told says who, how long and why; a function that removes
// a field or writes nothing is obeyed (a bare 429). Only refusals go to it: a store that cannot
// decide keeps its 503 problem.
func TestOnRefused(t *testing.T) {
	clock := sluice.NewManualClock(time.Unix(1_000_000, 0))
	lim := limiter(t, sluice.Policy{Name: "api", Algorithm: sluice.TokenBucket, Limit: 1, Period: 2 * time.Second, Burst: 1}, memory.WithClock(clock))
	var mu sync.Mutex // the handler runs on the server's goroutines
	var got middleware.Refusal
	mode := "body"
	setMode := func(m string) { mu.Lock(); mode = m; mu.Unlock() }
	srv, served := serve(t, lim, middleware.KeyFunc(byClient), middleware.LegacyHeaders(),
		middleware.OnRefused(func(w http.ResponseWriter, r *http.Request, info middleware.Refusal) {
			mu.Lock()
			defer mu.Unlock()
			got = info
			switch mode {
			case "body":
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprintf(w, "slow down, %s: %d policies refused, retry in %v", info.Key, len(info.Refusing), info.RetryAfter)
			case "no retry-after":
				w.Header().Del("Retry-After")
				w.WriteHeader(http.StatusServiceUnavailable)
			case "nothing":
			}
		}))
	do(t, srv.URL, "X-Client", "a")
	r, body := do(t, srv.URL, "X-Client", "a")
	if r.StatusCode != 429 || body != "slow down, client:a: 1 policies refused, retry in 2s" || r.Header.Get("Content-Type") != "text/plain" ||
		r.Header.Get("Retry-After") != "2" || r.Header.Get("RateLimit") != `"api";r=0;t=2` || r.Header.Get("RateLimit-Policy") != `"api";q=1;w=2` ||
		r.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Fatalf("custom refusal: %d %q %v", r.StatusCode, body, r.Header)
	}
	mu.Lock()
	told := got
	mu.Unlock()
	if got := told; got.Key != "client:a" || got.RetryAfter != 2*time.Second || len(got.Decisions) != 1 || got.Decisions[0].Policy.Name != "api" ||
		len(got.Refusing) != 1 || got.Decisions[0].Decision.Allowed || got.Problem.Status != 429 || got.Problem.RetryAfter != 2 {
		t.Fatalf("the refusal told: %+v", got)
	}
	setMode("no retry-after")
	if r, _ := do(t, srv.URL, "X-Client", "a"); r.StatusCode != 503 || r.Header.Get("Retry-After") != "" || r.Header.Get("RateLimit") == "" {
		t.Fatalf("a function that removes Retry-After: %d %v", r.StatusCode, r.Header)
	}
	setMode("nothing")
	if r, body := do(t, srv.URL, "X-Client", "a"); r.StatusCode != 429 || body != "" || r.Header.Get("Retry-After") != "2" {
		t.Fatalf("a function that writes nothing: %d %q %v", r.StatusCode, body, r.Header)
	}
	if served.Load() != 1 {
		t.Fatalf("served %d, want 1", served.Load())
	}
	clock.Advance(2 * time.Second)
	if r, _ := do(t, srv.URL, "X-Client", "a"); r.StatusCode != 200 {
		t.Fatalf("after Retry-After: %d", r.StatusCode)
	}

	// A store that cannot decide is not a refusal: the 503 problem, not the function.
	rs := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	down, _ := sluice.NewLimiter(st, sluice.Policy{Name: "api", Algorithm: sluice.FixedWindow, Limit: 1, Period: time.Minute})
	var called atomic.Bool
	srv2, _ := serve(t, down, middleware.OnRefused(func(http.ResponseWriter, *http.Request, middleware.Refusal) { called.Store(true) }))
	rs.Kill()
	if r, body := do(t, srv2.URL); r.StatusCode != 503 || !strings.Contains(body, "store-unavailable") || called.Load() {
		t.Fatalf("store down: %d %s (OnRefused called)", r.StatusCode, body)
	}
}

// A Limiter without a policy and without Limits is the program's mistake: every request is a 500
// that says so, nothing panics, nothing is served, nothing passes unlimited.
func TestPolicylessLimiterWithoutLimits(t *testing.T) {
	srv, served := serve(t, policyless(t))
	r, body := do(t, srv.URL)
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("%d %s: %v", r.StatusCode, body, err)
	}
	if r.StatusCode != 500 || p.Status != 500 || !strings.Contains(p.Detail, "no policy of its own") || !strings.Contains(p.Detail, "was not served") || served.Load() != 0 {
		t.Fatalf("%d %s (served %d)", r.StatusCode, body, served.Load())
	}
}

// An invalid per-request policy, or one (key, policy) twice, is a 500 naming the mistake, and
// nothing is decided: the valid limits of that request keep their quota.
func TestInvalidPerRequestLimits(t *testing.T) {
	lim := policyless(t)
	var ls []sluice.Limit
	srv, served := serve(t, lim, middleware.Limits(func(*http.Request) []sluice.Limit { return ls }))
	for _, c := range []struct {
		ls   []sluice.Limit
		want string
	}{
		{[]sluice.Limit{{Policy: goldHourly}, {Policy: sluice.Policy{Name: "broken", Algorithm: sluice.FixedWindow, Limit: 0, Period: time.Second}}},
			`limits[1]: invalid policy: policy \"broken\": limit 0 must be \u003e 0`},
		{[]sluice.Limit{{Policy: goldHourly}, {Key: "ip:127.0.0.1", Policy: goldHourly}},
			`limits[0] and limits[1] both count policy \"gold\" under one key`},
	} {
		ls = c.ls
		r, body := do(t, srv.URL)
		if r.StatusCode != 500 || !strings.Contains(body, c.want) {
			t.Fatalf("%d %s; want a 500 saying %s", r.StatusCode, body, c.want)
		}
	}
	if served.Load() != 0 {
		t.Fatalf("served %d", served.Load())
	}
	if d, _ := lim.AllowPolicy(t.Context(), "ip:127.0.0.1", goldHourly, 0); d.Remaining != 3 {
		t.Fatalf("gold after the refused requests: %d left, want 3", d.Remaining)
	}
}

// The Limiter's failure mode applies to per-request policies: Redis killed, fail-closed is a 503
// problem, fail-open passes.
func TestPerRequestFailureModes(t *testing.T) {
	rs := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	closed, _ := sluice.New(st)
	open, _ := sluice.New(st, sluice.WithFailureMode(sluice.FailOpen))
	limits := middleware.Limits(func(*http.Request) []sluice.Limit { return []sluice.Limit{{Policy: goldHourly}} })
	srvClosed, _ := serve(t, closed, limits)
	srvOpen, servedOpen := serve(t, open, limits)
	if r, _ := do(t, srvClosed.URL); r.StatusCode != 200 {
		t.Fatalf("Redis up: %d", r.StatusCode)
	}
	rs.Kill()
	if r, body := do(t, srvClosed.URL); r.StatusCode != 503 || !strings.Contains(body, "store-unavailable") {
		t.Fatalf("fail-closed, Redis down: %d %s", r.StatusCode, body)
	}
	for i := 0; i < 5; i++ { // beyond gold's 3: the store cannot count, fail-open lets them through
		if r, _ := do(t, srvOpen.URL); r.StatusCode != 200 {
			t.Fatalf("fail-open, Redis down, request %d: %d", i, r.StatusCode)
		}
	}
	if servedOpen.Load() != 5 {
		t.Fatalf("fail-open served %d, want 5", servedOpen.Load())
	}
}

// openRedis opens a store on a real redis-server of its own.
func openRedis(t *testing.T) *redisstore.Store {
	t.Helper()
	rs := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{rs.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
