package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// On a real Redis Cluster: slot agrees with the cluster's own CLUSTER KEYSLOT, and decisions
// from many goroutines on several clients at once — batched, one script call per hash slot among
// those waiting together — are exact: each client gets exactly its limit, whatever the batches.
func TestClusterBatchesBySlot(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	for _, k := range []string{"", "a", "123456789", "rate-limit:{customer-42}:orders-api", "{}x", "x{}y{z}",
		"{a}{b}", "a{b", "a}b{c}", "pre{fix}:{customer}:p", "rate-limit:{naïve ✓}:p", "{" + string(make([]byte, 300)) + "}"} {
		want, err := cluster.Servers[0].Do("CLUSTER", "KEYSLOT", k)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(slot(k)); got != want {
			t.Errorf("slot(%q) = %s, Redis says %s", k, got, want)
		}
	}

	clock := sluice.NewManualClock(time.UnixMicro(1_000_000_000)) // frozen: the exact counts are known
	s, err := New(Options{Addrs: cluster.Addrs(), Clock: clock, NegativeCacheSize: -1, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c := s.conn.Load(); c == nil || c.batch == nil || !c.batch.cluster {
		t.Fatal("the store does not batch on a cluster")
	}
	const clients, limit, goroutines, perGoroutine = 6, 40, 48, 10
	p := sluice.Policy{Name: "grouped", Algorithm: sluice.FixedWindow, Limit: limit, Period: time.Hour}
	for round := 0; round < 3; round++ {
		var approved [clients]atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		before := s.Stats().Calls
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < perGoroutine; i++ {
					c := (g + i) % clients
					d, err := s.Decide(context.Background(), fmt.Sprintf("round-%d-client-%d", round, c), p, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						approved[c].Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		for c := range approved {
			if got := approved[c].Load(); got != limit {
				t.Fatalf("round %d: client %d got %d approvals, want exactly %d", round, c, got, limit)
			}
		}
		calls := s.Stats().Calls - before
		t.Logf("round %d: %d decisions in %d script calls", round, goroutines*perGoroutine, calls)
		if calls >= goroutines*perGoroutine {
			t.Errorf("round %d: %d decisions took %d script calls: nothing was grouped", round, goroutines*perGoroutine, calls)
		}
	}
}
