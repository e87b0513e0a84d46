package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	redisstore "github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/storetest"
)

var funcPolicies = []sluice.Policy{
	{Name: "fw", Algorithm: sluice.FixedWindow, Limit: 50, Period: time.Minute},
	{Name: "sl", Algorithm: sluice.SlidingLog, Limit: 50, Period: time.Minute},
	{Name: "sw", Algorithm: sluice.SlidingWindow, Limit: 50, Period: time.Minute},
	{Name: "tb", Algorithm: sluice.TokenBucket, Limit: 50, Period: time.Minute, Burst: 50},
	{Name: "lb", Algorithm: sluice.LeakyBucket, Limit: 50, Period: time.Minute, Burst: 49},
}

// decideEverything makes, under every algorithm, one decision (Decide), n concurrent ones on
// one key (batched when the store batches), and a DecideAll of all five limits on one client
// (the multi function), checking each one's Remaining: the n+1+1 requests are all approved.
func decideEverything(t *testing.T, s *redisstore.Store, client string, n int) {
	t.Helper()
	ctx := context.Background()
	for _, p := range funcPolicies {
		if d, err := s.Decide(ctx, client, p, 1); err != nil || !d.Allowed || d.Remaining != p.Capacity()-1 {
			t.Fatalf("%v, the first decision on %s: %+v %v", p.Algorithm, client, d, err)
		}
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				d, err := s.Decide(ctx, client, p, 1)
				if err == nil && !d.Allowed {
					err = fmt.Errorf("refused: %+v", d)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%v, concurrent decision %d on %s: %v", p.Algorithm, i, client, err)
			}
		}
	}
	limits := make([]sluice.Limit, len(funcPolicies))
	for i, p := range funcPolicies {
		limits[i] = sluice.Limit{Policy: p, Cost: 1}
	}
	out := make([]sluice.Decision, len(limits))
	if ok, err := s.DecideAll(ctx, client, limits, out); err != nil || !ok {
		t.Fatalf("DecideAll on %s: %v %v %+v", client, ok, err, out)
	}
	for i, p := range funcPolicies {
		if want := p.Capacity() - int64(n) - 2; out[i].Remaining != want {
			t.Fatalf("DecideAll on %s, %v: %d remaining, want %d", client, p.Algorithm, out[i].Remaining, want)
		}
	}
}

// TestFunctions: on Redis ≥ 7 the store decides with its function library (FCALL): single
// decisions, batches and DecideAll, and no script call at all; after FUNCTION FLUSH (as after a
// restart without persistence, or a failover to a node that never had it) the next call loads
// the library again (FUNCTION LOAD) and decides as before.
func TestFunctions(t *testing.T) {
	srv := redistest.Start(t)
	for _, maxBatch := range []int{1, 0} {
		t.Run(fmt.Sprintf("MaxBatch=%d", maxBatch), func(t *testing.T) {
			s := newStore(t, redisstore.Options{Addrs: []string{srv.Addr}, MaxBatch: maxBatch, Prefix: fmt.Sprintf("f%d:", maxBatch)})
			if !redisstore.UsesFunctions(s) {
				t.Fatal("the store does not call functions on Redis 7")
			}
			if got := mustDo(t, srv, "FUNCTION", "LIST", "LIBRARYNAME", redisstore.LibraryName); !strings.Contains(got, redisstore.LibraryName) {
				t.Fatalf("the library %s is not loaded: %q", redisstore.LibraryName, got)
			}
			scripts := cmdstat(t, srv, "evalsha", "calls") + cmdstat(t, srv, "eval", "calls")
			fcalls := cmdstat(t, srv, "fcall", "calls")
			decideEverything(t, s, "before", 8)
			if got := cmdstat(t, srv, "evalsha", "calls") + cmdstat(t, srv, "eval", "calls"); got != scripts {
				t.Errorf("%d script calls (EVALSHA, EVAL); want none: the store calls functions", got-scripts)
			}
			if got := cmdstat(t, srv, "fcall", "calls"); got-fcalls < 10 {
				t.Errorf("%d FCALLs for 50 decisions and a DecideAll", got-fcalls)
			}

			mustDo(t, srv, "FUNCTION", "FLUSH")
			loads := cmdstat(t, srv, "function|load", "calls")
			decideEverything(t, s, "after", 8)
			if got := cmdstat(t, srv, "function|load", "calls"); got == loads {
				t.Error("the library was not loaded again after FUNCTION FLUSH")
			}
			if got := cmdstat(t, srv, "fcall", "failed_calls"); got == 0 {
				t.Error("no FCALL met a missing function: the test did not test the reload")
			}
		})
	}
}

// TestFunctionsCluster: on a Redis Cluster every master gets the library — the node of slot 0
// at connection, the others when a call first finds it missing — and again after FUNCTION FLUSH
// on all of them.
func TestFunctionsCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	s := newStore(t, redisstore.Options{Addrs: cluster.Addrs()})
	if !redisstore.UsesFunctions(s) {
		t.Fatal("the store does not call functions on a Redis 7 cluster")
	}
	decide := func(round int) {
		for i := range 30 { // clients over every master's slots
			decideEverything(t, s, fmt.Sprintf("c%d-%d", round, i), 2)
		}
		for _, srv := range cluster.Servers {
			if got := mustDo(t, srv, "FUNCTION", "LIST", "LIBRARYNAME", redisstore.LibraryName); !strings.Contains(got, redisstore.LibraryName) {
				t.Fatalf("round %d: master %s has no library", round, srv.Addr)
			}
			if n := mustDo(t, srv, "DBSIZE"); n == "0" {
				t.Fatalf("round %d: master %s holds no keys: the clients did not spread", round, srv.Addr)
			}
		}
	}
	decide(0)
	for _, srv := range cluster.Servers {
		mustDo(t, srv, "FUNCTION", "FLUSH")
	}
	decide(1)
}

// TestFunctionsReplicasAck: with replicas_ack the call runs on a dedicated connection, then WAIT
// there: after FUNCTION FLUSH the library is loaded on that connection, and the replica has it
// (FUNCTION LOAD replicates) for a failover.
func TestFunctionsReplicasAck(t *testing.T) {
	g := redistest.StartReplicated(t, 1)
	for _, maxBatch := range []int{1, 0} {
		t.Run(fmt.Sprintf("MaxBatch=%d", maxBatch), func(t *testing.T) {
			s := newStore(t, redisstore.Options{Addrs: []string{g.Primary.Addr}, ReplicasAck: 1, ReplicasAckTimeout: time.Second,
				MaxBatch: maxBatch, Prefix: fmt.Sprintf("a%d:", maxBatch)})
			if !redisstore.UsesFunctions(s) {
				t.Fatal("the store does not call functions")
			}
			mustDo(t, g.Primary, "FUNCTION", "FLUSH")
			waits := cmdstat(t, g.Primary, "wait", "calls")
			decideEverything(t, s, "acked", 3)
			if got := cmdstat(t, g.Primary, "wait", "calls"); got == waits {
				t.Fatal("no WAIT: the decisions were not confirmed")
			}
			if got := mustDo(t, g.Replicas[0], "FUNCTION", "LIST", "LIBRARYNAME", redisstore.LibraryName); !strings.Contains(got, redisstore.LibraryName) {
				t.Fatalf("the replica has no library: %q", got)
			}
		})
	}
}

// TestConformanceScripts: the conformance suite on the scripts (EVALSHA), which the store runs on
// a server without Functions (Redis before 7.0, or an ACL user without +fcall).
func TestConformanceScripts(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	storetest.Run(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		n++
		s := newStore(t, redisstore.ScriptsOnly(redisstore.Options{Addrs: []string{srv.Addr}, Clock: c, Prefix: fmt.Sprintf("t%d:", n), NegativeCacheSize: -1}))
		if redisstore.UsesFunctions(s) {
			t.Fatal("ScriptsOnly: the store calls functions")
		}
		return s
	})
}

// TestFunctionsAtMaxmemory: a Redis at maxmemory under noeviction refuses at once every FCALL of
// a function that may write, but runs a script until it writes. The store answers there as the
// scripts do: a refusal and a peek (which write nothing) are answered, an approval (a write)
// fails with ErrStoreUnavailable — with the functions as with the scripts.
func TestFunctionsAtMaxmemory(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	p := sluice.Policy{Name: "oom", Algorithm: sluice.TokenBucket, Limit: 1, Period: time.Hour}
	for _, scripts := range []bool{false, true} {
		for _, maxBatch := range []int{1, 0} {
			t.Run(fmt.Sprintf("scripts=%v/MaxBatch=%d", scripts, maxBatch), func(t *testing.T) {
				opts := redisstore.Options{Addrs: []string{srv.Addr}, MaxBatch: maxBatch, NegativeCacheSize: -1, Prefix: fmt.Sprintf("o%v%d:", scripts, maxBatch)}
				if scripts {
					opts = redisstore.ScriptsOnly(opts)
				}
				s := newStore(t, opts)
				if redisstore.UsesFunctions(s) == scripts {
					t.Fatalf("UsesFunctions %v with scripts %v", redisstore.UsesFunctions(s), scripts)
				}
				if d, err := s.Decide(ctx, "spent", p, 1); err != nil || !d.Allowed {
					t.Fatalf("the first decision: %+v %v", d, err)
				}
				mustDo(t, srv, "CONFIG", "SET", "maxmemory", "1")
				defer mustDo(t, srv, "CONFIG", "SET", "maxmemory", "0")
				if d, err := s.Decide(ctx, "spent", p, 1); err != nil || d.Allowed || d.RetryAfter <= 0 {
					t.Errorf("a refusal at maxmemory: %+v %v; want refused, answered", d, err)
				}
				if d, err := s.Decide(ctx, "spent", p, 0); err != nil || !d.Allowed || d.Remaining != 0 {
					t.Errorf("a peek at maxmemory: %+v %v; want answered, 0 left", d, err)
				}
				if d, err := s.Decide(ctx, "fresh", p, 1); !errors.Is(err, sluice.ErrStoreUnavailable) || d.Allowed {
					t.Errorf("an approval at maxmemory (a write): %+v %v; want ErrStoreUnavailable", d, err)
				}
			})
		}
	}
}
