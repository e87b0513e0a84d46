package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/store/redis"
)

// TestLateRepliesUseNoQuota: a decision answered ErrStoreUnavailable used no quota, even when
// its script ran in time and only the reply came after the caller stopped waiting (a store
// timeout — and slow timeout, so that no call waits on for a Redis that answers others — so
// short that replies race it, many decisions at once; another connection stalls
// Redis now and then with DEBUG SLEEP). What Redis counted must equal the approvals answered,
// exactly, once the store is closed (it used to count some of the 503s: a late reply was
// dropped, its charge kept). Decide batched (the default) and unbatched, and DecideAll of two
// limits (the multi script).
func TestLateRepliesUseNoQuota(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "yes") // (DEBUG SLEEP: the stalls)
	const limit = 1_000_000
	p := sluice.Policy{Name: "late", Algorithm: sluice.FixedWindow, Limit: limit, Period: time.Hour}
	q := sluice.Policy{Name: "late2", Algorithm: sluice.FixedWindow, Limit: limit, Period: time.Hour}
	for _, tc := range []struct {
		name     string
		maxBatch int
		multi    bool
	}{{"batched", 0, false}, {"unbatched", 1, false}, {"multi", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := redis.New(redis.Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Millisecond, SlowTimeout: 2 * time.Millisecond, MaxBatch: tc.maxBatch,
				Prefix: "late-" + tc.name + ":", NegativeCacheSize: -1})
			if err != nil {
				t.Fatal(err)
			}
			var approved, failed atomic.Int64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var stalls sync.WaitGroup
			stalls.Go(func() { // Redis stalls now and then: replies pile up behind it
				for {
					select {
					case <-stop:
						return
					case <-time.After(3 * time.Millisecond):
					}
					_, _ = srv.Do("DEBUG", "SLEEP", "0.002")
				}
			})
			for g := range 16 {
				wg.Go(func() {
					for i := range 300 {
						key := fmt.Sprintf("k%d", (g+i)%4)
						var ok bool
						var err error
						if tc.multi {
							var out [2]sluice.Decision
							ok, err = st.DecideAll(context.Background(), key, []sluice.Limit{{Policy: p, Cost: 1}, {Policy: q, Cost: 1}}, out[:])
						} else {
							var d sluice.Decision
							d, err = st.Decide(context.Background(), key, p, 1)
							ok = d.Allowed
						}
						switch {
						case err == nil && ok:
							approved.Add(1)
						case err == nil:
							t.Errorf("refused under a limit of %d", limit)
						case errors.Is(err, sluice.ErrStoreUnavailable):
							failed.Add(1)
						default:
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			close(stop)
			stalls.Wait()
			st.Close() // waits for the give-backs
			check := openStore(t, srv, redis.Options{Timeout: 5 * time.Second, Prefix: "late-" + tc.name + ":", NegativeCacheSize: -1})
			var counted int64
			for k := range 4 {
				for _, pol := range []sluice.Policy{p, q} {
					if pol.Name == q.Name && !tc.multi {
						continue
					}
					d, err := check.Decide(context.Background(), fmt.Sprintf("k%d", k), pol, 0)
					if err != nil {
						t.Fatal(err)
					}
					if pol.Name == p.Name {
						counted += limit - d.Remaining
					}
				}
			}
			t.Logf("%d approved, %d answered unavailable; Redis counted %d", approved.Load(), failed.Load(), counted)
			if failed.Load() == 0 || approved.Load() == 0 {
				t.Logf("(no race this run: %d approved, %d failed)", approved.Load(), failed.Load())
			}
			if counted != approved.Load() {
				t.Errorf("Redis counted %d, the store approved %d: %d decisions answered unavailable used quota", counted, approved.Load(), counted-approved.Load())
			}
		})
	}
}
