package sluice

import (
	"testing"
	"time"
)

// TestFleetLocalPolicy: with WithFleetFallback the fallback's policy is the limit and burst
// divided by the size its function reports at that decision, exactly (no float rounding: 30/3 is
// 10, 31/3 is 10), at least 1; a size below 1 counts as 1.
func TestFleetLocalPolicy(t *testing.T) {
	var n int
	g := newGuard(nil, &guard{mode: FailLocal, size: func() int { return n }})
	policy := Policy{Name: "p", Algorithm: TokenBucket, Limit: 31, Period: time.Second, Burst: 30}
	for _, c := range []struct {
		size         int
		limit, burst int64
	}{{3, 10, 10}, {2, 15, 15}, {1, 31, 30}, {0, 31, 30}, {-4, 31, 30}, {7, 4, 4}, {29, 1, 1}, {1000, 1, 1}} {
		n = c.size
		p := g.localPolicy(policy)
		if p.Limit != c.limit || p.Burst != c.burst {
			t.Errorf("size %d: local limit %d, burst %d; want %d, %d", c.size, p.Limit, p.Burst, c.limit, c.burst)
		}
	}
}
