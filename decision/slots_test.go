package decision

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/store/memory"
)

// TestSlots: a request under a rate and a concurrency policy takes one slot (whatever its cost),
// all or nothing with the rate; its Verdict gives the slot back on ReleaseSlots, and the Renewer
// keeps a slow request's slot past its first lease; a front end that does not release holds a
// slot one lease time. On a virtual clock.
func TestSlots(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
	st := memory.New(memory.WithClock(clock))
	rate := config.AppliedPolicy{Policy: sluice.Policy{Name: "rate", Algorithm: sluice.FixedWindow, Limit: 100, Period: time.Hour}, PolicyName: "rate"}
	conc := config.AppliedPolicy{Policy: sluice.Policy{Name: "slots", Algorithm: sluice.Concurrency, Limit: 2, Period: 3 * time.Second}, PolicyName: "slots"}
	r := &Renewer{manual: true} // renewed by the test, on the virtual clock
	d := &Decider{Store: st, Renewer: r}
	ctx := context.Background()
	decide := func(releases bool, cost int64) (*Request, Verdict) {
		req := &Request{Who: identity.Identity{Key: "c"}, Client: "c", Limits: []Limit{rate, conc}, Cost: cost, Releases: releases}
		return req, d.Decide(ctx, req)
	}
	free := func() int64 {
		t.Helper()
		dec, err := st.Decide(ctx, "c", conc.Policy, 0)
		if err != nil {
			t.Fatal(err)
		}
		return dec.Remaining
	}
	_, v1 := decide(true, 5) // a route's cost of 5 is rate units: one slot all the same
	_, v2 := decide(true, 5)
	if v1.Outcome != Allowed || v2.Outcome != Allowed {
		t.Fatalf("outcomes %v %v: %v %v", v1.Outcome, v2.Outcome, v1.Err, v2.Err)
	}
	if n := r.InFlight(); n != 2 {
		t.Fatalf("%d requests renewed, want 2", n)
	}
	_, v3 := decide(true, 5)
	if v3.Outcome != Refused || v3.slots != nil {
		t.Fatalf("third request: %v (slots %v), want refused holding none", v3.Outcome, v3.slots)
	}
	if dec, _ := st.Decide(ctx, "c", rate.Policy, 0); dec.Remaining != 90 {
		t.Fatalf("rate quota left %d, want 90: the refused request consumed", dec.Remaining)
	}
	// Slow requests: past the 3s lease, renewed at 2s, they keep their slots.
	clock.Advance(2 * time.Second)
	r.RenewNow(ctx)
	clock.Advance(2 * time.Second)
	if n := free(); n != 0 {
		t.Fatalf("%d slots free after a renewal, want 0", n)
	}
	d.ReleaseSlots(ctx, &v1)
	d.ReleaseSlots(ctx, &v1) // twice: nothing more
	if n := free(); n != 1 {
		t.Fatalf("%d slots free after a release, want 1", n)
	}
	if n := r.InFlight(); n != 1 {
		t.Fatalf("%d requests renewed after a release, want 1", n)
	}
	// Not renewed any more, v2's lease expires 3s after its renewal.
	clock.Advance(time.Second)
	r.RenewNow(ctx)
	d.ReleaseSlots(ctx, &v2)
	if n := free(); n != 2 {
		t.Fatalf("%d slots free, want 2", n)
	}
	// A front end that does not release (the decision API, forward-auth): a slot for one lease.
	_, v4 := decide(false, 1)
	if v4.Outcome != Allowed || r.InFlight() != 0 {
		t.Fatalf("%v, %d renewed: want allowed and not renewed", v4.Outcome, r.InFlight())
	}
	clock.Advance(3*time.Second - time.Microsecond)
	if n := free(); n != 1 {
		t.Fatalf("%d slots free a µs before the lease ends, want 1", n)
	}
	clock.Advance(time.Microsecond)
	if n := free(); n != 2 {
		t.Fatalf("%d slots free after the lease, want 2", n)
	}
	// A peek (cost 0) takes none.
	_, v5 := decide(true, 0)
	if v5.Outcome != Allowed || v5.slots != nil || free() != 2 {
		t.Fatalf("peek: %v, slots %v", v5.Outcome, v5.slots)
	}
}

// TestRenewerShorterLease: a request whose lease is shorter than the one the Renewer's goroutine
// waits a third of wakes it: the leases are renewed at once, then every third of the shorter
// lease. Else a 300ms lease taken during the wait for a 30s one's renewal (10s) expires while
// its request is in flight, and its slot is handed to another. The store on a virtual clock, the
// goroutine's waits on channels of the test.
func TestRenewerShorterLease(t *testing.T) {
	clock := sluice.NewManualClock(time.UnixMicro(1_700_000_000_000_000))
	st := memory.New(memory.WithClock(clock))
	long := config.AppliedPolicy{Policy: sluice.Policy{Name: "long", Algorithm: sluice.Concurrency, Limit: 1, Period: 30 * time.Second}, PolicyName: "long"}
	short := config.AppliedPolicy{Policy: sluice.Policy{Name: "short", Algorithm: sluice.Concurrency, Limit: 1, Period: 300 * time.Millisecond}, PolicyName: "short"}
	waits, never := make(chan time.Duration, 8), make(chan time.Time)
	r := &Renewer{after: func(d time.Duration) <-chan time.Time {
		select {
		case waits <- d:
		default:
		}
		return never // the waits end only by a wake, or the close below
	}}
	d := &Decider{Store: st, Renewer: r}
	ctx := context.Background()
	decide := func(l Limit) Verdict {
		req := &Request{Who: identity.Identity{Key: "c"}, Client: "c", Limits: []Limit{l}, Cost: 1, Releases: true}
		v := d.Decide(ctx, req)
		if v.Outcome != Allowed || v.slots == nil {
			t.Fatalf("%s: %v, slots %v", l.PolicyName, v.Outcome, v.slots)
		}
		return v
	}
	wait := func(want time.Duration) {
		t.Helper()
		select {
		case got := <-waits:
			if got != want {
				t.Fatalf("the goroutine waits %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the goroutine did not come to wait %v", want)
		}
	}
	vL := decide(long)
	wait(10 * time.Second)
	clock.Advance(20 * time.Second)
	vS := decide(short)
	wait(100 * time.Millisecond)    // woken: renewed (both), then a third of the short lease
	clock.Advance(15 * time.Second) // 35s after the long lease was taken, 15s after its renewal
	if dec, err := st.Decide(ctx, "c", long.Policy, 0); err != nil || dec.Remaining != 0 {
		t.Fatalf("the long lease 35s on: %d free (%v), want 0: it was not renewed when woken", dec.Remaining, err)
	}
	d.ReleaseSlots(ctx, &vL)
	d.ReleaseSlots(ctx, &vS)
	close(never) // the goroutine finds nothing held, and ends
}
