package algorithm

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// TestConcurrencySteps walks one key of a concurrency policy (3 slots, a 10s lease) through
// acquisitions, a refusal, a release, a renewal and expiries, at explicit instants.
func TestConcurrencySteps(t *testing.T) {
	p := Policy{Name: "conc", Algorithm: Concurrency, Limit: 3, Period: 10 * time.Second}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	const s = int64(time.Second / time.Microsecond)
	var st State
	type step struct {
		at        int64
		op        string // acquire, release, renew
		id        uint64
		cost      int64
		allowed   bool
		remaining int64
		retry     int64 // µs
		reset     int64 // µs
	}
	steps := []step{
		{at: 0, op: "acquire", id: 1, cost: 1, allowed: true, remaining: 2, reset: 10 * s},
		{at: 1 * s, op: "acquire", id: 2, cost: 1, allowed: true, remaining: 1, reset: 10 * s},
		{at: 2 * s, op: "acquire", id: 3, cost: 1, allowed: true, remaining: 0, reset: 10 * s},
		// Full: refused; the first lease expires in 8s, more than the hint's most.
		{at: 2 * s, op: "acquire", id: 4, cost: 1, allowed: false, remaining: 0, retry: s, reset: 10 * s},
		{at: 2 * s, op: "acquire", id: 4, cost: 0, allowed: true, remaining: 0, reset: 10 * s}, // a peek
		{at: 3 * s, op: "release", id: 2},
		{at: 3 * s, op: "acquire", id: 4, cost: 1, allowed: true, remaining: 0, reset: 10 * s},
		{at: 9 * s, op: "renew", id: 1}, // lease 1 now expires at 19s
		// Lease 3 expires at 12s, lease 4 at 13s, lease 1 at 19s.
		{at: 11*s + 500000, op: "acquire", id: 5, cost: 1, allowed: false, remaining: 0, retry: 500000, reset: 19*s - (11*s + 500000)},
		{at: 12 * s, op: "acquire", id: 5, cost: 1, allowed: true, remaining: 0, reset: 10 * s},
		// Two slots wanted: 4 expires at 13s, 1 at 19s; both needed: the hint is capped.
		{at: 12 * s, op: "acquire", id: 6, cost: 2, allowed: false, remaining: 0, retry: s, reset: 10 * s},
		{at: 25 * s, op: "acquire", id: 6, cost: 2, allowed: true, remaining: 1, reset: 10 * s}, // all but 5 expired
		{at: 50 * s, op: "acquire", id: 7, cost: 0, allowed: true, remaining: 3, reset: 0},      // idle
	}
	for i, c := range steps {
		switch c.op {
		case "release":
			if !Release(&st, c.at, c.id) {
				t.Fatalf("step %d: release of %d: not held", i, c.id)
			}
			continue
		case "renew":
			if n := Renew(&p, &st, c.at, c.id); n != 1 {
				t.Fatalf("step %d: renewed %d, want 1", i, n)
			}
			continue
		}
		before := len(st.Log)
		var d Decision
		if err := Acquire(&p, &st, c.at, c.id, c.cost, &d); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want := MakeDecision(c.allowed, 3, c.remaining, c.retry, c.reset, 0)
		if d != want {
			t.Fatalf("step %d at %dµs: got %+v, want %+v", i, c.at, d, want)
		}
		if (!c.allowed || c.cost == 0) && len(st.Log) != before {
			t.Fatalf("step %d: a refusal or a peek changed the state", i)
		}
	}
	if got, want := Leases(&st), []Lease{{ID: 6, Slots: 2, Expires: 35 * s}}; /* 5 expired at 22s, pruned at 25s */ !slices.Equal(got, want) {
		t.Fatalf("Leases: %+v, want %+v", got, want)
	}
	if !IsIdle(&p, &st, 50*s) {
		t.Fatal("not idle after every lease expired")
	}
	if IsExact(&p) {
		t.Fatal("a concurrency refusal must not count as exact")
	}
}

// TestConcurrencyCopyOnWrite: a decision on a copy of a state (a store's trial) never changes the
// original's leases, whatever it prunes or adds.
func TestConcurrencyCopyOnWrite(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Limit: 4, Period: time.Second}
	var st State
	var d Decision
	for id := uint64(1); id <= 3; id++ {
		if err := Acquire(&p, &st, int64(id), id, 1, &d); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	orig := append([]LogEntry(nil), st.Log...)
	trial := st
	if err := Acquire(&p, &trial, 1_000_002, 9, 1, &d); err != nil || !d.Allowed { // prunes leases 1 and 2
		t.Fatal(d, err)
	}
	Renew(&p, &trial, 1_000_002, 3)
	Release(&trial, 1_000_002, 9)
	for i := range orig {
		if st.Log[i] != orig[i] {
			t.Fatalf("the original's slot %d changed: %+v, was %+v", i, st.Log[i], orig[i])
		}
	}
}

// TestConcurrencyErrors: Decide (no lease) refuses to take slots; a cost above the limit never fits.
func TestConcurrencyErrors(t *testing.T) {
	p := Policy{Algorithm: Concurrency, Limit: 2, Period: time.Second}
	var st State
	if _, err := Decide(&p, &st, 0, 1); !errors.Is(err, ErrNoLease) {
		t.Fatalf("Decide with cost 1: %v, want ErrNoLease", err)
	}
	var d Decision
	if err := Acquire(&p, &st, 0, 1, 3, &d); !errors.Is(err, ErrCostExceedsLimit) || d.RetryAfter != Never {
		t.Fatalf("cost 3 of 2: %v %+v", err, d)
	}
	for _, bad := range []Policy{
		{Algorithm: Concurrency, Limit: 2, Period: time.Second, Burst: 1},
		{Algorithm: Concurrency, Limit: 2},
		{Algorithm: Concurrency, Limit: 2, Calendar: Day},
		{Algorithm: Concurrency, Limit: MaxConcurrency + 1, Period: time.Second},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	if a, err := ParseAlgorithm("concurrency"); err != nil || a != Concurrency || a.String() != "concurrency" {
		t.Fatal(a, err)
	}
	for _, a := range Algorithms {
		if a == Concurrency {
			t.Fatal("concurrency is not one of the rate algorithms of simulate --compare")
		}
	}
}
