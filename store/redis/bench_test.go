package redis

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkRedisDecisions measures token-bucket decisions per second and their p50/p99 latency
// from 64 goroutines against one local Redis, on 10,000 keys, in one run with its baselines:
//
//	impl=sluice             this store: rueidis, automatic pipelining, and the decisions that
//	                        wait at once sent as one batch script call (up to 16)
//	impl=sluice-unbatched   this store with MaxBatch 1: one script call per decision, pipelined
//	impl=sluice-scripts[-unbatched]  the same, calling the Lua scripts (EVALSHA) instead of the
//	                        library's functions (FCALL): the store on a server without Functions
//	impl=redis_rate         github.com/go-redis/redis_rate/v10, the library a Go service would
//	                        pick: GCRA (what sluice's token bucket is) with the same rate and
//	                        burst, one script call per decision on go-redis (a pool of 64
//	                        connections, one per caller: its best case)
//	impl=go-redis-evalsha   sluice's script through go-redis, one EVALSHA per round trip (a pool)
//	impl=ceiling            the one-script ceiling: the same 64 callers on rueidis, each decision
//	                        one EVALSHA of a minimal script (one HINCRBY of the key): what Redis
//	                        and the client do for one script call per decision, with no rate
//	                        limiting in it
//	impl=ceiling-sluice-commands  the same with a script of the Redis commands sluice's token
//	                        bucket runs on a key it has not seen (TIME, GET, EXISTS, SET … PX) and
//	                        none of its arithmetic: what of sluice's cost is Redis commands, what
//	                        is its Lua
//	impl=ceiling-go-redis   the minimal script through go-redis (pool of 64): the ceiling of
//	                        redis_rate's client
//	impl=redis-benchmark    redis-benchmark running EVALSHA of sluice's script, -c 64 -P 16: the
//	                        server's own ceiling for this script, no client library in the way
//
// The limit is high so that decisions are approvals (the path that writes); every variant
// reports the share it approved.
func BenchmarkRedisDecisions(b *testing.B) {
	srv := redistest.Start(b)
	policy := sluice.Policy{Name: "bench", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("customer-%d", i)
	}
	const goroutines = 64

	for _, variant := range []struct {
		name     string
		maxBatch int
		scripts  bool
	}{{"impl=sluice", 0, false}, {"impl=sluice-unbatched", 1, false}, {"impl=sluice-scripts", 0, true}, {"impl=sluice-scripts-unbatched", 1, true}} {
		b.Run(variant.name, func(b *testing.B) {
			s, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second, MaxBatch: variant.maxBatch, scripts: variant.scripts})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			calls := s.Stats().Calls
			usec := scriptUsec(srv)
			runDecisions(b, goroutines, keys, func(key string) (bool, error) {
				d, err := s.Decide(ctx, key, policy, 1)
				return d.Allowed, err
			})
			b.ReportMetric(float64(b.N)/float64(s.Stats().Calls-calls), "decisions/call")
			b.ReportMetric(float64(scriptUsec(srv)-usec)/float64(b.N), "redis-µs/decision")
		})
	}

	b.Run("impl=redis_rate", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: goroutines})
		defer c.Close()
		lim := redis_rate.NewLimiter(c)
		limit := redisRateLimit(policy)
		ctx := context.Background()
		runDecisions(b, goroutines, keys, func(key string) (bool, error) {
			r, err := lim.Allow(ctx, "{"+key+"}:bench", limit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		})
	})

	b.Run("impl=go-redis-evalsha", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: goroutines})
		defer c.Close()
		ctx := context.Background()
		script := goredis.NewScript(singleScript(sluice.TokenBucket))
		args := []any{int(sluice.TokenBucket), policy.Limit, policy.PeriodMicros(), policy.Burst, 1, "", 0}
		runDecisions(b, goroutines, keys, func(key string) (bool, error) {
			k := "rate-limit:{" + key + "}:bench"
			r, err := script.Run(ctx, c, []string{k + ":v2", k + ":log"}, args...).Int64Slice()
			return err == nil && r[0] == 1, err
		})
	})

	for _, variant := range []struct{ name, script, prefix string }{
		// (Keys of their own: the minimal script leaves hashes, which GET could not read.)
		{"impl=ceiling", ceilingScript, "ceiling:{"}, {"impl=ceiling-sluice-commands", sluiceCommandsScript, "ceiling-commands:{"},
	} {
		b.Run(variant.name, func(b *testing.B) {
			c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			script := rueidis.NewLuaScript(variant.script)
			ctx := context.Background()
			runDecisions(b, goroutines, keys, func(key string) (bool, error) {
				err := script.Exec(ctx, c, []string{variant.prefix + key + "}"}, nil).Error()
				return err == nil, err
			})
		})
	}

	b.Run("impl=ceiling-go-redis", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: goroutines})
		defer c.Close()
		script := goredis.NewScript(ceilingScript)
		ctx := context.Background()
		runDecisions(b, goroutines, keys, func(key string) (bool, error) {
			err := script.Run(ctx, c, []string{"ceiling:{" + key + "}"}).Err()
			return err == nil, err
		})
	})

	b.Run("impl=redis-benchmark", func(b *testing.B) {
		sha, err := srv.Do("SCRIPT", "LOAD", singleScript(sluice.TokenBucket))
		if err != nil {
			b.Fatal(err)
		}
		n := max(b.N, 50_000)
		start := time.Now()
		out, err := exec.Command("redis-benchmark", "-h", "127.0.0.1", "-p", strconv.Itoa(srv.Port),
			"-c", strconv.Itoa(goroutines), "-P", "16", "-n", strconv.Itoa(n), "-r", "10000", "-q",
			"EVALSHA", sha, "2", "rate-limit:{customer-__rand_int__}:rb:v2", "rate-limit:{customer-__rand_int__}:rb:log",
			strconv.Itoa(int(sluice.TokenBucket)), "1000000", "1000000", "0", "1", "", "0").CombinedOutput()
		elapsed := time.Since(start)
		if err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`([0-9.]+) requests per second`).FindSubmatch(out)
		if m == nil {
			b.Fatalf("redis-benchmark printed no rate:\n%s", out)
		}
		rate, _ := strconv.ParseFloat(string(m[1]), 64)
		b.ReportMetric(rate, "decisions/s")
		b.ReportMetric(float64(elapsed.Nanoseconds())/float64(n), "ns/op")
		b.ReportMetric(0, "p50-µs") // redis-benchmark -q reports no latencies; see its full output
		b.ReportMetric(0, "p99-µs")
	})
}

// redisRateLimit is p as redis_rate spells it: GCRA of rate Limit per Period with burst p's
// capacity, which is what sluice's token bucket decides (TestRedisRateDecidesLikeTokenBucket).
func redisRateLimit(p sluice.Policy) redis_rate.Limit {
	return redis_rate.Limit{Rate: int(p.Limit), Burst: int(p.Capacity()), Period: p.Period}
}

// TestRedisRateDecidesLikeTokenBucket checks that BenchmarkRedisDecisions's redis_rate baseline
// does the work sluice does: on the same Redis, a token bucket of 5 per hour (no refill within
// the test) approves the same first 5 of 8 requests on each key in both.
func TestRedisRateDecidesLikeTokenBucket(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer c.Close()
	lim := redis_rate.NewLimiter(c)
	ctx := context.Background()
	for _, burst := range []int64{0, 3} {
		policy := sluice.Policy{Name: fmt.Sprintf("burst-%d", burst), Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour, Burst: burst}
		for _, key := range []string{"a", "b"} {
			var ours, theirs []bool
			for range 8 {
				d, err := s.Decide(ctx, key, policy, 1)
				if err != nil {
					t.Fatal(err)
				}
				r, err := lim.Allow(ctx, "{"+key+"}:"+policy.Name, redisRateLimit(policy))
				if err != nil {
					t.Fatal(err)
				}
				ours, theirs = append(ours, d.Allowed), append(theirs, r.Allowed > 0)
			}
			if fmt.Sprint(ours) != fmt.Sprint(theirs) {
				t.Errorf("burst %d, key %s: sluice approved %v, redis_rate %v", burst, key, ours, theirs)
			}
			if want := int(policy.Capacity()); countTrue(ours) != want {
				t.Errorf("burst %d, key %s: sluice approved %d of 8, want %d", burst, key, countTrue(ours), want)
			}
		}
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// ceilingScript is the least a script call per decision can do that still writes the key's
// state: one HINCRBY. It reads no clock and sets no TTL.
const ceilingScript = "return redis.call('HINCRBY', KEYS[1], 'n', 1)"

// sluiceCommandsScript runs the Redis commands of one token-bucket approval in single.lua on a
// key not seen within its TTL, as every one in BenchmarkRedisDecisions is (the time, the state
// string, whether an old-format hash or a log is there, the new string with its TTL), with
// nothing computed between them.
const sluiceCommandsScript = `local t = redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('EXISTS', KEYS[1] .. ':old', KEYS[1] .. ':log')
redis.call('SET', KEYS[1], t[1] .. ' ' .. t[2], 'PX', '1000')
return 1`

// BenchmarkRedisClusterDecisions measures the same decisions from 64 goroutines on a local
// 3-master Redis Cluster, batched (one script call per hash slot among the decisions waiting
// together) beside MaxBatch 1 (one script call per decision), on 10,000 clients and on 100 (hot
// clients, whose waiting decisions often share a slot).
func BenchmarkRedisClusterDecisions(b *testing.B) {
	cluster := redistest.StartCluster(b, 3)
	policy := sluice.Policy{Name: "bench", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second}
	for _, nkeys := range []int{10_000, 100, 4} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("customer-%d", i)
		}
		for _, variant := range []struct {
			name     string
			maxBatch int
		}{{"impl=sluice-unbatched", 1}, {"impl=sluice", 0}} {
			b.Run(fmt.Sprintf("keys=%d/%s", nkeys, variant.name), func(b *testing.B) {
				s, err := New(Options{Addrs: cluster.Addrs(), Timeout: time.Second, MaxBatch: variant.maxBatch})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				ctx := context.Background()
				calls := s.Stats().Calls
				runDecisions(b, 64, keys, func(key string) (bool, error) {
					d, err := s.Decide(ctx, key, policy, 1)
					return d.Allowed, err
				})
				b.ReportMetric(float64(b.N)/float64(s.Stats().Calls-calls), "decisions/call")
			})
		}
	}
}

// runDecisions runs b.N decisions from n goroutines (keys picked round-robin per goroutine) and
// reports decisions/s, the p50 and p99 latency of one decision and the share approved.
func runDecisions(b *testing.B, n int, keys []string, decide func(key string) (bool, error)) {
	var next, approved atomic.Int64
	lat := make([][]time.Duration, n)
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				t0 := time.Now()
				ok, err := decide(keys[int(i)%len(keys)])
				if err != nil {
					failed.Store(err)
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
				if ok {
					approved.Add(1)
				}
			}
		}(g)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(approved.Load())/float64(b.N)*100, "%approved")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	}
}

var _ = algorithm.Algorithms

// scriptUsec is the µs Redis has spent in script and function calls (INFO commandstats: FCALL,
// EVALSHA, EVAL).
func scriptUsec(srv *redistest.Server) int64 {
	var total int64
	for _, cmd := range []string{"fcall", "evalsha", "eval"} {
		for _, kv := range strings.Split(srv.Info("commandstats", "cmdstat_"+cmd), ",") {
			if v, ok := strings.CutPrefix(kv, "usec="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}
