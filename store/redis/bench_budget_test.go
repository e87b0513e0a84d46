package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// BenchmarkRedisBudgets measures token-bucket decisions per second from 64 goroutines against
// one local Redis, exact (every decision a script call) and with local budgets of 100 units
// (sluice.Budgeted: a script call per 100 decisions of a key), on 10,000 keys and on one hot
// key, in one run:
//
//	impl=exact        this store, as BenchmarkRedisDecisions's impl=sluice
//	impl=budget-100   the same store under sluice.Budgeted, size 100, max_age 1s
//
// The limit is high so that decisions are approvals.
func BenchmarkRedisBudgets(b *testing.B) {
	srv := redistest.Start(b)
	policy := sluice.Policy{Name: "bench", Algorithm: sluice.TokenBucket, Limit: 1_000_000, Period: time.Second}
	budget := sluice.LocalBudget{Size: 100, MaxAge: time.Second}
	const goroutines = 64
	for _, nkeys := range []int{10_000, 1} {
		keys := make([]string, nkeys)
		for i := range keys {
			keys[i] = fmt.Sprintf("customer-%d", i)
		}
		for _, budgeted := range []bool{false, true} {
			name := fmt.Sprintf("keys=%d/impl=exact", nkeys)
			if budgeted {
				name = fmt.Sprintf("keys=%d/impl=budget-100", nkeys)
			}
			b.Run(name, func(b *testing.B) {
				s, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				var st sluice.Store = s
				if budgeted {
					st = sluice.Budgeted(s, func(sluice.Policy) sluice.LocalBudget { return budget })
				}
				ctx := context.Background()
				calls := s.Stats().Calls
				runDecisions(b, goroutines, keys, func(key string) (bool, error) {
					d, err := st.Decide(ctx, key, policy, 1)
					return d.Allowed, err
				})
				b.ReportMetric(float64(b.N)/float64(max(1, s.Stats().Calls-calls)), "decisions/call")
			})
		}
	}
}
