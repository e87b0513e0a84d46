package sim

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/algorithm"
)

// Peeking between requests changes no decision: a session peeked at every 37ms decides steady
// traffic with a burst (burstPattern), and random traffic, exactly as Run does.
func TestSessionPeekChangesNothing(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		var reqs []Request
		if trial == 0 {
			reqs = burstTraffic(t)
		} else {
			at := int64(0)
			for range rng.IntN(300) + 1 {
				at += rng.Int64N(400_000)
				reqs = append(reqs, Request{TMicros: at, Key: DefaultKey, Cost: rng.Int64N(3)})
			}
		}
		for _, p := range ComparePolicies(rng.Int64N(10)+1, time.Duration(rng.Int64N(3000)+1)*time.Millisecond, rng.Int64N(12)) {
			want, err := Run(p, reqs)
			if err != nil {
				t.Fatal(err)
			}
			s, err := NewSession(p, 1)
			if err != nil {
				t.Fatal(err)
			}
			var rows []Row
			next := int64(0)
			for _, rq := range reqs {
				for ; next <= rq.TMicros; next += 37_000 {
					if _, err := s.Peek(next, DefaultKey); err != nil {
						t.Fatal(err)
					}
				}
				row, err := s.Decide(rq)
				if err != nil {
					t.Fatal(err)
				}
				rows = append(rows, row)
			}
			if !reflect.DeepEqual(rows, want.Rows) {
				t.Fatalf("%v: peeking changed the decisions of %d requests", p, len(reqs))
			}
		}
	}
}

// Peek reports each algorithm's state: what is left, and how long until the key is full again.
func TestSessionPeek(t *testing.T) {
	type peek struct {
		at        time.Duration
		remaining int64
		reset     time.Duration
	}
	for _, tc := range []struct {
		policy sluice.Policy
		reqs   []time.Duration // cost 1 each
		peeks  []peek          // after the requests before or at .at
	}{
		{sluice.Policy{Algorithm: sluice.FixedWindow, Limit: 5, Period: time.Second}, []time.Duration{0, 100 * time.Millisecond},
			[]peek{{0, 4, time.Second}, {500 * time.Millisecond, 3, 500 * time.Millisecond}, {time.Second, 5, 0}}},
		{sluice.Policy{Algorithm: sluice.TokenBucket, Limit: 5, Period: time.Second, Burst: 10}, []time.Duration{0, 0, 0, 0},
			[]peek{{0, 6, 800 * time.Millisecond}, {200 * time.Millisecond, 7, 600 * time.Millisecond}, {time.Second, 10, 0}}},
		// Leaky bucket, 5/s with room for 3: three requests at 0 take 3 of its 4 places (Capacity is
		// burst + 1); the time until the queue has drained is the delay a request would get.
		{sluice.Policy{Algorithm: sluice.LeakyBucket, Limit: 5, Period: time.Second, Burst: 3}, []time.Duration{0, 0, 0},
			[]peek{{0, 1, 600 * time.Millisecond}, {300 * time.Millisecond, 2, 300 * time.Millisecond}, {time.Second, 4, 0}}},
	} {
		s, err := NewSession(tc.policy, 1)
		if err != nil {
			t.Fatal(err)
		}
		i := 0
		for _, pk := range tc.peeks {
			for ; i < len(tc.reqs) && tc.reqs[i] <= pk.at; i++ {
				if _, err := s.Decide(Request{TMicros: tc.reqs[i].Microseconds(), Key: "k", Cost: 1}); err != nil {
					t.Fatal(err)
				}
			}
			d, err := s.Peek(pk.at.Microseconds(), "k")
			if err != nil {
				t.Fatal(err)
			}
			if d.Remaining != pk.remaining || d.ResetAfter != pk.reset {
				t.Errorf("%v: peek at %v: remaining %d, reset %v; want %d, %v", tc.policy.Algorithm, pk.at, d.Remaining, d.ResetAfter, pk.remaining, pk.reset)
			}
		}
	}
}

func TestSessionErrors(t *testing.T) {
	if _, err := NewSession(sluice.Policy{Algorithm: sluice.FixedWindow, Period: time.Second}, 1); err == nil || !strings.Contains(err.Error(), "limit 0") {
		t.Errorf("invalid policy: error %v", err)
	}
	s, err := NewSession(sluice.Policy{Algorithm: algorithm.FixedWindow, Limit: 1, Period: time.Second}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Peek(10, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Decide(Request{TMicros: 5, Key: "k", Cost: 1}); err == nil || !strings.Contains(err.Error(), "request 1: time 0.005 ms is before") {
		t.Errorf("a request before a peek: error %v", err)
	}
	if _, err := s.Peek(5, "k"); err == nil || !strings.Contains(err.Error(), "before the last one") {
		t.Errorf("a peek back in time: error %v", err)
	}
	if _, err := s.Peek(-1, "k"); err == nil {
		t.Error("a peek at a negative time: no error")
	}
	row, err := s.Decide(Request{TMicros: 10, Key: "k", Cost: 2})
	if err != nil || !row.Never() {
		t.Errorf("a cost that never fits: row %+v, error %v; want a refused row, no error", row, err)
	}
}
