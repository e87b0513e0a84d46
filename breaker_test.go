package sluice

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBreakerTripsProbesAndRecovers(t *testing.T) {
	var now atomic.Int64
	b := breaker{threshold: 3, cooldown: int64(250 * time.Millisecond), now: now.Load}
	for i := 0; i < 2; i++ {
		if !b.ready() {
			t.Fatalf("closed breaker not ready after %d failures", i)
		}
		b.failure()
	}
	b.success() // a success in between resets the count
	for i := 0; i < 3; i++ {
		b.ready()
		b.failure()
	}
	if b.ready() || !b.open() {
		t.Fatal("breaker still closed after 3 consecutive failures")
	}
	now.Add(int64(249 * time.Millisecond))
	if b.ready() {
		t.Fatal("breaker let a call through before its cooldown")
	}
	now.Add(int64(time.Millisecond))
	// Exactly one of many concurrent callers becomes the probe.
	var probes atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.ready() {
				probes.Add(1)
			}
		}()
	}
	wg.Wait()
	if probes.Load() != 1 {
		t.Fatalf("%d probes after the cooldown, want exactly 1", probes.Load())
	}
	b.failure() // the probe failed: open again for a full cooldown
	now.Add(int64(100 * time.Millisecond))
	if b.ready() {
		t.Fatal("breaker let a call through right after a failed probe")
	}
	now.Add(int64(150 * time.Millisecond))
	if !b.ready() {
		t.Fatal("no probe after the second cooldown")
	}
	b.success()
	if !b.ready() || b.open() {
		t.Fatal("breaker not closed after a successful probe")
	}
}

// A probe whose caller gives up is handed back: the next decision probes, instead of the
// breaker waiting forever for a probe that will never report.
func TestBreakerAbandonedProbe(t *testing.T) {
	var now atomic.Int64
	b := breaker{threshold: 1, cooldown: int64(time.Second), now: now.Load}
	b.ready()
	b.failure()
	now.Add(int64(time.Second))
	if !b.ready() {
		t.Fatal("no probe after the cooldown")
	}
	b.abandon()
	if !b.ready() {
		t.Fatal("no new probe after the first was abandoned")
	}
	b.success()
	if b.open() {
		t.Fatal("breaker not closed by the second probe's success")
	}
}

// TestHealthRule: the guard's one rule, as account applies it to every kind of call: a round trip
// that answered closes the breaker (ErrUnconfirmed too: the change was applied); ErrStoreUnavailable
// while the caller waits is a failure, counted; everything else (no round trip, a local check's
// error, a caller that gave up) is neutral — it neither resets the failures nor closes the
// breaker, and a neutral probe is handed back.
func TestHealthRule(t *testing.T) {
	var now atomic.Int64
	g := newGuard(nil, &guard{})
	g.breaker = breaker{threshold: 3, cooldown: int64(time.Second), now: now.Load}
	alive := context.Background()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	unavailable := fmt.Errorf("%w: redis: i/o timeout", ErrStoreUnavailable)
	neutral := []struct {
		name      string
		ctx       context.Context
		err       error
		roundTrip bool
	}{
		{"a cached refusal or a budget's unit (no round trip)", alive, nil, false},
		{"a cost over the limit, checked before any call", alive, fmt.Errorf("%w: cost 1000", ErrCostExceedsLimit), true},
		{"an invalid policy", alive, ErrInvalidPolicy, true},
		{"the caller gave up", gone, unavailable, true},
	}
	fail := func(step string) {
		t.Helper()
		if ok, _ := g.breaker.admit(); !ok {
			t.Fatalf("%s: the breaker does not admit", step)
		}
		if !g.account(alive, unavailable, true, false) {
			t.Fatalf("%s: ErrStoreUnavailable with the caller waiting is not a failure", step)
		}
	}
	for _, n := range neutral {
		fail("before " + n.name)
		fail("before " + n.name)
		if g.account(n.ctx, n.err, n.roundTrip, false) {
			t.Fatalf("%s: a failure", n.name)
		}
		if g.breaker.open() {
			t.Fatalf("%s: the breaker opened after 2 failures", n.name)
		}
		fail("after " + n.name)
		if !g.breaker.open() {
			t.Fatalf("%s reset the count of failures: the breaker is closed after the third", n.name)
		}
		// The probe: a neutral one is handed back, and the next call probes.
		now.Add(int64(time.Second))
		if ok, probe := g.breaker.admit(); !ok || !probe {
			t.Fatalf("%s: no probe after the cooldown", n.name)
		}
		g.account(n.ctx, n.err, n.roundTrip, true)
		if !g.breaker.open() {
			t.Fatalf("%s as the probe closed the breaker", n.name)
		}
		if ok, probe := g.breaker.admit(); !ok || !probe {
			t.Fatalf("%s as the probe was not handed back", n.name)
		}
		g.account(alive, nil, true, true) // the next probe's round trip answers
		if g.breaker.open() {
			t.Fatalf("after %s: a probe that answered did not close the breaker", n.name)
		}
	}
	for _, err := range []error{nil, fmt.Errorf("settle: %w: 1 of 2 replicas", ErrUnconfirmed)} {
		fail("before a round trip")
		fail("before a round trip")
		if g.account(alive, err, true, false) {
			t.Fatalf("%v: a failure", err)
		}
		fail("after a round trip")
		if g.breaker.open() {
			t.Fatalf("a round trip answering %v did not reset the failures", err)
		}
		g.account(alive, nil, true, false)
	}
	if n := g.StoreErrors(); n != uint64(3*len(neutral)+6) {
		t.Errorf("StoreErrors %d; want every failure, %d", n, 3*len(neutral)+6)
	}
}

// TestHealthRuleSlow: a call that got no reply in time from a store not known to be down
// (ErrStoreSlow beside ErrStoreUnavailable: a healthy Redis on a busy machine) is answered by the
// failure mode and counted as a store error, but is neutral to the breaker: any number of them
// neither opens it nor resets the failures before them, and a slow probe is handed back.
func TestHealthRuleSlow(t *testing.T) {
	var now atomic.Int64
	g := newGuard(nil, &guard{})
	g.breaker = breaker{threshold: 3, cooldown: int64(time.Second), now: now.Load}
	alive := context.Background()
	slow := fmt.Errorf("%w: %w: redis store: no reply in time", ErrStoreUnavailable, ErrStoreSlow)
	down := fmt.Errorf("%w: redis store: Redis has answered nothing for 500ms", ErrStoreUnavailable)
	for i := range 100 {
		if ok, _ := g.breaker.admit(); !ok {
			t.Fatalf("slow call %d: the breaker does not admit", i)
		}
		if !g.account(alive, slow, false, false) {
			t.Fatalf("slow call %d: not answered by the failure mode", i)
		}
	}
	if g.breaker.open() {
		t.Fatal("the breaker opened on calls that were only slow")
	}
	g.account(alive, down, false, false)
	g.account(alive, down, false, false)
	for range 10 {
		g.account(alive, slow, false, false)
	}
	if g.breaker.open() {
		t.Fatal("the breaker opened after 2 failures")
	}
	g.account(alive, down, false, false)
	if !g.breaker.open() {
		t.Fatal("slow calls between failures reset their count: the breaker is closed after the third")
	}
	now.Add(int64(time.Second))
	if ok, probe := g.breaker.admit(); !ok || !probe {
		t.Fatal("no probe after the cooldown")
	}
	if !g.account(alive, slow, false, true) {
		t.Fatal("a slow probe is not answered by the failure mode")
	}
	if ok, probe := g.breaker.admit(); !ok || !probe {
		t.Fatal("a slow probe was not handed back: the next call does not probe")
	}
	g.account(alive, down, false, true)
	if ok, _ := g.breaker.admit(); ok {
		t.Fatal("a probe that found the store down did not reopen the breaker")
	}
	if n := g.StoreErrors(); n != 100+3+10+2 {
		t.Errorf("StoreErrors %d; want every call answered by the failure mode, %d", n, 100+3+10+2)
	}
}
