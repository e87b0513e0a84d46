package main

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// budgetConfig is an instance on Redis with two policies of local_budget size 10, one per
// route, each counting per path (key_by: [path]), so that every round has fresh counters.
func budgetConfig(upstreamURL, redisAddr string) configFunc {
	return func(listen, admin string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
upstream: %s
store:
  type: redis
  addrs: [%s]
  timeout: 2s
identity:
  - ip: {}
policies:
  - name: fw
    algorithm: fixed-window
    limit: 300
    period: 1h
    key_by: [path]
    local_budget: {size: 10, max_age: 1m}
  - name: tb
    algorithm: token-bucket
    limit: 100
    period: 1s
    burst: 200
    key_by: [path]
    local_budget: {size: 10, max_age: 100ms}
  - {name: open, algorithm: token-bucket, limit: 1000000, period: 1s}
default_policy: open
routes:
  - {path_prefix: /fw/, policy: fw}
  - {path_prefix: /tb/, policy: tb}
`, listen, admin, upstreamURL, redisAddr)
	}
}

// TestServeE2ELocalBudgetsThreeInstances: three gateway processes with local budgets on one real
// Redis, hammered on one key (one path, one client) from many connections to all three: the
// requests let through never exceed the documented bound, in every round — fixed window: the
// limit in each window the round touched (by Redis's clock, this machine's); token bucket: its
// burst plus its rate over the round, the round starting from a full bucket of a fresh key —
// and exactly those reach the upstream; every refusal is a 429 with a Retry-After, which for
// the hour's window is the store's own: the rest of the hour.
func TestServeE2ELocalBudgetsThreeInstances(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	procs := startThree(t, budgetConfig(up.URL, rs.Addr))
	const workers, perWorker, rounds = 24, 40, 3
	for round := range rounds {
		for _, c := range []struct {
			name         string
			limit, burst int64
			period       time.Duration
		}{{"fw", 300, 0, time.Hour}, {"tb", 100, 200, time.Second}} {
			path := fmt.Sprintf("/%s/round-%d", c.name, round)
			var allowed, refused atomic.Int64
			var wg sync.WaitGroup
			startRedis := redisNow(t, rs)
			start := time.Now()
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range perWorker {
						r, err := tryGet(procs[w%len(procs)].proxy, path)
						if err != nil {
							t.Error(err)
							return
						}
						switch r.status {
						case http.StatusOK:
							allowed.Add(1)
						case http.StatusTooManyRequests:
							refused.Add(1)
							ra, err := retryAfter(r.header)
							if err != nil {
								t.Error(err)
								return
							}
							// The window ends at the next whole hour of Redis's clock: from the
							// round's start, less the few seconds of the round.
							if c.name == "fw" {
								left := c.period - time.Duration(startRedis%c.period.Microseconds())*time.Microsecond
								if want := int64((left + time.Second - 1) / time.Second); ra < want-10 || ra > want {
									t.Errorf("Retry-After %d; want the window's rest, %d", ra, want)
								}
							}
						default:
							t.Errorf("status %d: %s", r.status, r.body)
							return
						}
					}
				}()
			}
			wg.Wait()
			span := time.Since(start)
			endRedis := redisNow(t, rs)
			n := allowed.Load()
			var bound int64
			if c.name == "tb" {
				bound = c.burst + c.limit*int64(span)/int64(c.period)
			} else {
				period := c.period.Microseconds()
				bound = c.limit * (endRedis/period - startRedis/period + 1)
			}
			if n > bound {
				t.Errorf("round %d %s: %d let through in %v; the bound is %d", round, c.name, n, span, bound)
			}
			if n < c.limit/2 {
				t.Errorf("round %d %s: only %d of %d let through", round, c.name, n, workers*perWorker)
			}
			if got := up.count(path); int64(got) != n {
				t.Errorf("round %d %s: the upstream got %d, the clients %d answers 200", round, c.name, got, n)
			}
			t.Logf("round %d %s: %d let through (bound %d), %d refused, in %v", round, c.name, n, bound, refused.Load(), span)
		}
	}
}

// redisNow is Redis's clock (TIME) in µs.
func redisNow(t *testing.T, rs *redistest.Server) int64 {
	t.Helper()
	r, err := rs.Do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(r, "\n")
	if len(parts) != 2 {
		t.Fatalf("TIME replied %q", r)
	}
	sec, err1 := strconv.ParseInt(parts[0], 10, 64)
	usec, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME replied %q", r)
	}
	return sec*1_000_000 + usec
}

// TestServeE2ELocalBudgetsFollowReload: with a local_budget of 10, 30 requests cost Redis about
// 3 script calls; once a reload has removed the budget, every request is a call of its own.
func TestServeE2ELocalBudgetsFollowReload(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	up := newUpstream(t)
	p := startSluice(t, t.TempDir(), "sluice.yaml", budgetConfig(up.URL, rs.Addr))
	scripts := func() int64 { // script calls Redis has run
		r, err := rs.Do("INFO", "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(r, "\r\n") {
			for _, cmd := range []string{"cmdstat_fcall:calls=", "cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if v, ok := strings.CutPrefix(line, cmd); ok {
					c, _, _ := strings.Cut(v, ",")
					k, err := strconv.ParseInt(c, 10, 64)
					if err != nil {
						t.Fatalf("INFO commandstats: %q", line)
					}
					n += k
				}
			}
		}
		return n
	}
	send := func(path string) int64 {
		before := scripts()
		for range 30 {
			if r := get(t, p.proxy, path); r.status != http.StatusOK {
				t.Fatalf("%s: %d %s", path, r.status, r.body)
			}
		}
		return scripts() - before
	}
	if n := send("/fw/budgeted"); n > 5 {
		t.Errorf("30 requests with a budget of 10 cost %d script calls; want about 3", n)
	}
	cfg, err := os.ReadFile(p.config)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p.config, mustReplace(t, string(cfg), "    local_budget: {size: 10, max_age: 1m}\n", ""))
	p.signal(syscall.SIGHUP)
	p.waitMetric(t, "sluice_config_reloads_total", map[string]string{"result": "ok"}, 1, 10*time.Second)
	if n := send("/fw/exact"); n < 30 {
		t.Errorf("30 requests without a budget after the reload cost %d script calls; want 30", n)
	}
}
