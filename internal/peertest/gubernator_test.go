package peertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// spread sends perInstance requests to each instance at once (one goroutine per instance, as a
// region would), each one hit of limit per minute on name/key with behavior b, and returns how
// many were admitted. Every request must be answered.
func spread(t *testing.T, g *Gubernators, b GubernatorBehavior, key string, limit int64, perInstance int) (admitted int64) {
	t.Helper()
	return spreadEvery(t, g, b, key, limit, perInstance, 0)
}

// spreadEvery is spread with each instance's requests sent every interval (0: back to back).
func spreadEvery(t *testing.T, g *Gubernators, b GubernatorBehavior, key string, limit int64, perInstance int, interval time.Duration) (admitted int64) {
	t.Helper()
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(g.GRPCAddrs))
	for i, addr := range g.GRPCAddrs {
		c := DialGubernator(t, addr)
		wg.Go(func() {
			var tick <-chan time.Time
			if interval > 0 {
				ticker := time.NewTicker(interval)
				defer ticker.Stop()
				tick = ticker.C
			}
			for range perInstance {
				if tick != nil {
					<-tick
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				a, err := c.Send(ctx, GubernatorRequest{Name: "test", UniqueKey: key, Hits: 1, Limit: limit, Duration: time.Minute, Behavior: b})
				cancel()
				if err != nil {
					errs <- fmt.Errorf("instance %d: %w", i, err)
					return
				}
				if a.Limit != limit {
					errs <- fmt.Errorf("instance %d answered limit %d, want %d", i, a.Limit, limit)
					return
				}
				if !a.Over {
					n.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return n.Load()
}

// Three instances form one cluster (each knows the three); without GLOBAL every request is
// answered by the key's owner, so the cluster admits exactly the limit however the requests are
// spread: this checks the client (limit, hits, behavior and the answer decoded) and the cluster.
func TestGubernatorClusterAdmitsTheLimit(t *testing.T) {
	g := StartGubernators(t, 3)
	const limit = 20
	if got := spread(t, g, GubernatorBatching, "batching", limit, 2*limit); got != limit {
		t.Errorf("admitted %d of %d requests with a limit of %d: the owner counts them all", got, 3*2*limit, limit)
	}
	// Each instance's answers name the same owner, and the counter it keeps is spent.
	var owner string
	for i, addr := range g.GRPCAddrs {
		a, err := DialGubernator(t, addr).Send(context.Background(),
			GubernatorRequest{Name: "test", UniqueKey: "batching", Hits: 0, Limit: limit, Duration: time.Minute})
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		if a.Remaining != 0 || a.ResetTime.Before(time.Now()) {
			t.Errorf("instance %d: %+v: want nothing remaining until a reset to come", i, a)
		}
		if a.Owner != "" && owner != "" && a.Owner != owner {
			t.Errorf("instance %d names owner %s, another %s", i, a.Owner, owner)
		}
		if a.Owner != "" {
			owner = a.Owner
		}
	}
}

// GLOBAL, the behaviour the regions benchmark compares sluice with: each instance answers from
// its own copy and syncs with the owner asynchronously, so the cluster admits at least the limit
// and may admit more; the figure is recorded, not judged.
func TestGubernatorGlobal(t *testing.T) {
	g := StartGubernators(t, 3)
	const limit, perInstance = 60, 60
	start := time.Now()
	got := spread(t, g, GubernatorGlobal, "global", limit, perInstance)
	t.Logf("Gubernator %s GLOBAL, 3 instances: admitted %d of %d requests (%d per instance at once) with a limit of %d per minute (%.2f× the limit) in %v",
		GubernatorVersion, got, 3*perInstance, perInstance, limit, float64(got)/limit, time.Since(start).Round(time.Millisecond))
	if got < limit {
		t.Errorf("admitted %d with a limit of %d and %d requests", got, limit, 3*perInstance)
	}
	// The owner sends the count back to every instance: wait until each one's copy is spent,
	// then every instance refuses.
	converge := time.Now()
	for i, addr := range g.GRPCAddrs {
		c := DialGubernator(t, addr)
		waitUntil(t, fmt.Sprintf("instance %d's copy of the count spent", i), 30*time.Second, func() bool {
			a, err := c.Send(context.Background(), GubernatorRequest{Name: "test", UniqueKey: "global", Limit: limit, Duration: time.Minute, Behavior: GubernatorGlobal})
			return err == nil && a.Remaining == 0
		})
	}
	t.Logf("every instance's copy spent %v after the last request", time.Since(converge).Round(time.Millisecond))
	if again := spread(t, g, GubernatorGlobal, "global", limit, 5); again != 0 {
		t.Errorf("admitted %d more once every instance had the spent count", again)
	}
	// The same over a second: 100 requests a second to each instance, a limit of 60 a minute.
	start = time.Now()
	paced := spreadEvery(t, g, GubernatorGlobal, "global-paced", limit, 100, 10*time.Millisecond)
	t.Logf("the same paced, 100 requests a second to each instance: admitted %d of 300 (%.2f× the limit) in %v",
		paced, float64(paced)/limit, time.Since(start).Round(time.Millisecond))
	if paced < limit {
		t.Errorf("paced: admitted %d with a limit of %d and 300 requests", paced, limit)
	}
	// The helper's GLOBAL call is the same request.
	a, err := DialGubernator(t, g.GRPCAddrs[1]).Global(context.Background(), "test", "global-helper", 5, time.Minute)
	if err != nil || a.Over || a.Limit != 5 || a.Remaining != 4 {
		t.Errorf("Global on a fresh key: %+v, %v; want admitted, limit 5, 4 remaining", a, err)
	}
}

// waitUntil polls cond until it holds, failing t after timeout.
func waitUntil(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
