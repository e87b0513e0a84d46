package memory_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
	"github.com/sluicehq/sluice/internal/keyhash"
	"github.com/sluicehq/sluice/store/memory"
)

// BenchmarkMemoryAllowParallel measures Limiter.Allow on the memory store from parallel
// goroutines, on one hot key and spread over 10,000 keys, for every algorithm — and, in the same
// run, the baseline: golang.org/x/time/rate limiters in a sharded map[string]*rate.Limiter
// doing the same work (find the key's limiter, create it if missing, decide), twice:
//
//	impl=x-time-rate            rate.Limiter.Allow, which reads time.Now (wall and monotonic
//	                            clock: two clock reads), as a Go service would call it
//	impl=x-time-rate-monotonic  rate.Limiter.AllowN(now, 1) with now read the way the memory
//	                            store reads its time (one monotonic read, time.Since of a start),
//	                            so that both sides pay for the same clock
//
// The limits are high (a million per second) so that decisions are mostly approvals, the path
// that writes state.
func BenchmarkMemoryAllowParallel(b *testing.B) {
	for _, nkeys := range []int{1, 10_000} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("customer-%d", i)
		}
		baseline := sluice.Policy{Name: "bench", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second}
		b.Run(fmt.Sprintf("keys=%d/impl=x-time-rate", nkeys), func(b *testing.B) {
			m := rateMapFor(baseline)
			runParallel(b, keys, func(k string) bool { return m.allow(k) })
		})
		b.Run(fmt.Sprintf("keys=%d/impl=x-time-rate-monotonic", nkeys), func(b *testing.B) {
			m := rateMapFor(baseline)
			start := time.Now()
			runParallel(b, keys, func(k string) bool { return m.allowAt(k, start.Add(time.Since(start))) })
		})
		for _, a := range algorithm.Algorithms {
			b.Run(fmt.Sprintf("keys=%d/impl=%v", nkeys, a), func(b *testing.B) {
				p := sluice.Policy{Name: "bench", Algorithm: a, Limit: 1_000_000, Period: time.Second}
				if a == sluice.LeakyBucket {
					p.Burst = 1_000_000
				}
				lim, err := sluice.NewLimiter(memory.New(), p)
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				runParallel(b, keys, func(k string) bool {
					d, _ := lim.Allow(ctx, k)
					return d.Allowed
				})
			})
		}
	}
}

// BenchmarkMemoryClock measures, from parallel goroutines, the two clocks the baselines above
// read: time.Now (what rate.Limiter.Allow calls) and time.Since of a start (what the memory
// store and impl=x-time-rate-monotonic read), so that the share of a decision that is the clock
// is measured in the same run.
func BenchmarkMemoryClock(b *testing.B) {
	var sink atomic.Int64
	b.Run("impl=time-now", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			var x int64
			for pb.Next() {
				x += time.Now().UnixNano()
			}
			sink.Add(x)
		})
	})
	b.Run("impl=monotonic", func(b *testing.B) {
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			var x int64
			for pb.Next() {
				x += int64(time.Since(start))
			}
			sink.Add(x)
		})
	})
}

// runParallel calls allow from GOMAXPROCS goroutines, each on its own pseudo-random walk over
// the keys (goroutines walking one sequence in step would meet on the same key and lock every
// time, measuring contention instead of decisions), and reports the share approved.
func runParallel(b *testing.B, keys []string, allow func(string) bool) {
	var states, approved atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		x := states.Add(0x9E3779B97F4A7C15) // xorshift64 state, distinct per goroutine
		n := uint64(len(keys))
		ok := uint64(0)
		for pb.Next() {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			if allow(keys[(x>>32)*n>>32]) { // Lemire's multiply-shift: no division in the loop
				ok++
			}
		}
		approved.Add(ok)
	})
	b.ReportMetric(float64(approved.Load())/float64(b.N)*100, "%approved")
}

// rateMap is the baseline: x/time/rate limiters in a sharded map, as a Go service would hold them.
type rateMap struct {
	hash   keyhash.Hasher
	shards []rateShard
	limit  rate.Limit
	burst  int
}

type rateShard struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
	_  [40]byte
}

// rateMapFor returns the baseline for token-bucket policy p: rate Limit per Period, burst p's
// capacity (TestBaselineDecidesLikeTokenBucket).
func rateMapFor(p sluice.Policy) *rateMap {
	return newRateMap(256, rate.Limit(float64(p.Limit)/p.Period.Seconds()), int(p.Capacity()))
}

func newRateMap(n int, limit rate.Limit, burst int) *rateMap {
	r := &rateMap{hash: keyhash.New(), shards: make([]rateShard, n), limit: limit, burst: burst}
	for i := range r.shards {
		r.shards[i].m = map[string]*rate.Limiter{}
	}
	return r
}

// allow decides with Limiter.Allow, which reads time.Now.
func (r *rateMap) allow(key string) bool { return r.limiter(key).Allow() }

// allowAt decides at now, as the memory store does at the time it read before deciding.
func (r *rateMap) allowAt(key string, now time.Time) bool { return r.limiter(key).AllowN(now, 1) }

// limiter returns key's limiter, creating it if missing.
func (r *rateMap) limiter(key string) *rate.Limiter {
	sh := &r.shards[r.hash.String(key)%uint64(len(r.shards))]
	sh.mu.Lock()
	l := sh.m[key]
	if l == nil {
		l = rate.NewLimiter(r.limit, r.burst)
		sh.m[key] = l
	}
	sh.mu.Unlock()
	return l
}

// TestBaselineDecidesLikeTokenBucket checks that both baselines of BenchmarkMemoryAllowParallel
// do the work sluice does: a token bucket of 5 per hour (no refill within the test) approves the
// same first 5 of 8 requests on each key in sluice, in x/time/rate's Allow and in its AllowN at
// the memory store's clock.
func TestBaselineDecidesLikeTokenBucket(t *testing.T) {
	ctx := context.Background()
	for _, burst := range []int64{0, 3} {
		p := sluice.Policy{Name: "t", Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Hour, Burst: burst}
		lim, err := sluice.NewLimiter(memory.New(), p)
		if err != nil {
			t.Fatal(err)
		}
		now, monotonic := rateMapFor(p), rateMapFor(p)
		start := time.Now()
		for _, key := range []string{"a", "b"} {
			var ours, allow, allowAt []bool
			for range 8 {
				d, err := lim.Allow(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				ours = append(ours, d.Allowed)
				allow = append(allow, now.allow(key))
				allowAt = append(allowAt, monotonic.allowAt(key, start.Add(time.Since(start))))
			}
			if fmt.Sprint(ours) != fmt.Sprint(allow) || fmt.Sprint(ours) != fmt.Sprint(allowAt) {
				t.Errorf("burst %d, key %s: sluice approved %v, Allow %v, AllowN %v", burst, key, ours, allow, allowAt)
			}
			n := 0
			for _, ok := range ours {
				if ok {
					n++
				}
			}
			if want := int(p.Capacity()); n != want {
				t.Errorf("burst %d, key %s: sluice approved %d of 8, want %d", burst, key, n, want)
			}
		}
	}
}
