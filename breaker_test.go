package sluice

import (
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
