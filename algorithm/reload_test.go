package algorithm

import (
	"testing"
	"time"
)

// A reload that changes a policy's limit or period must not misread the state written under the
// old numbers (a window index under another period once locked a key out for centuries); the key
// starts afresh. A changed burst carries over.
func TestChangedPolicyNumbersStartAfresh(t *testing.T) {
	for _, a := range Algorithms {
		old := Policy{Name: "p", Algorithm: a, Limit: 3, Period: time.Second}
		changes := []Policy{
			{Name: "p", Algorithm: a, Limit: 3, Period: time.Minute},
			{Name: "p", Algorithm: a, Limit: 7, Period: time.Second},
		}
		if a == LeakyBucket { // room for the three requests in the queue
			old.Burst, changes[0].Burst, changes[1].Burst = 2, 2, 2
		}
		for _, changed := range changes {
			var s State
			now := int64(10_000_000)
			for i := 0; i < 3; i++ {
				if d, _ := Decide(&old, &s, now, 1); !d.Allowed {
					t.Fatalf("%v: request %d under the old policy refused", a, i)
				}
			}
			d, err := Decide(&changed, &s, now, 1)
			if err != nil || !d.Allowed || d.Remaining != changed.Capacity()-1 || d.Delay != 0 {
				t.Errorf("%v: first request after %v/%v became %v/%v: %+v %v, want a fresh key",
					a, old.Limit, old.Period, changed.Limit, changed.Period, d, err)
			}
		}
	}
	// The burst alone changing keeps the state: a bucket drained under burst 5 is not refilled
	// by a reload to burst 6.
	var s State
	tb := Policy{Name: "p", Algorithm: TokenBucket, Limit: 1, Period: time.Hour, Burst: 5}
	for i := 0; i < 5; i++ {
		Decide(&tb, &s, 0, 1)
	}
	tb.Burst = 6
	if d, _ := Decide(&tb, &s, 0, 1); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after raising the burst to 6 with 5 spent: %+v, want exactly one more", d)
	}
}

// A state written under a shorter period, then read by a leaky bucket (a reload that changed the
// period, or the algorithm): the cached reciprocal of the old period must not be used. It once
// sent a correction loop round ~2^64/period times.
func TestStaleCacheIsNotUsed(t *testing.T) {
	var s State
	short := Policy{Name: "p", Algorithm: FixedWindow, Limit: 1, Period: time.Millisecond}
	if _, err := Decide(&short, &s, 1_000_000, 1); err != nil {
		t.Fatal(err)
	}
	leaky := Policy{Name: "p", Algorithm: LeakyBucket, Limit: 1, Period: 3 * time.Second, Burst: 1}
	done := make(chan Decision)
	go func() { d, _ := Decide(&leaky, &s, 2_000_000, 0); done <- d }()
	select {
	case d := <-done:
		if !d.Allowed || d.Remaining != 2 {
			t.Fatalf("peek on a fresh leaky bucket: %+v, want allowed with 2 remaining", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Decide did not return: the stale reciprocal sent divP into a near-endless loop")
	}
}

// A State rebuilt from its exported fields (no cache) decides as the original.
func TestStateWithoutCache(t *testing.T) {
	p := Policy{Name: "p", Algorithm: TokenBucket, Limit: 3, Period: time.Second, Burst: 2}
	var a State
	for now := int64(0); now < 3_000_000; now += 100_000 {
		b := State{Alg: a.Alg, Limit: a.Limit, Period: a.Period, TAT: a.TAT, Frac: a.Frac}
		da, _ := Decide(&p, &a, now, 1)
		db, _ := Decide(&p, &b, now, 1)
		if da != db || a.TAT != b.TAT || a.Frac != b.Frac {
			t.Fatalf("at %dµs: with cache %+v (tat %d+%d), rebuilt %+v (tat %d+%d)", now, da, a.TAT, a.Frac, db, b.TAT, b.Frac)
		}
	}
}
