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
